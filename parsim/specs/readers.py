"""Readers of the numbers in a profile's calibrated tables: each checks one value and raises a
``SpecError`` naming where it is and what is allowed. Shared by ``tables``, ``surfaces`` and
``collectives``."""
from __future__ import annotations

from typing import Any

from .errors import SpecError


def number(where: str, raw: Any) -> float:
    """A finite int or float as read (never a bool); the value itself, unconverted. NaN, inf
    and integers beyond float range are refused: every price computed from them would be too."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not abs(raw) <= 1e300:   # NaN fails <=
        raise SpecError(where, raw, "a finite number")
    return raw


def flag(where: str, raw: Any) -> bool:
    """A YAML boolean (never a number or a string)."""
    if not isinstance(raw, bool):
        raise SpecError(where, raw, "true or false")
    return raw


def mapping(where: str, raw: Any) -> dict:
    if not isinstance(raw, dict):
        raise SpecError(where, raw, "a mapping of keys to values")
    return raw


def row(where: str, raw: Any, widths: tuple[int, ...], text_first: bool = False) -> tuple:
    if not isinstance(raw, (list, tuple)) or len(raw) not in widths:
        raise SpecError(where, raw, f"a list of {' or '.join(map(str, widths))} numbers")
    return (str(raw[0]), *(number(where, x) for x in raw[1:])) if text_first else tuple(number(where, x) for x in raw)


def rows(where: str, raw: Any, widths: tuple[int, ...], text_first: bool = False) -> tuple[tuple, ...]:
    if not isinstance(raw, (list, tuple)):
        raise SpecError(where, raw, "a list of rows")
    return tuple(row(where, r, widths, text_first) for r in raw)


def known(where: str, d: dict, allowed: tuple[str, ...]) -> None:
    for k in d:
        if k not in allowed:
            raise SpecError(f"{where}.{k}", d[k], f"unknown key; allowed: {', '.join(allowed)}")


def plain(x: Any) -> Any:
    """Tuples back to the lists YAML writes."""
    if isinstance(x, tuple):
        return [plain(v) for v in x]
    return x
