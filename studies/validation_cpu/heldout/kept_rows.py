"""The plans a kept held-out run measured, for the scripts that re-price them
(``cost_variants.py``, ``tp_variants.py``, ``tp_calls.py``, ``plan_bias.py``)."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Iterator

from parsim.specs import load_model, parse_plan

HERE = Path(__file__).resolve().parent


def measured_rows(run: Path) -> Iterator[tuple[Path, int, Any, Any, dict]]:
    """(its validation.csv, its index there, model, plan, row) of every row of ``run`` whose step
    the executor measured. The index names the row's traces (``traces/planNN.*``); the matrices
    of models other than the held-out ones (some older runs kept them) are left out."""
    for table in sorted(run.glob("*/validation.csv")):
        spec = HERE / f"model_{table.parent.name}.yaml"
        if not spec.exists():
            continue
        model = load_model(spec)
        for i, row in enumerate(csv.DictReader(table.open())):
            if row.get("measured_step_s"):
                yield table, i, model, parse_plan(row["plan"]), row


def plan_label(model, plan, row: dict) -> str:
    """Model, rank count and plan as the reports print them (fp32 left unsaid: every plan runs it)."""
    return f"{model.name:14s} {plan.world_size}r {row['plan'].replace(' dtype=fp32', '')}"
