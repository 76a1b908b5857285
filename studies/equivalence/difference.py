"""Comparing what two trees printed for the same command: the verdict of one item, and the
differences behind it.

Wall-clock fields (``sim_wall_s``, a sweep's ``timings_s``, ...) measure the machine, not the
model, and are dropped. Everything else must match: numbers bit for bit ("identical") or within
``rel_tol`` relative, ``|a - b| <= rel_tol * max(|a|, |b|)`` ("within"; arithmetic done in
another order), strings, booleans, keys and list lengths exactly. A command that failed must
fail the same way in both trees ("errors-same").
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

REL_TOL = 1e-9
WALL_CLOCK = re.compile(r"(^|_)wall(_s)?$|^timings_s$")
VERDICTS = ("identical", "within", "different", "errors-same", "errors-different")
MISSING = "<missing>"


@dataclass
class Difference:
    path: str
    before: Any
    after: Any
    rel: float | None = None         # relative difference of two numbers

    def __str__(self) -> str:
        rel = "" if self.rel is None else f"  (relative {self.rel:.3g})"
        return f"{self.path}: {_short(self.before)} -> {_short(self.after)}{rel}"


@dataclass
class Outcome:
    verdict: str
    differences: list[Difference] = field(default_factory=list)
    max_rel: float = 0.0             # largest relative difference among the numbers within tolerance


def _short(v: Any, limit: int = 160) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + "..."


def is_wall_clock(key: str) -> bool:
    return bool(WALL_CLOCK.search(str(key)))


def drop_wall_clock(value: Any) -> Any:
    """``value`` without wall-clock keys, at any depth."""
    if isinstance(value, dict):
        return {k: drop_wall_clock(v) for k, v in value.items() if not is_wall_clock(k)}
    if isinstance(value, list):
        return [drop_wall_clock(v) for v in value]
    return value


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def relative_difference(a: float, b: float) -> float:
    """|a - b| / max(|a|, |b|); 0 for equal numbers (NaN equals NaN here), inf for inf vs finite."""
    if a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
        return 0.0
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def walk(before: Any, after: Any, path: str = "") -> Iterator[Difference]:
    """Every leaf where ``before`` and ``after`` are not bit-identical (numbers carry ``rel``)."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in after:
                yield Difference(sub, before[key], MISSING)
            elif key not in before:
                yield Difference(sub, MISSING, after[key])
            else:
                yield from walk(before[key], after[key], sub)
    elif isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            yield Difference(f"{path}.len", len(before), len(after))
        for i, (a, b) in enumerate(zip(before, after)):
            yield from walk(a, b, f"{path}[{i}]")
    elif _is_number(before) and _is_number(after):
        if isinstance(before, float) != isinstance(after, float):     # 5 printed as 5.0: the output changed
            yield Difference(f"{path} (int vs float)", before, after)
        else:
            rel = relative_difference(float(before), float(after))
            if rel:
                yield Difference(path, before, after, rel)
    elif before != after or type(before) is not type(after):
        yield Difference(path, before, after)


def compare_values(before: Any, after: Any, rel_tol: float = REL_TOL, new_keys: bool = False) -> Outcome:
    """The verdict for two outputs (wall-clock fields dropped): identical, within or different.
    ``new_keys``: keys only the "after" output has (a field added on purpose) are no difference."""
    diffs = [d for d in walk(drop_wall_clock(before), drop_wall_clock(after))
             if not (new_keys and d.before == MISSING)]
    if not diffs:
        return Outcome("identical")
    bad = [d for d in diffs if d.rel is None or d.rel > rel_tol]
    if bad:
        return Outcome("different", bad)
    return Outcome("within", diffs, max(d.rel for d in diffs))


def failure(record: dict) -> str | None:
    """What went wrong in a runner record (None if the command succeeded)."""
    if "exception" in record:
        return f"exception {record['exception']}"
    if record.get("rc", 0) != 0:
        return f"exit {record['rc']}: {record.get('stdout')}"
    return None


def compare_records(before: dict, after: dict, rel_tol: float = REL_TOL, new_keys: bool = False) -> Outcome:
    """The verdict for one corpus item from the two runner records (tables already loaded into
    ``record["table_rows"]`` when the item has one)."""
    fb, fa = failure(before), failure(after)
    if fb or fa:
        if fb == fa:
            return Outcome("errors-same")
        return Outcome("errors-different", [Difference("error", fb or "<ok>", fa or "<ok>")])
    doc_b = {"stdout": before.get("stdout"), "table": before.get("table_rows")}
    doc_a = {"stdout": after.get("stdout"), "table": after.get("table_rows")}
    return compare_values(doc_b, doc_a, rel_tol, new_keys)


def rows_by_plan(rows: list[dict]) -> dict[str, dict] | list[dict]:
    """A table's rows keyed by their ``plan`` string (so a reordered tie is not a difference of
    every row after it); the list itself if plans are missing or repeat."""
    keys = [r.get("plan") for r in rows]
    if None in keys or len(set(keys)) != len(keys):
        return rows
    return dict(zip(keys, rows))
