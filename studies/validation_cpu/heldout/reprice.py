"""Re-price a run of record with today's simulator: each row's plan simulated with the run's
profile, against the step time and peak memory the executor measured then (no executor run).

    .venv/bin/python studies/validation_cpu/heldout/reprice.py [RUN_DIR]    # ~2 s

RUN_DIR defaults to run_20261127/; prints one line per plan and a summary per model."""
from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

HERE = Path(__file__).parent


def main(run: Path) -> None:
    profile = run / "profile.yaml"
    for table in sorted(run.glob("*/validation.csv")):
        model = load_model(HERE / f"model_{table.parent.name}.yaml")
        steps, peaks = [], []
        for row in csv.DictReader(table.open()):
            if not row.get("measured_step_s"):
                continue
            plan = parse_plan(row["plan"])
            res = simulate(model, load_cluster(f"cpu:{plan.world_size}", profile=profile), plan, record_events=False)
            step = res.step_time_s / float(row["measured_step_s"]) - 1
            peak = res.peak_memory_bytes / float(row["measured_peak_bytes"]) - 1
            steps.append(step)
            peaks.append(peak)
            print(f"  {row['plan'][:72]:72} step {step:+6.1%} (then {float(row['step_error']):+6.1%})"
                  f"  peak memory {peak:+5.1%} (then {float(row['peak_memory_error']):+5.1%})")
        print(f"{model.name}: {len(steps)} plans, step |error| median {statistics.median(map(abs, steps)):.1%}"
              f" max {max(map(abs, steps)):.1%}; peak memory |error| max {max(map(abs, peaks)):.1%}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "run_20261127")
