"""Does a rank compute slower while the other rank of a 2-rank plan computes? Read from the
executor's own traces of the committed held-out runs, and from the simulator's predicted traces
of the same plans as the check of the method.

Per 2-rank pipeline plan (pp=2: 1F1B, GPipe, interleaved; the warm-up and drain leave a rank
computing alone while the steady state has both computing), per trace, rank and action kind
(F, B), each compute action after the first microbatch's gives (x, y): x the fraction of its
span the other rank spent inside compute actions, y its duration. A line fitted to them gives
the duration with the other rank always computing over the duration with it never computing,
(a + b) / a: the slowdown of one rank's compute while the other computes. Its median over a
run's fits is printed beside what the run's calibration read for the same thing
(``contention_layer`` at 2 ranks: the real layer stepped alone, then on both ranks at once, in
alternating rounds, ``calibration.comm._alternating_rounds``) and the GEMM contention fitted
from it (``contention``), for the executor's measured traces (every round kept) and the
simulator's predicted one, which should recover the profile's own number.

    python3 studies/validation_cpu/heldout/trace_contention.py > studies/validation_cpu/heldout/trace_contention.txt

Reads traces and profiles only (numpy, PyYAML): about a second.
"""
from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent


def _busy_share(start: float, end: float, spans: list[tuple[float, float]]) -> float:
    """Fraction of [start, end] covered by ``spans`` (one rank's actions: disjoint)."""
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans) / (end - start)


def trace_slowdowns(path: Path) -> list[float]:
    """(a + b) / a of each (rank, kind) line fitted to duration against the other rank's busy
    share, in one trace (events: rank, stage, category, kind, microbatch, ..., start, end)."""
    events = [e for e in json.loads(path.read_text())["events"] if e[2] == "compute"]
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        spans[e[0]].append((e[6], e[7]))
    points: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e[4] != 0:             # the first microbatch's actions warm caches and allocators up
            points[(e[0], e[3])].append((_busy_share(e[6], e[7], spans[1 - e[0]]), e[7] - e[6]))
    out = []
    for pts in points.values():
        x, y = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        if len(pts) >= 4 and x.max() - x.min() >= 0.5:        # both regimes present
            slope, intercept = np.polyfit(x, y, 1)
            if intercept > 0:
                out.append(float((intercept + slope) / intercept))
    return out


def run_slowdowns(run: Path, kind: str) -> list[float]:
    """Every fit of the run's 2-rank pipeline plans, from the measured rounds' traces
    (``kind`` = "measured") or the predicted ones ("predicted")."""
    pattern = "round*.measured" if kind == "measured" else "predicted"
    out = []
    for table in sorted(run.glob("*/validation.csv")):
        for i, row in enumerate(csv.DictReader(table.open())):
            if int(row["world_size"]) == 2 and "pp=2" in row["plan"]:
                for path in sorted((table.parent / "traces").glob(f"plan{i:02d}.{pattern}.json")):
                    out += trace_slowdowns(path)
    return out


def at_two(extra: dict, key: str) -> float | None:
    curve = {int(k): float(v) for k, v in (extra.get(key) or {}).items()}
    return curve.get(2)


def main() -> None:
    print("2-rank pipeline plans: a rank's compute action with the other rank computing over without it")
    print(f"{'run':26s} {'executor':>9s} {'fits':>5s} {'simulator':>10s} {'fits':>5s} {'calib. layer':>13s} {'GEMM':>6s}")
    rows = []
    for run in sorted(HERE.glob("run_2026*")):
        profile = run / "profile.yaml"
        if not profile.exists():
            continue
        extra = yaml.safe_load(profile.read_text())["device"].get("extra", {})
        layer, gemm = at_two(extra, "contention_layer"), at_two(extra, "contention")
        measured, predicted = run_slowdowns(run, "measured"), run_slowdowns(run, "predicted")
        if layer is None or gemm is None or len(measured) < 10 or not predicted:
            continue
        rows.append((statistics.median(measured), statistics.median(predicted), layer))
        print(f"{run.name:26s} {rows[-1][0]:9.3f} {len(measured):5d} {rows[-1][1]:10.3f} {len(predicted):5d} "
              f"{layer:13.3f} {gemm:6.3f}")
    print(f"median over {len(rows)} runs: executor {statistics.median(r[0] for r in rows):.3f}, simulator "
          f"{statistics.median(r[1] for r in rows):.3f}, the calibrations' layer {statistics.median(r[2] for r in rows):.3f}")


if __name__ == "__main__":
    main()
