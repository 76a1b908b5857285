"""``parsim recommend``: the best plans for a model on a cluster, and why."""
from __future__ import annotations

import argparse

from parsim.api import recommend
from parsim.specs import SpecError

from .common import emit_json
from .sweep import add_sweep_arguments, sweep_options

HELP = "the best plans and why (memory fit, bubble, exposed communication, rules of thumb)"
RANK_BY = ("step-time", "time-to-train")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .plan_run import add_run_arguments
    add_sweep_arguments(p)
    p.add_argument("--top", type=int, default=3, help="plans to recommend [3]")
    p.add_argument("--resimulate", type=int, default=None,
                   help="re-run this many of the best plans through the SimPy engine [--top]")
    p.add_argument("--rank-by", choices=RANK_BY, default="step-time",
                   help="step-time [default], or expected time-to-train --tokens under failures and, with "
                        "--variability, per-step variability (ranks the 3 x --top best by step time)")
    run_args = p.add_argument_group("time-to-train (--rank-by time-to-train)")
    add_run_arguments(run_args, tokens_required=False)
    run_args.add_argument("--variability", default="none", metavar="DIST:SIGMA",
                          help="per-step compute-time factor of every device (lognormal:SIGMA, normal:SIGMA) [none]")
    run_args.add_argument("--steps", type=int, default=30, help="Monte-Carlo steps per plan with --variability [30]")


def run(args: argparse.Namespace) -> int:
    by_time = args.rank_by == "time-to-train"
    if by_time and args.tokens is None:
        raise SpecError("tokens", None, "a token budget (e.g. --tokens 15e12) with --rank-by time-to-train")
    top = 3 * args.top if by_time else args.top
    rec = recommend(args.model, args.cluster, top=top, resimulate=args.resimulate, **sweep_options(args))
    if by_time:
        from parsim.api.run import rank_by_time_to_train
        from .plan_run import reliability
        rec = rank_by_time_to_train(rec, args.model, args.cluster, tokens=args.tokens, top=args.top,
                                    profile=args.profile, reliability=reliability(args), variability=args.variability,
                                    steps=args.steps, workers=args.workers, address=args.cluster_address)
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
