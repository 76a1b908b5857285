"""How many ranks compute at once, measured against simulated, for the 4-rank held-out plans
(4 ranks on 2 cores) over every committed run that kept its traces.

Per plan and run: *busy ranks* = the seconds the ranks spend inside compute actions, summed over
ranks, over the step's span, in the measured trace (``traces/planNN.measured.json``, the median
round) and in the predicted one (``planNN.predicted.json``). The simulator shares the host's
cores among the ranks computing at once (``parsim.costs.sharing``, processor sharing: each of
k runnable ranks on c cores at min(1, c / k) of its speed). A plan whose sign is the same in
every run is one whose overlap of compute the simulator gets wrong the same way each time;
the step error beside it is the run's own (its level moves with the calibration's minutes).
Per-core run queues in place of processor sharing did not change that (the README, "Where the
simulated overlap of compute is off").

    python3 studies/validation_cpu/heldout/concurrency.py > studies/validation_cpu/heldout/concurrency.txt

Reads traces only (no parsim import): under a second.
"""
from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent


def busy_ranks(path: Path) -> float:
    """Rank-seconds inside compute actions over the step's span."""
    events = [e for e in json.loads(path.read_text())["events"] if e[2] == "compute"]
    span = max(e[7] for e in events) - min(e[6] for e in events)
    return sum(e[7] - e[6] for e in events) / span


def main() -> None:
    rows: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
    runs = 0
    for run in sorted(HERE.glob("run_*")):
        found = False
        for table in sorted(run.glob("*/validation.csv")):
            traces = table.parent / "traces"
            for i, row in enumerate(csv.DictReader(table.open())):
                measured, predicted = traces / f"plan{i:02d}.measured.json", traces / f"plan{i:02d}.predicted.json"
                if int(row["world_size"]) != 4 or not (measured.exists() and predicted.exists()):
                    continue
                found = True
                rows[(table.parent.name, row["plan"])].append(
                    (busy_ranks(measured), busy_ranks(predicted), float(row["step_error"])))
        runs += found
    print(f"4-rank plans of {runs} held-out runs (traces kept); busy ranks = rank-seconds in compute / step span")
    print(f"{'model':6s} {'plan':64s} {'runs':>4s} {'measured':>8s} {'predicted':>9s} {'m - p':>6s} "
          f"{'m < p':>6s} {'step error':>10s}")
    for (model, plan), got in sorted(rows.items()):
        diff = [m - p for m, p, _ in got]
        print(f"{model:6s} {plan[:64]:64s} {len(got):4d} {statistics.median(m for m, _, _ in got):8.2f} "
              f"{statistics.median(p for _, p, _ in got):9.2f} {statistics.median(diff):+6.2f} "
              f"{sum(d < 0 for d in diff):>3d}/{len(diff):<2d} {statistics.median(e for *_, e in got):+10.1%}")


if __name__ == "__main__":
    main()
