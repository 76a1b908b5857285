"""What pricing a tied embedding's gradient sum (``costs.ops._tied_gradient_sum``) changes on the
held-out runs kept here (no executor run): each run's layer terms re-derived from its stored
measurements (``calibration.layer_terms.refit_data``: the synthetic stages are tied models too),
then its 25 plans priced against its own measurements, without the op (before) and with it.

    .venv/bin/python studies/validation_cpu/heldout/tied_sum.py > studies/validation_cpu/heldout/tied_sum.txt   # ~30 s

Writes the re-derived profiles under /tmp/parsim-tied-sum/."""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import yaml

import parsim.costs.ops as ops
from parsim.calibration.layer_terms import refit_data

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from cross_runs import measured, predicted  # noqa: E402

OUT = Path("/tmp/parsim-tied-sum")
RUNS = ["run_20261201c_zen3", "run_20261201d_zen3", "run_20261201e_zen3", "run_20261201f_zen3", "run_20261202_zen3",
        "run_20261202b_zen3"]
TIED = ("gpt", "deep", "long")       # the held-out models with tied embeddings (model_*.yaml)


def price(run: Path, label: str) -> dict:
    """{(model, plan): signed error} with the run's layer terms re-derived under today's pricing."""
    data = refit_data(yaml.safe_load((run / "profile.yaml").read_text()))
    out = OUT / f"{run.name}_{label}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    meas = measured(run)
    pred = predicted(out, sorted(meas))
    return {k: pred[k] / meas[k] - 1 for k in meas}


def main() -> None:
    rule = ops._tied_gradient_sum
    per_plan: dict = {}
    for label, fn in (("before", lambda *a: []), ("after", rule)):
        ops._tied_gradient_sum = fn
        meds, maxs, sides = [], [], []
        for name in RUNS:
            errors = price(HERE / name, label)
            for k, v in errors.items():
                per_plan.setdefault(k, {}).setdefault(label, []).append(math.log1p(v))
            size = [abs(v) for v in errors.values()]
            meds.append(statistics.median(size))
            maxs.append(max(size))
            sides.append(max(sum(v > 0 for v in errors.values()), sum(v < 0 for v in errors.values())))
        print(f"{label:6s} |error| median " + " ".join(f"{m:5.1%}" for m in meds) + " | max "
              + " ".join(f"{m:5.1%}" for m in maxs) + " | on one side " + " ".join(f"{s:2d}/25" for s in sides))
    ops._tied_gradient_sum = rule
    print(f"(runs: {', '.join(RUNS)})\n\nper plan, median over the runs of the signed error: before -> after "
          "(* a stage holds both ends of a tied embedding: pp = 1)")
    for k, v in sorted(per_plan.items()):
        b, a = (math.expm1(statistics.median(v[label])) for label in ("before", "after"))
        mark = "*" if k[0] in TIED and "pp=1" in k[1] else " "
        print(f" {mark}{k[0]:6s} {k[1][:60]:60s} {b:+6.1%} -> {a:+6.1%}")
    for label in ("before", "after"):
        size = [abs(math.expm1(statistics.median(v[label]))) for v in per_plan.values()]
        print(f"median over plans of |median signed error| {label}: {statistics.median(size):.1%}")


if __name__ == "__main__":
    main()
