"""The fast path against the SimPy engine on a calibrated CPU host (``parsim.fast.honesty``,
reason ``shared host``): every plan of the CPU validation matrix and of the sweep space of its
model on 2 and 4 ranks (gbs 8), priced both ways on the frozen fixture profile.

    .venv/bin/python studies/validation_cpu/fast_vs_sim.py     # ~1 min; writes fast_vs_sim.txt
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import yaml

from parsim.fast import evaluate
from parsim.fast.honesty import approximate_reasons
from parsim.fast.plans import PlanTable
from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan
from parsim.study.enumerate import enumerate_plans
from parsim.study.space import SweepSpace

HERE = Path(__file__).resolve().parent
PROFILE = HERE.parents[1] / "tests" / "fixtures" / "cpu-calibrated.yaml"


def compare(model, cluster, table: PlanTable) -> list[tuple]:
    fast = evaluate(model, cluster, table)
    why = approximate_reasons(table.cols, cluster)
    out = []
    for i, text in enumerate(table.plan_strings()):
        sim = simulate(model, cluster, parse_plan(text), record_events=False)
        reasons = ",".join(k for k, v in why.items() if v[i])
        out.append((text, sim.step_time_s, float(fast.step_time_s[i]), sim.peak_memory_bytes,
                    float(fast.peak_memory_bytes[i]), reasons))
    return out


def main() -> int:
    matrix = yaml.safe_load((HERE / "matrix.yaml").read_text())
    model = load_model(matrix["model"])
    rows = []
    for world in (2, 4):
        cluster = load_cluster(f"{PROFILE}:{world}")
        plans = [parse_plan(p) for p in matrix["plans"]]
        plans = [p for p in plans if p.dp * p.tp * p.pp == world]
        rows += [("matrix", world, *r) for r in compare(model, cluster, PlanTable.from_plans(plans))]
        space = enumerate_plans(model, cluster, SweepSpace(gbs=(8,)))
        rows += [("space", world, *r) for r in compare(model, cluster, space)]
    lines = [f"{'set':6s} {'ranks':>5s} {'plan':64s} {'sim s':>7s} {'fast s':>7s} {'time':>7s} {'memory':>7s}  reasons"]
    for kind, world, text, s, f, sm, fm, why in rows:
        lines.append(f"{kind:6s} {world:5d} {text:64s} {s:7.3f} {f:7.3f} {100 * (f / s - 1):+6.1f}% "
                     f"{100 * (fm / sm - 1):+6.1f}%  {why}")
    err = np.array([r[4] / r[3] - 1 for r in rows])
    marked = np.array(["shared host" in r[-1] for r in rows])
    lines.append("")
    lines.append(f"{len(rows)} plans; fast vs SimPy step time: median {100 * np.median(err):+.1f} %, "
                 f"min {100 * err.min():+.1f} %, max {100 * err.max():+.1f} %; "
                 f"{int((np.abs(err) > 0.02).sum())} off by more than 2 %, all of them marked 'shared host': "
                 f"{bool(marked[np.abs(err) > 0.02].all())}; slower than the engine by more than the "
                 f"sweep's 5 % allowance: {int((err > 0.05).sum())}")
    text = "\n".join(lines) + "\n"
    (HERE / "fast_vs_sim.txt").write_text(text)
    print(text[-600:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
