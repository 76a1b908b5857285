"""Which actions of a held-out plan does the simulator price off in every run? ``plan_bias.py``
one level down: each plan of the kept runs re-priced (SimPy, every rank, today's simulator and
the run's own profile) and set against the trace the executor measured then (its median round,
``traces/planNN.measured.json``), action kind by action kind (``actions.by_kind``): the forward
(F), the backward (B) and the optimizer step net of the DP calls inside it. Per plan and kind:
the median over the runs of predicted / measured (each run's median action, median over ranks).
Collectives are left out: a measured call's span holds its wait for the slowest peer.

    .venv/bin/python studies/validation_cpu/heldout/action_bias.py [RUN ...] > studies/validation_cpu/heldout/action_bias.txt

RUN defaults to ``cost_variants.kept_runs()``; about 40 s (one core).
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from parsim.sim import simulate
from parsim.specs import load_cluster
from parsim.trace.io import trace_to_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from actions import by_kind  # noqa: E402
from cost_variants import HERE, kept_runs  # noqa: E402
from kept_rows import measured_rows, plan_label  # noqa: E402

KINDS = ("F", "B", "optimizer")


def ratios(measured: list[list], predicted: list[list]) -> dict[str, float]:
    """{kind: median over ranks of predicted / measured}, a rank's median action of each kind
    (a kind one side lacks is left out)."""
    (am, _), (ap, _) = by_kind(measured), by_kind(predicted)
    per_kind: dict[str, list[float]] = defaultdict(list)
    for (rank, kind), seconds in am.items():
        if kind in KINDS and ap.get((rank, kind)):
            per_kind[kind].append(statistics.median(ap[(rank, kind)]) / statistics.median(seconds))
    return {kind: statistics.median(v) for kind, v in per_kind.items()}


def action_ratios(runs: list[str]) -> dict[str, dict[str, list[float]]]:
    """{model, ranks and plan: {kind: [predicted / measured of each run]}}."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name in runs:
        run = HERE / name
        for table, i, model, plan, row in measured_rows(run):
            trace = table.parent / "traces" / f"plan{i:02d}.measured.json"
            if not trace.exists():
                continue
            res = simulate(model, load_cluster(f"cpu:{plan.world_size}", profile=run / "profile.yaml"), plan,
                           mode="full")
            measured = json.loads(trace.read_text())["events"]
            for kind, r in ratios(measured, trace_to_json(res.trace)["events"]).items():
                out[plan_label(model, plan, row)][kind].append(r)
    return out


def main(runs: list[str]) -> None:
    table = action_ratios(runs)
    print(f"{len(runs)} runs; per plan and action kind: median over the runs of predicted / measured "
          "(> 1: priced slow), runs counted")
    print(f"  {'plan':88s} " + " ".join(f"{k:>14s}" for k in KINDS))
    for key in sorted(table):
        cells = []
        for kind in KINDS:
            v = table[key].get(kind)
            cells.append(f"{statistics.median(v):8.2f} ({len(v):2d})" if v else f"{'-':>14s}")
        print(f"  {key:88s} " + " ".join(f"{c:>14s}" for c in cells))
    for kind in KINDS:
        meds = [statistics.median(v[kind]) for v in table.values() if v.get(kind)]
        off = sum(abs(m - 1.0) > 0.10 for m in meds)
        print(f"{kind}: median over plans {statistics.median(meds):.2f}, {off} of {len(meds)} plans beyond 10 %")


if __name__ == "__main__":
    main(sys.argv[1:] or kept_runs())
