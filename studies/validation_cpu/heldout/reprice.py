"""Re-price a run of record with today's simulator: each row's plan simulated with the run's
profile, against the step time and peak memory the executor measured then (no executor run).

    .venv/bin/python studies/validation_cpu/heldout/reprice.py [RUN_DIR] [--without-messages] [--profile P]  # ~2 s

RUN_DIR defaults to run_20261127/; prints one line per plan and a summary per model.
``--without-messages`` prices without the profile's pipeline-message CPU curves
(``costs.host.message_cpu``), to see what they change on the same measurements; ``--profile P``
prices with profile P instead of the run's own (e.g. the run's with a key added or removed)."""
from __future__ import annotations

import csv
import dataclasses
import statistics
import sys
from pathlib import Path

from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

HERE = Path(__file__).parent


def _cluster(world: int, profile: Path, messages: bool):
    cluster = load_cluster(f"cpu:{world}", profile=profile)
    if messages:
        return cluster
    tables = cluster.device.tables.replace(p2p_send_cpu=None, p2p_recv_cpu=None)
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))


def main(run: Path, messages: bool = True, profile: Path | None = None) -> None:
    profile = profile or run / "profile.yaml"
    for table in sorted(run.glob("*/validation.csv")):
        model = load_model(HERE / f"model_{table.parent.name}.yaml")
        steps, peaks = [], []
        for row in csv.DictReader(table.open()):
            if not row.get("measured_step_s"):
                continue
            plan = parse_plan(row["plan"])
            res = simulate(model, _cluster(plan.world_size, profile, messages), plan, record_events=False)
            step = res.step_time_s / float(row["measured_step_s"]) - 1
            peak = res.peak_memory_bytes / float(row["measured_peak_bytes"]) - 1
            steps.append(step)
            peaks.append(peak)
            print(f"  {row['plan'][:72]:72} step {step:+6.1%} (then {float(row['step_error']):+6.1%})"
                  f"  peak memory {peak:+5.1%} (then {float(row['peak_memory_error']):+5.1%})")
        print(f"{model.name}: {len(steps)} plans, step |error| median {statistics.median(map(abs, steps)):.1%}"
              f" max {max(map(abs, steps)):.1%}; peak memory |error| max {max(map(abs, peaks)):.1%}")


if __name__ == "__main__":
    argv = sys.argv[1:]
    other = None
    if "--profile" in argv:
        i = argv.index("--profile")
        other = Path(argv[i + 1])
        del argv[i:i + 2]
    args = [a for a in argv if a != "--without-messages"]
    main(Path(args[0]) if args else HERE / "run_20261127", "--without-messages" not in argv, other)
