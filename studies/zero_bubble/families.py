"""Issue 21's CPU-matrix check, per schedule family: are the new schedules' step-time errors
within the bounds of 1F1B's and interleaved's on the same run, and memory within 3 %?

    .venv/bin/python studies/zero_bubble/families.py RUN_DIR [--reprice]     # < 5 s

RUN_DIR holds a ``parsim validate`` run of ``matrix.yaml`` (``validation.csv`` and the
``profile.yaml`` it was predicted with). ``--reprice`` prices every plan again with today's
simulator and that profile, against the step times the executor measured then (no executor
run). The matrix's targets (``studies/validation_cpu``): 2 ranks median |error| <= 5 %, max
<= 15 %; 4 ranks median <= 10 %; peak memory within 3 %.
"""
from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

OLD = ("1f1b", "interleaved")          # the schedules the new ones are held against
TARGETS = {2: ("median <= 5 %, max <= 15 %", 5.0, 15.0), 4: ("median <= 10 %", 10.0, None)}


def rows(run: Path, reprice: bool) -> list[dict]:
    out = []
    with open(run / "validation.csv") as f:
        for r in csv.DictReader(f):
            plan = parse_plan(r["plan"])
            error = float(r["step_error"])
            if reprice:
                cluster = load_cluster(f"cpu:{plan.world_size}", profile=run / "profile.yaml")
                predicted = simulate(load_model(r["model"]), cluster, plan, record_events=False).step_time_s
                error = predicted / float(r["measured_step_s"]) - 1.0
            out.append(dict(plan=r["plan"], world=plan.world_size, new=plan.schedule not in OLD,
                            step=100 * error, memory=100 * abs(float(r["max_rank_memory_error"]))))
    return out


def verdict(errors: list[float], world: int) -> str:
    text, median_cap, max_cap = TARGETS[world]
    med, top = statistics.median(errors), max(errors)
    ok = med <= median_cap and (max_cap is None or top <= max_cap)
    return f"median {med:4.1f} %, max {top:4.1f} % ({text}: {'met' if ok else 'NOT MET'})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--reprice", action="store_true", help="today's simulator on the measured step times")
    args = p.parse_args()
    table = rows(args.run, args.reprice)
    for r in table:
        print(f"  {r['world']} ranks  {'new ' if r['new'] else 'old '} {r['step']:+6.1f} %  memory {r['memory']:4.1f} %  "
              f"{r['plan']}")
    for world in sorted({r["world"] for r in table}):
        for new, name in ((False, "1F1B + interleaved"), (True, "new schedules")):
            sel = [abs(r["step"]) for r in table if r["world"] == world and r["new"] == new]
            if sel:
                print(f"{world} ranks, {name:18s} ({len(sel):2d} plans): |step error| {verdict(sel, world)}")
    worst = max(r["memory"] for r in table)
    print(f"peak memory: max error over plans and ranks {worst:.1f} % (<= 3 %: {'met' if worst <= 3 else 'NOT MET'})")


if __name__ == "__main__":
    main()
