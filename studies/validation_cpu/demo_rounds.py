"""Could `make demo` measure its plans in interleaved rounds at the same cost? Its three 2-rank
plans of cpu-small, executed its way (each plan once, a warm-up and 3 timed steps back to back,
the median step) and in 3 rounds (each plan once a round, a warm-up and 1 timed step each, the
median round: 6 steps a plan instead of 4, so a slow spell of a shared machine falls on one
round of a plan instead of all its steps), the two ways taking turns ``--repeats`` times in one
process.

    .venv/bin/python studies/validation_cpu/demo_rounds.py [--repeats 5] [--profile P]   # ~1 min a repeat

Per plan and way: the median measured step over the repeats, and its spread from one repeat
to the next (sd of log step time; p10-p90 over the median): the demo compares one such
measurement with a prediction, so this spread is the part of its printed error that is the
machine's. The executor runs without the layer probe (it times around the steps, not in them).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time


def measure(model, plans, rounds: int, timed: int) -> list[float]:
    """Each plan's measured step (its median round) under ``rounds`` rounds of ``timed`` steps."""
    from parsim.executor import run_plans
    from parsim.executor.config import ExecutorConfig
    from parsim.executor.worker import RunSpec

    config = ExecutorConfig(steps=timed + 1, warmup=1)
    runs = run_plans([RunSpec(model, p, config) for _ in range(rounds) for p in plans])
    return [statistics.median(r.step_time_s for r in runs[i::len(plans)]) for i in range(len(plans))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", default=None, help="profile whose host memory policy the ranks run under")
    args = ap.parse_args()

    from parsim.calibration.host_alloc import use_profile_policy
    from parsim.cli.demo import CPU_MODEL
    from parsim.executor.forked import start_early
    from parsim.specs import load_model, load_profile_dict, parse_plan

    if args.profile:
        use_profile_policy(load_profile_dict(args.profile))
    start_early()       # the ranks' fork server imports torch before this process does (``measure``)
    model = load_model(CPU_MODEL)
    plans = [parse_plan(p) for p in ("dp=2 gbs=8 dtype=fp32", "tp=2 gbs=8 dtype=fp32 sp=true",
                                     "pp=2 gbs=8 dtype=fp32 schedule=1f1b")]
    ways = {"one round of 3 steps": (1, 3), "3 rounds of 1 step": (3, 1)}
    got: dict[str, list[list[float]]] = {w: [] for w in ways}
    print(time.strftime("%Y-%m-%d %H:%M:%S"), f"{args.repeats} repeats of each way, taking turns", flush=True)
    for k in range(args.repeats):
        for way, (rounds, timed) in ways.items():
            t0 = time.perf_counter()
            got[way].append(measure(model, plans, rounds, timed))
            print(f"repeat {k + 1} {way:22s} {time.perf_counter() - t0:5.1f} s: "
                  + "  ".join(f"{s * 1e3:7.1f}" for s in got[way][-1]) + " ms", flush=True)
    print(f"\n{'plan':38s} {'way':22s} {'median ms':>9s} {'sd(log)':>8s} {'p10-p90 / median':>17s}")
    for i, plan in enumerate(plans):
        for way in ways:
            xs = sorted(r[i] for r in got[way])
            med = statistics.median(xs)
            sd = statistics.stdev(math.log(x) for x in xs) if len(xs) > 1 else 0.0
            lo, hi = xs[max(0, round(0.1 * (len(xs) - 1)))], xs[round(0.9 * (len(xs) - 1))]
            print(f"{plan.to_string()[:38]:38s} {way:22s} {med * 1e3:9.1f} {sd:8.3f} {(hi - lo) / med:17.1%}")
    print(time.strftime("%Y-%m-%d %H:%M:%S"))


if __name__ == "__main__":
    main()
