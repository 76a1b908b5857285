"""Reading back a validation's run logs (``validation.csv``, ``rounds.csv``) with every cell
checked: a resumed validation trusts these files, so a hand-edited, truncated or foreign one
is a SpecError naming the file, the row, the column, the value and what is allowed, not a
``ValueError`` deep in the comparison or a NaN in the report (issue 23)."""
from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any, Callable

from parsim.specs import SpecError
from parsim.specs.files import read_text


class Cells:
    """One row of a log: typed reads that name ``file row N column C`` when a cell is wrong."""

    def __init__(self, path: Path, index: int, row: dict[str, Any]):
        self.path, self.index, self.row = path, index, row

    def where(self, column: str) -> str:
        return f"{self.path.name} row {self.index + 2} column {column}"      # row 1 is the header

    def text(self, column: str) -> str:
        value = self.row.get(column)
        if value is None:
            raise SpecError(self.where(column), None, "a value (the row is shorter than the header)")
        return value

    def number(self, column: str, optional: bool = False, minimum: float = 0.0) -> float | None:
        """A finite float >= ``minimum``; None for an empty cell where ``optional``."""
        raw = self.row.get(column)
        if optional and raw in (None, ""):
            return None
        try:
            value = float(self.text(column))
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= minimum):
            raise SpecError(self.where(column), raw, f"a finite number >= {minimum:g}")
        return value

    def integer(self, column: str, minimum: int = 0) -> int:
        raw = self.text(column)
        if not (re.fullmatch(r"\s*[0-9]{1,16}\s*", raw) and int(raw) >= minimum):     # ASCII digits only
            raise SpecError(self.where(column), raw, f"an integer >= {minimum}")
        return int(raw)

    def json_list(self, column: str, item: Callable[[Any], bool], allowed: str, default: str | None = None) -> list:
        raw = self.row.get(column) or default
        try:
            value = json.loads(self.text(column) if raw is None else raw)
        except (ValueError, RecursionError):
            value = None
        if not isinstance(value, list) or not all(item(x) for x in value):
            raise SpecError(self.where(column), raw, f"a JSON list of {allowed}")
        return value


def is_finite_non_negative(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def is_number(x: Any) -> bool:
    """A loss: any float, NaN included (a diverged run is a measurement, not a bad file)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def read_log(path: Path, required: tuple[str, ...]) -> list[Cells]:
    """The rows of the CSV log ``path`` ([] when it does not exist), after its header has been
    checked for the ``required`` columns."""
    if not path.exists():
        return []
    text = read_text(path, "out")
    try:
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise SpecError("out", str(path), f"a CSV table written by parsim validate ({e})") from None
    header = next(csv.reader(io.StringIO(text, newline="")), [])
    missing = [c for c in required if c not in header]
    if missing:
        raise SpecError(f"{path.name}", str(path), f"a table with the columns {', '.join(required)} "
                        f"(missing {', '.join(missing)}; is this folder another tool's output?)")
    return [Cells(path, i, r) for i, r in enumerate(rows)]
