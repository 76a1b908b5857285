"""Does the simulator's straggler model hold on real hardware? One slow rank in a DP, a TP and a
PP position, measured with the torch executor on this machine's CPU (gloo, 2 ranks each) and
simulated with the calibrated CPU profile (full mode, ``slowdown={1: F}``).

The slow rank is made slow by the executor's ``--inject-fault 1:0:slow=F``: each forward and
backward action of rank 1 sleeps (F - 1) x the CPU time it computed (``executor.trainer.
compute_slowdown``), so its compute, not its communication, takes F x as long.

    .venv/bin/python studies/at_scale/straggler_cpu.py [--factor 2] [--rounds 5] [--profile P] [--quick]

Writes straggler_cpu.csv and prints the table (tee it to straggler_cpu.txt). ``--quick``: the
tiny model, one round, 3 steps: checks the script works in about a minute, measures nothing.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROFILE = str(ROOT / "calibration/profiles/cpu-calibrated.yaml")
POSITIONS = {   # position of the slow rank 1 -> a 2-rank plan
    "DP": "dp=2 gbs=8 dtype=fp32",
    "TP": "tp=2 gbs=8 dtype=fp32",
    "PP": "pp=2 gbs=8 schedule=1f1b dtype=fp32",
}


def measure(model: str, plan: str, factor: float | None, steps: int, warmup: int) -> float:
    """Median step time (seconds) of one executor run; ``factor``: rank 1 slowed from step 0."""
    from parsim.executor import run_plan
    fault = f"1:0:slow={factor}" if factor else None
    return run_plan(model, plan, steps=steps, warmup=warmup, timeout_s=300, track_memory=False,
                    inject_fault=fault).step_time_s


def simulated(model: str, plan: str, factor: float | None, profile: str = PROFILE) -> float:
    from parsim.api import simulate
    return simulate(model, "cpu:2", plan, profile=profile, mode="full",
                    slowdown={1: factor} if factor else None).step_time_s


def run(model: str, factor: float, rounds: int, steps: int, warmup: int, profile: str = PROFILE) -> list[dict]:
    measured: dict[tuple[str, bool], list[float]] = {}
    for r in range(rounds):                  # interleaved: a slow minute moves one round of each
        for name, plan in POSITIONS.items():
            for slow in (False, True):
                t = measure(model, plan, factor if slow else None, steps, warmup)
                measured.setdefault((name, slow), []).append(t)
                print(f"round {r + 1}/{rounds} {name} {'slow' if slow else 'clean'}: {t * 1e3:.1f} ms",
                      file=sys.stderr)
    rows = []
    for name, plan in POSITIONS.items():
        m_clean, m_slow = (statistics.median(measured[(name, s)]) for s in (False, True))
        s_clean, s_slow = simulated(model, plan, None, profile), simulated(model, plan, factor, profile)
        rows.append({"position": name, "plan": plan, "factor": factor,
                     "measured_clean_s": m_clean, "measured_slow_s": m_slow,
                     "simulated_clean_s": s_clean, "simulated_slow_s": s_slow,
                     "error_slow": s_slow / m_slow - 1.0,
                     "measured_increase": m_slow / m_clean - 1.0, "simulated_increase": s_slow / s_clean - 1.0})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--factor", type=float, default=2.0, help="compute-time factor of the slow rank [2]")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; median per run [5]")
    ap.add_argument("--quick", action="store_true", help="tiny model, 1 round, 3 steps: checks the script only")
    ap.add_argument("--out", default=str(HERE), help="folder of straggler_cpu.csv [this folder]")
    ap.add_argument("--profile", default=PROFILE,
                    help="profile the simulator prices with, e.g. one `parsim calibrate` wrote on this machine "
                         "[calibration/profiles/cpu-calibrated.yaml]")
    args = ap.parse_args()
    model, rounds, steps, warmup = ("tiny", 1, 3, 1) if args.quick else ("cpu-small", args.rounds, 6, 2)
    rows = run(model, args.factor, rounds, steps, warmup, args.profile)
    out = Path(args.out) / ("straggler_cpu_quick.csv" if args.quick else "straggler_cpu.csv")
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"{model}, rank 1 computing {args.factor:g}x slower; step times in ms (median of {rounds} rounds); "
          f"profile {args.profile}")
    print(f"{'position':8} {'meas clean':>10} {'meas slow':>10} {'sim clean':>10} {'sim slow':>10} {'error':>7} "
          f"{'meas +':>7} {'sim +':>7}")
    for r in rows:
        print(f"{r['position']:8} {r['measured_clean_s'] * 1e3:10.1f} {r['measured_slow_s'] * 1e3:10.1f} "
              f"{r['simulated_clean_s'] * 1e3:10.1f} {r['simulated_slow_s'] * 1e3:10.1f} {r['error_slow']:+7.1%} "
              f"{r['measured_increase']:+7.1%} {r['simulated_increase']:+7.1%}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
