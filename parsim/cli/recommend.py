"""``parsim recommend``: the best plans for a model on a cluster, and why."""
from __future__ import annotations

import argparse

from parsim.api import recommend

from .common import emit_json
from .sweep import add_sweep_arguments, sweep_options

HELP = "the best plans and why (memory fit, bubble, exposed communication, rules of thumb)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_sweep_arguments(p)
    p.add_argument("--top", type=int, default=3, help="plans to recommend [3]")
    p.add_argument("--resimulate", type=int, default=None,
                   help="re-run this many of the best plans through the SimPy engine [--top]")


def run(args: argparse.Namespace) -> int:
    rec = recommend(args.model, args.cluster, top=args.top, resimulate=args.resimulate, **sweep_options(args))
    if args.json:
        emit_json(rec.to_dict())
        return 0
    print(f"{rec.model} on {rec.cluster}: {rec.num_plans} valid plans, {rec.num_fit} fit")
    print(rec.rule_check)
    for a in rec.plans:
        print(f"\n#{a.rank}  {a.plan}")
        for reason in a.reasons:
            print(f"    - {reason}")
    for line in rec.memory_advice:
        print(f"  {line}")
    if rec.schedule_advice:
        print("\npipeline schedules against 1f1b (best variant of each at every layout of the sweep):")
        for line in rec.schedule_advice:
            print(f"    - {line}")
    return 0
