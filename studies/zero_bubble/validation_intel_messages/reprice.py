"""This run's measurements priced with and without the pipeline messages' CPU
(``costs.host.message_cpu``): the profile as calibrated, and the same profile with its
``p2p_send_cpu`` / ``p2p_recv_cpu`` curves removed. No executor run.

    .venv/bin/python studies/zero_bubble/validation_intel_messages/reprice.py \
        > studies/zero_bubble/validation_intel_messages/reprice.txt

About 10 s."""
from __future__ import annotations

import csv
import dataclasses
import statistics
from pathlib import Path

from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

HERE = Path(__file__).parent
PROFILE = HERE.parents[2] / "studies" / "validation_cpu" / "heldout" / "run_20261127c" / "profile.yaml"


def _without_messages(cluster):
    tables = cluster.device.tables.replace(p2p_send_cpu=None, p2p_recv_cpu=None)
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))


def main() -> None:
    rows = []
    for row in csv.DictReader((HERE / "validation.csv").open()):
        plan, measured = parse_plan(row["plan"]), float(row["measured_step_s"])
        cluster = load_cluster(f"cpu:{plan.world_size}", profile=str(PROFILE))
        errors = [simulate(load_model(row["model"]), c, plan, record_events=False).step_time_s / measured - 1
                  for c in (_without_messages(cluster), cluster)]
        rows.append((plan.world_size, *errors))
        print(f"{plan.world_size} {row['plan'][:66]:66} without {errors[0]:+6.1%}  with {errors[1]:+6.1%}")
    for world in (2, 4):
        for i, name in ((1, "without"), (2, "with")):
            es = [r[i] for r in rows if r[0] == world]
            print(f"{world} ranks, {name:7}: |error| median {statistics.median(map(abs, es)):.1%}, "
                  f"max {max(map(abs, es)):.1%}, mean {statistics.mean(es):+.1%}")


if __name__ == "__main__":
    main()
