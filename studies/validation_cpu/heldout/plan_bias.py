"""Which held-out plans does the simulator price off in every run, and which only in some? Each
plan of the kept runs re-priced (SimPy, no executor) with today's simulator and each run's own
profile, against the step the executor measured then: the median signed error over the runs,
its quartiles, sorted by the median's size.

    .venv/bin/python studies/validation_cpu/heldout/plan_bias.py [RUN ...] > studies/validation_cpu/heldout/plan_bias.txt

RUN defaults to ``cost_variants.kept_runs()`` (``RUNS`` and every run kept from 2026-12-03 on);
about a minute (one core).
"""
from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from parsim.sim import simulate
from parsim.specs import load_cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost_variants import HERE, kept_runs  # noqa: E402
from kept_rows import measured_rows, plan_label  # noqa: E402


def plan_errors(runs: list[str]) -> dict[str, list[float]]:
    """{model, ranks and plan: [signed step error of each run, predicted / measured - 1]}."""
    out: dict[str, list[float]] = defaultdict(list)
    for name in runs:
        run = HERE / name
        for _table, _i, model, plan, row in measured_rows(run):
            res = simulate(model, load_cluster(f"cpu:{plan.world_size}", profile=run / "profile.yaml"), plan,
                           record_events=False)
            out[plan_label(model, plan, row)].append(res.step_time_s / float(row["measured_step_s"]) - 1.0)
    return out


def main(runs: list[str]) -> None:
    errors = plan_errors(runs)
    print(f"{len(runs)} runs; per plan: median signed step error over the runs (+ = predicted slow), quartiles")
    for key, v in sorted(errors.items(), key=lambda kv: -abs(statistics.median(kv[1]))):
        q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
        print(f"  {key:88s} {statistics.median(v):+6.1%}  ({q[0]:+6.1%} .. {q[2]:+6.1%}, {len(v)} runs)")
    medians = [abs(statistics.median(v)) for v in errors.values()]
    print(f"plans whose median is beyond 5 %: {sum(m > 0.05 for m in medians)} of {len(medians)}")


if __name__ == "__main__":
    main(sys.argv[1:] or kept_runs())
