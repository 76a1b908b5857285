"""Shared by the studies that price the held-out runs kept here with a pricing rule off and on
(``dram_share.py``, ``tied_sum.py``; no executor run): each run's layer terms re-derived from its
stored measurements (``calibration.layer_terms.refit_data``) under each variant, its 25 plans
priced against its own measurements, and per run and per plan what the rule changes."""
from __future__ import annotations

import math
import statistics
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Callable

import yaml

from parsim.calibration.layer_terms import refit_data

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from cross_runs import measured, predicted  # noqa: E402

Variant = tuple[str, Callable[[], AbstractContextManager]]     # (label, the pricing it runs under)


def price(run: Path, out: Path) -> tuple[dict, dict]:
    """({(model, plan): signed error}, the re-derived profile) with the run's layer terms
    re-derived under today's pricing; the profile is written to ``out``."""
    data = refit_data(yaml.safe_load((run / "profile.yaml").read_text()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    meas = measured(run)
    pred = predicted(out, sorted(meas))
    return {k: pred[k] / meas[k] - 1 for k in meas}, data


def compare(runs: list[str], variants: list[Variant], out: Path, header: str = "",
            extra: tuple[str, Callable[[dict], float]] | None = None,
            mark: Callable[[tuple[str, str]], str] = lambda key: " ") -> None:
    """Prints, per variant, each run's |error| median and max and how many plans lie on one side
    (and ``extra``'s (title, number of the re-derived profile) per run), then per plan the median
    over the runs of the signed error under each variant (``mark``: a character before the plan)."""
    per_plan: dict = {}
    for label, pricing in variants:
        meds, maxs, sides, extras = [], [], [], []
        with pricing():
            for name in runs:
                errors, data = price(HERE / name, out / f"{name}_{label}")
                for k, v in errors.items():
                    per_plan.setdefault(k, {}).setdefault(label, []).append(math.log1p(v))
                size = [abs(v) for v in errors.values()]
                meds.append(statistics.median(size))
                maxs.append(max(size))
                sides.append(max(sum(v > 0 for v in errors.values()), sum(v < 0 for v in errors.values())))
                extras.append(extra[1](data) if extra else 0.0)
        print(f"{label:6s} |error| median " + " ".join(f"{m:5.1%}" for m in meds) + " | max "
              + " ".join(f"{m:5.1%}" for m in maxs) + " | on one side " + " ".join(f"{s:2d}/25" for s in sides)
              + (f" | {extra[0]} " + " ".join(f"{x:.3f}" for x in extras) if extra else ""))
    labels = [label for label, _ in variants]
    print(f"(runs: {', '.join(runs)})\n\nper plan, median over the runs of the signed error: {' -> '.join(labels)}"
          + header)
    for k, v in sorted(per_plan.items()):
        b, a = (math.expm1(statistics.median(v[label])) for label in labels)
        print(f" {mark(k)}{k[0]:6s} {k[1][:60]:60s} {b:+6.1%} -> {a:+6.1%}")
    for label in labels:
        size = [abs(math.expm1(statistics.median(v[label]))) for v in per_plan.values()]
        print(f"median over plans of |median signed error| {label}: {statistics.median(size):.1%}")
