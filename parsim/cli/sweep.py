"""``parsim sweep``: every valid plan for a model on a cluster, ranked by throughput among
those that fit; the best re-run through the SimPy engine."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from parsim.specs import ClusterSpec, ModelSpec, SpecError, load_cluster, load_model
from parsim.study.enumerate import default_gbs
from parsim.study.space import build_space
from parsim.study.sweep import SweepResult, run_sweep

from .common import add_json_argument, emit_json, gib, table

HELP = "enumerate valid plans for a model + cluster, rank them (fast path + SimPy re-simulation)"


def add_sweep_arguments(p: argparse.ArgumentParser, model: str = "gpt3-1.3b", cluster: str = "a100-80g:8") -> None:
    """Arguments shared by ``sweep`` and ``recommend``."""
    p.add_argument("--model", default=model, help=f"preset name, model YAML, or HF config.json [{model}]")
    p.add_argument("--cluster", default=cluster, help=f"PRESET:NDEVICES or cluster YAML [{cluster}]")
    p.add_argument("--profile", default=None, help="calibration profile YAML overriding the cluster's device/network numbers")
    p.add_argument("--gbs", type=int, default=None, help="global batch in sequences [one per device]")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length [the model's]")
    p.add_argument("--headroom", type=float, default=0.1,
                   help="fraction of device memory kept free: a plan fits if peak <= capacity*(1-headroom) [0.1]")
    p.add_argument("--fix", default=None, help="hold keys to values, e.g. \"tp=8 zero=1\" (lists: mbs=1,2)")
    p.add_argument("--space", default=None, help="YAML mapping plan keys to lists of values to sweep")
    p.add_argument("--workers", type=int, default=1, help="processes for the SimPy re-simulation [1]")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_json_argument(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_sweep_arguments(p)
    p.add_argument("--top", type=int, default=10, help="ranked plans to print / put in the JSON rows [10]")
    p.add_argument("--resimulate", type=int, default=10,
                   help="re-run this many of the best fitting plans through the SimPy engine [10; 0 = none]")
    p.add_argument("--out", default=None, help="write every evaluated plan with its metrics (.csv or .parquet)")


def load_sweep_specs(args: argparse.Namespace) -> tuple[ModelSpec, ClusterSpec]:
    model = load_model(args.model)
    if args.seq_len is not None:
        if args.seq_len < 1:
            raise SpecError("seq-len", args.seq_len, "a positive integer (tokens per sequence)")
        model = replace(model, seq_len=args.seq_len)
    cluster = load_cluster(args.cluster, profile=args.profile)
    if not 0.0 <= args.headroom < 1.0:
        raise SpecError("headroom", args.headroom, "a fraction in [0, 1)")
    if args.workers < 1:
        raise SpecError("workers", args.workers, "a positive integer")
    if args.gbs is not None and args.gbs < 1:
        raise SpecError("gbs", args.gbs, "a positive integer (global batch in sequences)")
    return model, cluster


def sweep_from_args(args: argparse.Namespace, resimulate_top: int) -> tuple[ModelSpec, ClusterSpec, SweepResult]:
    model, cluster = load_sweep_specs(args)
    space = build_space(space_file=args.space, fix=args.fix, gbs=args.gbs)
    if space.gbs is None:
        space = space.narrowed({"gbs": (default_gbs(cluster),)})
    progress = not args.no_progress and not getattr(args, "quiet", False)
    result = run_sweep(model, cluster, space, headroom=args.headroom, resimulate_top=resimulate_top,
                       workers=args.workers, progress=progress)
    if result.num_plans == 0:
        raise SpecError("space", args.fix or args.space or "defaults",
                        f"constraints that leave at least one valid plan for {model.name} on "
                        f"{cluster.num_devices} devices (dp*tp*pp must equal the device count, "
                        f"gbs divisible by dp*mbs, tp dividing heads={model.heads})")
    return model, cluster, result


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise SpecError("top", args.top, "a positive integer")
    if args.resimulate < 0:
        raise SpecError("resimulate", args.resimulate, "a non-negative integer")
    if args.out and not str(args.out).endswith((".csv", ".parquet")):
        raise SpecError("out", args.out, "a path ending in .csv or .parquet")
    model, cluster, result = sweep_from_args(args, args.resimulate)
    if args.out:
        result.write(args.out)
    if args.json:
        emit_json({"model": model.name, "cluster": cluster.name, "num_devices": cluster.num_devices,
                   "gbs": int(result.frame["gbs"].iloc[0]), "seq_len": model.seq_len, "headroom": args.headroom,
                   "capacity_bytes": result.capacity_bytes, "num_plans": result.num_plans, "num_fit": result.num_fit,
                   "num_resimulated": result.num_resimulated, "timings_s": result.timings_s,
                   "rows": result.rows(args.top)})
        return 0
    print(f"{model.name} on {cluster.name}:{cluster.num_devices}: {result.num_plans} valid plans, "
          f"{result.num_fit} fit in {gib(result.capacity_bytes * (1 - args.headroom))} GiB "
          f"({result.num_resimulated} re-simulated)")
    print(format_rows(result.rows(args.top)))
    if args.out:
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def format_rows(rows: list[dict]) -> str:
    body = [[r["rank"], r["plan"], f"{r['step_time_s'] * 1e3:.1f}", f"{r['tokens_per_s']:.4g}", f"{r['mfu']:.3f}",
             f"{r['bubble_fraction']:.3f}", f"{r['exposed_tp_s'] * 1e3:.1f}", f"{r['exposed_dp_s'] * 1e3:.1f}",
             f"{r['exposed_pp_s'] * 1e3:.1f}", gib(r["peak_memory_bytes"]), "yes" if r["fits"] else "NO", r["source"]]
            for r in rows]
    return table(body, ["#", "plan", "step ms", "tokens/s", "MFU", "bubble", "TP ms", "DP ms", "PP ms",
                        "peak GiB", "fits", "by"])
