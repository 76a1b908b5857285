"""``parsim plot``: charts of a plan, one subcommand per chart.

Each subcommand is one function taking the parsed arguments, marked with ``@chart(help,
arguments)`` and listed in ``CHARTS``: adding a chart (e.g. ``sweep``) is adding a function.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from .common import add_spec_arguments, emit_json
from .simulate import add_engine_arguments, run_engine

HELP = "draw a chart: timeline (Gantt of a simulated step), memory (per stage and over the step)"


def chart(help: str, arguments: Callable[[argparse.ArgumentParser], None]):
    """Mark a function ``fn(args) -> {"outputs": [paths], ...}`` as a ``parsim plot`` subcommand."""
    def mark(fn):
        fn.help, fn.arguments = help, arguments
        return fn
    return mark


def _simulated_plan_arguments(p: argparse.ArgumentParser) -> None:
    add_spec_arguments(p, model="gpt3-1.3b", cluster="a100-80g:8", plan="dp=2 pp=4 gbs=16")
    add_engine_arguments(p)
    p.add_argument("--out", required=True, metavar="PNG", help="where to write the chart")


def _timeline_arguments(p: argparse.ArgumentParser) -> None:
    _simulated_plan_arguments(p)
    p.add_argument("--max-ranks", type=int, default=16, help="draw at most this many ranks, evenly spaced [16]")


@chart("Gantt timeline of one simulated step: actions per rank, comm rows, the bubble", _timeline_arguments)
def timeline(args: argparse.Namespace) -> dict:
    from parsim.plots.timeline import plot_timeline
    result, _ = run_engine(args)
    title = f"{result.model} · {result.plan}"
    plot_timeline(result.events, args.out, title=title, max_ranks=args.max_ranks)
    return {"outputs": [str(args.out)], "step_time_s": result.step_time_s, "bubble_fraction": result.bubble_fraction}


@chart("memory per pipeline stage (stacked by category) and memory over the step (second PNG)",
       _simulated_plan_arguments)
def memory(args: argparse.Namespace) -> dict:
    from parsim.plots.memory import plot_memory_breakdown, plot_memory_over_time
    result, _ = run_engine(args)
    out = Path(args.out)
    over_time = out.with_name(f"{out.stem}-over-time{out.suffix or '.png'}")
    # the per-stage chart is narrow for short pipelines: the model alone fits its title line
    plot_memory_breakdown(result.memory_by_stage, out, capacity_bytes=result.capacity_bytes, title=result.model)
    plot_memory_over_time(result.memory_timeline, over_time, capacity_bytes=result.capacity_bytes,
                          title=f"{result.model} · {result.plan}")
    return {"outputs": [str(out), str(over_time)], "peak_memory_bytes": result.peak_memory_bytes,
            "fits": result.fits}


def _sweep_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--csv", required=True, help="a sweep's plans (parsim sweep --out plans.csv|plans.parquet)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the four PNGs")
    p.add_argument("--title", default="", help="prefix for the chart titles (e.g. the model and cluster)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")


@chart("sweep charts: throughput vs memory Pareto front, (tp, pp) heatmap, bubble vs microbatches, "
       "memory per ZeRO stage", _sweep_arguments)
def sweep(args: argparse.Namespace) -> dict:
    from parsim.plots.sweep import plot_sweep, read_sweep
    from parsim.specs import SpecError
    from parsim.specs.files import path_exists
    path = Path(args.csv)
    if not path_exists(path) or not path.is_file() or path.suffix not in (".csv", ".parquet"):
        raise SpecError("csv", args.csv, "an existing .csv or .parquet file written by parsim sweep --out")
    frame = read_sweep(path)
    missing = {"tp", "pp", "tokens_per_s", "peak_memory_bytes", "fits", "bubble_fraction"} - set(frame.columns)
    if missing or frame.empty:
        raise SpecError("csv", args.csv, f"a non-empty parsim sweep table (missing columns: {', '.join(sorted(missing))})")
    outputs = plot_sweep(frame, args.out, title=args.title)
    return {"outputs": [str(o) for o in outputs], "num_plans": len(frame)}


CHARTS = (timeline, memory, sweep)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="chart", metavar="CHART", parser_class=type(p))
    sub.required = True
    for fn in CHARTS:
        c = sub.add_parser(fn.__name__, help=fn.help, description=fn.help)
        fn.arguments(c)
        c.set_defaults(_chart=fn)


def run(args: argparse.Namespace) -> int:
    from parsim.specs.files import check_output_dir, check_output_path
    if args._chart is sweep:
        check_output_dir(args.out, "out")       # before the work that fills it
    else:
        check_output_path(args.out, "out")
    out = args._chart(args)
    if getattr(args, "json", False):
        emit_json(out)
    else:
        print("wrote " + ", ".join(out["outputs"]))
    return 0
