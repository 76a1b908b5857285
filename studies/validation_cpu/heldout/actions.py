"""Per rank and action kind, the median duration of each compute action (F, B, I, W,
optimizer) in a validation run's measured trace against the simulator's predicted trace, and
where each rank's step goes (compute, pipeline waits, collectives): finer than
``../decompose.py``, which splits the step error by kind over the whole step.

    .venv/bin/python studies/validation_cpu/heldout/actions.py OUT/deep   # OUT of run.sh: 1 s

Reads ``traces/planNN.measured.json`` (the median round) and ``planNN.predicted.json`` that
``parsim validate`` writes; prints one block per plan."""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def load(path: Path) -> tuple[dict, list[list]]:
    data = json.loads(path.read_text())
    return data.get("meta", {}), data["events"]


def by_kind(events: list[list]) -> tuple[dict, dict]:
    """({(rank, kind): [seconds of each compute action]}, {(rank, stream:kind): total seconds}).
    An optimizer action is counted net of the DP collectives inside its span: the executor's
    encloses ZeRO's parameter all-gathers after the update, which the simulator's trace puts
    after it as events of their own (TP calls stay inside F and B on both sides)."""
    actions, totals = defaultdict(list), defaultdict(float)
    for rank, _stage, stream, kind, _mb, _layer, start, end, *_ in events:
        totals[(rank, f"{stream}:{kind}")] += end - start
        if stream == "compute":
            inside = 0.0
            if kind == "optimizer":
                inside = sum(e[7] - e[6] for e in events
                             if e[0] == rank and e[2] == "dp" and e[6] >= start and e[7] <= end)
            actions[(rank, kind)].append(end - start - inside)
    return actions, totals


def report(run: Path) -> str:
    lines = []
    for measured_path in sorted((run / "traces").glob("plan[0-9][0-9].measured.json")):
        predicted_path = measured_path.with_name(measured_path.name.replace("measured", "predicted"))
        if not predicted_path.exists():
            continue
        meta, measured = load(measured_path)
        _, predicted = load(predicted_path)
        (am, tm), (ap, tp) = by_kind(measured), by_kind(predicted)
        lines.append(f"{meta.get('plan', measured_path.stem)}")
        for key in sorted(am):
            if key in ap:
                m, p = statistics.median(am[key]), statistics.median(ap[key])
                lines.append(f"  rank {key[0]} {key[1]:9s} x{len(am[key]):3d}  measured {m * 1e3:8.2f} ms"
                             f"  predicted {p * 1e3:8.2f} ms  {p / m - 1:+7.1%}")
        for rank in sorted({r for r, _ in tm}):
            other = {k: v for (r, k), v in tm.items() if r == rank and not k.startswith("compute")}
            if other:
                parts = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in sorted(other.items()))
                lines.append(f"  rank {rank} measured non-compute ms: {parts}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a parsim validate --out folder (with traces/)")
    print(report(ap.parse_args().run))


if __name__ == "__main__":
    main()
