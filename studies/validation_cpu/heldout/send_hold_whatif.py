"""What the send call's hold (``costs.host.send_hold``, profile key ``p2p_send_hold``) moves on
held-out runs measured before the calibration timed it: each run's 25 plans re-priced with its own
profile, without the key, with the curve a quick ``--ranks 2,4`` calibration read on the Zen 4 VM
(2026-12-02: 0.22 ms at 2 ranks, 0.29 ms at 4) and with the executor's own figures there
(``../send_call.txt``: ~0.27 ms at 2 ranks, ~0.8 ms beyond CPU at 4). Prints the median and max
|step error|, the plans predicted slow, and each pipeline plan's error.

    .venv/bin/python studies/validation_cpu/heldout/send_hold_whatif.py > studies/validation_cpu/heldout/send_hold_whatif.txt

About 20 s (SimPy, no executor).
"""
from __future__ import annotations

import csv
import dataclasses
import statistics
from pathlib import Path

from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan
from parsim.specs.tables import RankCurve

HERE = Path(__file__).resolve().parent
RUNS = ("run_20261202f_zen4", "run_20261202e_zen5", "run_20261202_zen3")
CURVES = {"none": None, "calibrated": ((2, 0.217e-3), (4, 0.292e-3)), "executor": ((2, 0.27e-3), (4, 0.8e-3))}


def main() -> None:
    for run in RUNS:
        rows = [(t.parent.name, r) for t in sorted((HERE / run).glob("*/validation.csv"))
                for r in csv.DictReader(t.open()) if r.get("measured_step_s")]
        print(run)
        for name, curve in CURVES.items():
            errors = []
            for model_name, row in rows:
                plan = parse_plan(row["plan"])
                cluster = load_cluster(f"cpu:{plan.world_size}", profile=HERE / run / "profile.yaml")
                if curve:
                    tables = cluster.device.tables.replace(p2p_send_hold=RankCurve(curve))
                    cluster = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))
                res = simulate(load_model(HERE / f"model_{model_name}.yaml"), cluster, plan, record_events=False)
                errors.append((row["plan"], res.step_time_s / float(row["measured_step_s"]) - 1))
            a = [abs(e) for _, e in errors]
            print(f"  {name:10} median {statistics.median(a):5.1%} max {max(a):5.1%} slow {sum(e > 0 for _, e in errors):2d}/"
                  f"{len(errors)}  pipeline plans: " + " ".join(f"{e:+.1%}" for p, e in errors if "pp=1 " not in p))
    print("pipeline plans, in order: " + " | ".join(f"{m} {r['plan'][:40]}" for m, r in rows if "pp=1 " not in r["plan"]))


if __name__ == "__main__":
    main()
