"""What the contention measured over a common window does to the CPU validations (issues 20, 21).

``calibration.comm._alternating_rounds`` used to time a fixed number of calls on every rank at
once: ranks that finished early left the last ones the host to themselves, and 4 GEMM ranks on
2 cores read 1.86x, below the 2x that 4 busy ranks on 2 cores take at least. It now times one
window every rank fills with calls (the host's shared rate). ``profile.yaml`` here is a full
``parsim calibrate --ranks 2,4`` of the Intel VM with the new measurement (2026-11-27 15:42 UTC,
154 s, idle). This script puts its contention tables (GEMM, memory-bound, GEMM probe, layer)
into the profiles of two runs of record measured with the old method, and re-prices their
plans against the step times the executor measured then (no executor run):

* ``../../zero_bubble/validation_intel`` (28 plans, 2 and 4 ranks, the new schedules);
* ``../heldout/run_20261127`` (15 plans of three held-out models, 2 and 4 ranks).

Two splices: only the oversubscribed count (4 ranks on 2 cores, where the window changes what
is measured), and every count (2 ranks too: there the old and new values differ by the
calibration-to-calibration noise).

    .venv/bin/python studies/validation_cpu/contention_window/run.py > studies/validation_cpu/contention_window/results.txt

About 15 s; it measures nothing.
"""
from __future__ import annotations

import csv
import statistics
import tempfile
import warnings
from pathlib import Path

import yaml

from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

HERE = Path(__file__).resolve().parent
STUDIES = HERE.parents[1]
TABLES = ("contention", "contention_membound", "contention_gemm_probe", "contention_layer")
RUNS = {
    "zero_bubble/validation_intel": (STUDIES / "zero_bubble/validation_intel", lambda table, row: row["model"]),
    "validation_cpu/heldout/run_20261127": (
        STUDIES / "validation_cpu/heldout/run_20261127",
        lambda table, row: load_model(STUDIES / f"validation_cpu/heldout/model_{table.parent.name}.yaml")),
}


def _tables(profile: dict) -> dict:
    return profile["device"]["tables"] if "tables" in profile.get("device", {}) else profile["device"]["extra"]


def spliced(base: dict, new: dict, counts: tuple[str, ...] | None) -> dict:
    out = yaml.safe_load(yaml.safe_dump(base))
    for key in TABLES:
        src, dst = _tables(new)[key], _tables(out)[key]
        for count, value in src.items():
            if counts is None or count in counts:
                dst[count] = value
    return out


def reprice(run: Path, model_of, profile: Path) -> dict[int, list[float]]:
    errors: dict[int, list[float]] = {}
    for table in sorted(run.glob("**/validation.csv")):
        for row in csv.DictReader(table.open()):
            if not row.get("measured_step_s"):
                continue
            plan = parse_plan(row["plan"])
            res = simulate(model_of(table, row), load_cluster(f"cpu:{plan.world_size}", profile=profile), plan,
                           record_events=False)
            errors.setdefault(plan.world_size, []).append(res.step_time_s / float(row["measured_step_s"]) - 1)
    return errors


def line(name: str, errors: dict[int, list[float]]) -> str:
    parts = []
    for n, e in sorted(errors.items()):
        parts.append(f"{n} ranks: median |err| {statistics.median(map(abs, e)):5.1%}, max {max(map(abs, e)):5.1%}, "
                     f"signed median {statistics.median(e):+6.1%}")
    allv = [x for e in errors.values() for x in e]
    parts.append(f"all {len(allv)}: median |err| {statistics.median(map(abs, allv)):5.1%}, max {max(map(abs, allv)):5.1%}")
    return f"  {name:34} " + "; ".join(parts)


def main() -> None:
    warnings.filterwarnings("ignore")
    new = yaml.safe_load((HERE / "profile.yaml").read_text())
    print("contention at 4 ranks (new window measurement):",
          ", ".join(f"{k} {_tables(new)[k]['4']:.3f}" for k in TABLES))
    with tempfile.TemporaryDirectory() as tmp:
        for name, (run, model_of) in RUNS.items():
            base = yaml.safe_load((run / "profile.yaml").read_text())
            print(f"{name} (its profile's 4-rank values: "
                  + ", ".join(f"{k} {_tables(base)[k]['4']:.3f}" for k in TABLES) + ")")
            for label, counts in (("as measured then", ()), ("4-rank contention from the window", ("4",)),
                                  ("every count from the window", None)):
                path = Path(tmp) / f"{run.name}-{len(counts or 'all')}.yaml"
                path.write_text(yaml.safe_dump(spliced(base, new, counts)))
                print(line(label, reprice(run, model_of, path)))


if __name__ == "__main__":
    main()
