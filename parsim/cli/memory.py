"""``parsim memory``: per-stage memory breakdown of a plan (analytic model)."""
from __future__ import annotations

from parsim.api import memory

from .common import add_spec_arguments, emit_json, gib, load_specs, table

HELP = "per-stage memory breakdown of a plan (params, grads, optimizer, activations, other)"


def add_arguments(p) -> None:
    add_spec_arguments(p, model="gpt3-1.3b", cluster="a100-80g:8", plan="dp=8 gbs=64")
    p.add_argument("--plot", default=None, metavar="PNG", help="also draw the stacked per-stage breakdown")


def run(args) -> int:
    report = memory(*load_specs(args)[:3])
    stages = report.memory_by_stage
    if args.plot:
        from parsim.plots.memory import plot_memory_breakdown
        plot_memory_breakdown(stages, args.plot, capacity_bytes=report.capacity_bytes)
    if args.json:
        emit_json(report.to_dict())
        return 0
    rows = [[s["stage"], gib(s["params"]), gib(s["grads"]), gib(s["optimizer"]), gib(s["activations"]),
             gib(s["other"]), gib(s["total"])] for s in stages]
    print(f"{report.model} on {report.cluster}  plan: {report.plan}")
    print(table(rows, ["stage", "params GiB", "grads GiB", "optim GiB", "activ GiB", "other GiB", "total GiB"]))
    verdict = "fits" if report.fits else "DOES NOT FIT"
    print(f"peak {gib(report.peak_memory_bytes)} GiB of {gib(report.capacity_bytes)} GiB per device: {verdict}")
    return 0
