"""Where the zero-bubble plans' step-time errors sit: per rank and action kind, the seconds the
executor spent in F, B, I, W and the optimizer step (its median round's trace) against what the
simulator priced (its trace), for every plan of this folder on 2 ranks.

    cd studies/zero_bubble/validation_intel_final && ../../../.venv/bin/python kinds.py > kinds.txt

Reads the kept traces only (``traces/planNN.{measured,predicted}.json``): a second to run."""
from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent


def per_kind(path: Path) -> dict[tuple[int, str], float]:
    data = json.loads(path.read_text())
    cols = data["columns"]
    out: dict[tuple[int, str], float] = defaultdict(float)
    for values in data["events"]:
        e = dict(zip(cols, values))
        if e["stream"] == "compute" and e["layer"] == -1:
            out[(e["rank"], e["kind"])] += e["end"] - e["start"]
    return out


def main() -> None:
    rows = list(csv.DictReader((HERE / "validation.csv").open()))
    for i, row in enumerate(rows):
        if int(row["world_size"]) != 2:
            continue
        measured = per_kind(HERE / "traces" / f"plan{i:02d}.measured.json")
        predicted = per_kind(HERE / "traces" / f"plan{i:02d}.predicted.json")
        print(f"{row['plan']}  (step {float(row['step_error']):+.1%})")
        for key in sorted(measured):
            m, p = measured[key], predicted.get(key, 0.0)
            if m < 1e-3:
                continue
            print(f"   rank {key[0]} {key[1]:10} measured {m * 1e3:7.1f} ms  predicted {p * 1e3:7.1f} ms"
                  f"  ({p / m - 1:+6.1%})")


if __name__ == "__main__":
    main()
