"""``parsim memory``: per-stage memory breakdown of a plan (analytic model)."""
from __future__ import annotations

from parsim.costs import device_capacity, memory_by_stage

from .common import add_spec_arguments, emit_json, gib, load_specs, table

HELP = "per-stage memory breakdown of a plan (params, grads, optimizer, activations, other)"


def add_arguments(p) -> None:
    add_spec_arguments(p, model="gpt3-1.3b", cluster="a100-80g:8", plan="dp=8 gbs=64")
    p.add_argument("--plot", default=None, metavar="PNG", help="also draw the stacked per-stage breakdown")


def run(args) -> int:
    model, cluster, plan, warnings = load_specs(args)
    stages = [s.to_dict() for s in memory_by_stage(model, plan, cluster)]
    cap = device_capacity(cluster)
    peak = max(s["total"] for s in stages)
    if args.plot:
        from parsim.plots.memory import plot_memory_breakdown
        plot_memory_breakdown(stages, args.plot, capacity_bytes=cap)
    if args.json:
        emit_json({"model": model.name, "plan": plan.to_string(), "memory_by_stage": stages,
                   "peak_memory_bytes": peak, "capacity_bytes": cap, "fits": peak <= cap,
                   "warnings": warnings})
        return 0
    rows = [[s["stage"], gib(s["params"]), gib(s["grads"]), gib(s["optimizer"]), gib(s["activations"]),
             gib(s["other"]), gib(s["total"])] for s in stages]
    print(f"{model.name} on {cluster.name}:{cluster.num_devices}  plan: {plan.to_string()}")
    print(table(rows, ["stage", "params GiB", "grads GiB", "optim GiB", "activ GiB", "other GiB", "total GiB"]))
    verdict = "fits" if peak <= cap else "DOES NOT FIT"
    print(f"peak {gib(peak)} GiB of {gib(cap)} GiB per device: {verdict}")
    return 0
