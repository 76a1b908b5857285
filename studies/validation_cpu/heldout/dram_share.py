"""What pricing memory-bound ops by what fits in a rank's cache (``costs.host.dram_share``)
changes on the held-out runs kept here (no executor run): each run's layer terms re-derived
from its stored measurements (``calibration.layer_terms.refit_data``), then its 25 plans priced
against its own measurements, once with every memory-bound op at the streaming add's
contention (before: the profile's last-level cache hidden) and once split (after).

    .venv/bin/python studies/validation_cpu/heldout/dram_share.py > studies/validation_cpu/heldout/dram_share.txt   # ~20 s

Writes the re-derived profiles under /tmp/parsim-dram-share/."""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import yaml

import parsim.specs.tables as tables
from parsim.calibration.layer_terms import refit_data

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from cross_runs import measured, predicted  # noqa: E402

OUT = Path("/tmp/parsim-dram-share")
RUNS = ["run_20261201c_zen3", "run_20261201d_zen3", "run_20261201e_zen3", "run_20261201f_zen3", "run_20261202_zen3"]


def price(run: Path, label: str) -> tuple[dict, float]:
    """({(model, plan): signed error}, the re-derived GEMM contention at 2 ranks)."""
    data = refit_data(yaml.safe_load((run / "profile.yaml").read_text()))
    out = OUT / f"{run.name}_{label}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    meas = measured(run)
    pred = predicted(out, sorted(meas))
    return {k: pred[k] / meas[k] - 1 for k in meas}, data["device"]["extra"]["contention"]["2"]


def main() -> None:
    llc = tables.CalibratedTables.last_level_cache
    per_plan: dict = {}
    for label, prop in (("before", property(lambda self: None)), ("after", llc)):
        tables.CalibratedTables.last_level_cache = prop
        meds, maxs, sides, c2 = [], [], [], []
        for name in RUNS:
            errors, c = price(HERE / name, label)
            for k, v in errors.items():
                per_plan.setdefault(k, {}).setdefault(label, []).append(math.log1p(v))
            size = [abs(v) for v in errors.values()]
            meds.append(statistics.median(size))
            maxs.append(max(size))
            sides.append(max(sum(v > 0 for v in errors.values()), sum(v < 0 for v in errors.values())))
            c2.append(c)
        print(f"{label:6s} |error| median " + " ".join(f"{m:5.1%}" for m in meds) + " | max "
              + " ".join(f"{m:5.1%}" for m in maxs) + " | on one side " + " ".join(f"{s:2d}/25" for s in sides)
              + " | GEMM contention at 2 ranks " + " ".join(f"{x:.3f}" for x in c2))
    tables.CalibratedTables.last_level_cache = llc
    print(f"(runs: {', '.join(RUNS)})\n\nper plan, median over the runs of the signed error: before -> after")
    for k, v in sorted(per_plan.items()):
        b, a = (math.expm1(statistics.median(v[label])) for label in ("before", "after"))
        print(f"  {k[0]:6s} {k[1][:60]:60s} {b:+6.1%} -> {a:+6.1%}")
    for label in ("before", "after"):
        size = [abs(math.expm1(statistics.median(v[label]))) for v in per_plan.values()]
        print(f"median over plans of |median signed error| {label}: {statistics.median(size):.1%}")


if __name__ == "__main__":
    main()
