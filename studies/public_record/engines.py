"""The fast path against the SimPy engine on every distinct run of the public record: each run's
chosen plan (the fast path's fastest that fits, shipped profiles) priced by both, and whether the
fast path marks it approximate (``parsim.fast.honesty``). ``calibrate --runs`` reports the
engine's price wherever the fast path's is approximate (``predict(exact=True)``); this shows
by how much the two differ on the plans of the data.

    .venv/bin/python studies/public_record/engines.py     # 10 s; writes engines.txt
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from parsim.fast import PlanTable
from parsim.fast.honesty import approximate_reasons
from parsim.sim import simulate
from parsim.specs import parse_plan
from parsim.study.runs.observations import read_runs
from parsim.study.runs.predict import base_profiles, clusters_for, predict

HERE = Path(__file__).resolve().parent
RUNS = HERE.parents[2] / "shared" / "validation" / "public_runs_train.csv"
if not RUNS.exists():
    RUNS = Path("/work/shared/validation/public_runs_train.csv")


def main() -> int:
    obs, _ = read_runs(RUNS)
    obs = [o for o in obs if o.kind not in ("memory", "oom") and not o.kind.startswith("layer_")]
    profiles = base_profiles(o.profile for o in obs)
    clusters = clusters_for(profiles, obs)
    rows, seen = [], set()
    for o, p in zip(obs, predict(obs, profiles)):          # the fast path's choice and price
        if o.run_key in seen:
            continue
        seen.add(o.run_key)
        cluster, plan = clusters[o.cluster_key], parse_plan(p.plan)
        why = approximate_reasons(PlanTable.from_plans([plan]).cols, cluster)
        sim = simulate(o.model, cluster, plan, record_events=False).step_time_s
        rows.append((o.group, p.plan, p.step_time_s, sim, ",".join(k for k, v in why.items() if v[0])))
    lines = [f"{'source':32s} {'plan':100s} {'fast s':>8s} {'sim s':>8s} {'fast/sim':>8s}  approximate"]
    lines += [f"{g[:32]:32s} {p[:100]:100s} {f:8.3f} {s:8.3f} {100 * (f / s - 1):+7.1f}%  {w}" for g, p, f, s, w in rows]
    lines.append("")
    for g in sorted({r[0] for r in rows}):
        e = 100 * np.array([f / s - 1 for gg, _, f, s, _ in rows if gg == g])
        lines.append(f"{g:32s} runs {len(e):3d}  fast vs SimPy median {np.median(e):+5.1f} %, "
                     f"min {e.min():+5.1f} %, max {e.max():+5.1f} %")
    text = "\n".join(lines) + "\n"
    (HERE / "engines.txt").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
