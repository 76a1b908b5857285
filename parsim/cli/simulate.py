"""``parsim simulate``: one training step of a plan through the SimPy engine."""
from __future__ import annotations

import argparse

from .common import add_spec_arguments, emit_json, gib, load_specs, table

HELP = "simulate one training step (SimPy): step time, throughput, MFU/HFU, bubble, exposed comm, memory"

MAX_STAGE_ROWS = 16   # longer pipelines print the first, the peak and the last stages


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_spec_arguments(p, model="gpt3-1.3b", cluster="a100-80g:8", plan="dp=8 gbs=64")
    add_engine_arguments(p)
    p.add_argument("--trace", default=None, metavar="JSON",
                   help="write the Chrome/Perfetto trace (open in ui.perfetto.dev or chrome://tracing)")


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """Engine options shared with ``parsim plot``."""
    p.add_argument("--mode", choices=("representative", "full"), default=None,
                   help="representative: one device per pipeline rank [default]; full: every device "
                        "(implied by --slowdown)")
    p.add_argument("--slowdown", default=None, metavar="RANK=FACTOR,...",
                   help="straggler what-if: compute on these global ranks takes FACTOR x longer, e.g. 3=1.5,5=1.2")
    p.add_argument("--detail", action="store_true",
                   help="also record per-layer compute and per-collective TP events in the trace (slower)")


def run_engine(args: argparse.Namespace):
    """Load the specs (warnings to stderr), simulate, and return (``parsim.api.Result``, warnings)."""
    from parsim.api import simulate
    model, cluster, plan, warnings = load_specs(args)
    return simulate(model, cluster, plan, mode=args.mode, slowdown=args.slowdown, detail=args.detail), warnings


def run(args: argparse.Namespace) -> int:
    if args.trace:
        from parsim.specs.files import check_output_path
        check_output_path(args.trace, "trace")      # before the simulation, not after it
    result, _ = run_engine(args)
    if args.trace:
        result.trace(args.trace)
    if args.json:
        emit_json(result.to_dict())
        return 0
    print(report(result.sim))
    if args.trace:
        print(f"wrote {args.trace} ({len(result.events.events):,} events)")
    return 0


def report(r) -> str:
    """The human-readable summary of a SimResult."""
    n = len(r.simulated_ranks)
    world = r.trace_meta.get("world_size", n)
    mode = (f"every device ({r.devices_simulated} by classes of identical ranks)"
            if r.mode == "full" and 0 < r.devices_simulated < n else
            "every device" if r.mode == "full" else f"{n} of {world} devices: one per pipeline rank")
    ex = r.exposed_comm_s
    lines = [
        f"{r.model} on {r.cluster}  plan: {r.plan}",
        f"simulated {mode}; {r.num_events:,} SimPy events in {r.sim_wall_s:.2f} s",
        "",
        f"  step time        {r.step_time_s * 1e3:,.1f} ms",
        f"  tokens/s         {r.tokens_per_s:,.0f}",
        f"  MFU / HFU        {r.mfu:.1%} / {r.hfu:.1%}",
        f"  pipeline bubble  {r.bubble_fraction:.1%}",
        f"  exposed comm     tp {ex['tp'] * 1e3:,.1f} ms · dp {ex['dp'] * 1e3:,.1f} ms · pp {ex['pp'] * 1e3:,.1f} ms"
        "  (compute stream blocked, mean per device)",
        "",
    ]
    stages = r.memory_by_stage
    shown = stages
    if len(stages) > MAX_STAGE_ROWS:
        peak = max(range(len(stages)), key=lambda i: stages[i]["total"])
        keep = sorted({0, 1, 2, peak, len(stages) - 3, len(stages) - 2, len(stages) - 1})
        shown = [stages[i] for i in keep]
    rows = [[s["stage"], gib(s["params"]), gib(s["grads"]), gib(s["optimizer"]), gib(s["activations"]),
             gib(s["other"]), gib(s["total"])] for s in shown]
    lines.append(table(rows, ["stage", "params GiB", "grads GiB", "optim GiB", "activ GiB", "other GiB", "total GiB"]))
    if len(shown) < len(stages):
        lines.append(f"({len(stages)} stages; showing the first, the peak and the last)")
    verdict = "fits" if r.fits else "DOES NOT FIT"
    lines.append(f"peak {gib(r.peak_memory_bytes)} GiB of {gib(r.capacity_bytes)} GiB usable per device: {verdict}")
    return "\n".join(lines)
