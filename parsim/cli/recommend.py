"""``parsim recommend``: the best plans for a model on a cluster, and why."""
from __future__ import annotations

import argparse

from parsim.specs import SpecError
from parsim.study.recommend import recommend

from .common import emit_json
from .sweep import add_sweep_arguments, sweep_from_args

HELP = "the best plans and why (memory fit, bubble, exposed communication, rules of thumb)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_sweep_arguments(p)
    p.add_argument("--top", type=int, default=3, help="plans to recommend [3]")
    p.add_argument("--resimulate", type=int, default=None,
                   help="re-run this many of the best plans through the SimPy engine [--top]")


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise SpecError("top", args.top, "a positive integer")
    resim = args.top if args.resimulate is None else args.resimulate
    if resim < 0:
        raise SpecError("resimulate", resim, "a non-negative integer")
    model, cluster, result = sweep_from_args(args, resim)
    rec = recommend(model, cluster, result, top=args.top)
    if args.json:
        emit_json(rec.to_dict())
        return 0
    print(f"{model.name} on {rec.cluster}: {rec.num_plans} valid plans, {rec.num_fit} fit")
    print(rec.rule_check)
    for a in rec.plans:
        print(f"\n#{a.rank}  {a.plan}")
        for reason in a.reasons:
            print(f"    - {reason}")
    for line in rec.memory_advice:
        print(f"  {line}")
    return 0
