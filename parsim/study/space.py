"""The space a sweep enumerates: one list of candidate values per plan key.

Defaults cover what practitioners actually try (Megatron-LM / DeepSpeed configuration
space): every factorisation dp x tp x pp of the device count, vpp in {2, 3, 4, 6, 8} for the
interleaved schedule, power-of-two micro-batches, ZeRO 0-3 with and without offload, the
three uniform recomputation policies, sequence parallel on/off, bf16. A space file (YAML
mapping ``key: [values]``) or a ``--fix "k=v ..."`` string narrows or widens any of them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from parsim.specs import OFFLOADS, RECOMPUTES, SCHEDULES, SpecError
from parsim.specs.files import path_exists, read_mapping
from parsim.specs.plan import DP_IMPLS, DTYPES, MAX_INT
from parsim.specs.stack import AUTO, plan_stacks

DEFAULT_VPP = (1, 2, 3, 4, 6, 8)
DEFAULT_MBS = (1, 2, 4, 8, 16)
DEFAULT_RECOMPUTE = ("none", "selective", "full")

# keys a sweep varies (each a list of values); the fast path models every one of them
LIST_KEYS = ("dp", "tp", "pp", "vpp", "mbs", "gbs", "schedule", "zero", "offload", "recompute", "sp",
             "dtype", "dp_impl")
# keys a sweep holds at one value for all plans
SCALAR_KEYS = ("dp_bucket_bytes", "dp_overlap", "stack")
_INT_KEYS = ("dp", "tp", "pp", "vpp", "mbs", "gbs", "zero", "dp_bucket_bytes")
_BOOL_KEYS = ("sp", "dp_overlap")
_WORD_KEYS = {"schedule": SCHEDULES, "offload": OFFLOADS, "recompute": RECOMPUTES, "dtype": DTYPES,
              "dp_impl": DP_IMPLS, "stack": plan_stacks()}
_BOOL_WORDS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False,
               "on": True, "off": False}


@dataclass(frozen=True)
class SweepSpace:
    """Candidate values per plan key. ``None`` for dp/tp/pp means "every divisor of the
    device count"; for gbs it means the sweep's ``--gbs`` (or its default)."""

    dp: tuple[int, ...] | None = None
    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    vpp: tuple[int, ...] = DEFAULT_VPP
    mbs: tuple[int, ...] = DEFAULT_MBS
    gbs: tuple[int, ...] | None = None
    schedule: tuple[str, ...] = SCHEDULES
    zero: tuple[int, ...] = (0, 1, 2, 3)
    offload: tuple[str, ...] = OFFLOADS
    recompute: tuple[str, ...] = DEFAULT_RECOMPUTE
    sp: tuple[bool, ...] = (False, True)
    dtype: tuple[str, ...] = ("bf16",)
    dp_impl: tuple[str, ...] = ("allreduce",)
    dp_bucket_bytes: int = 25 * 2**20          # PyTorch DDP bucket_cap_mb=25
    dp_overlap: bool = True
    stack: str = AUTO                          # the software stack (``specs.stack``): the profile's default

    def narrowed(self, values: dict[str, Any]) -> "SweepSpace":
        """This space with the given keys replaced (values already coerced)."""
        return replace(self, **values)


def coerce_values(key: str, raw: Any) -> Any:
    """One space entry -> a tuple of typed values (list keys) or one value (scalar keys)."""
    if key not in LIST_KEYS and key not in SCALAR_KEYS:
        raise SpecError(key, raw, f"not a sweepable plan key; allowed: {', '.join(LIST_KEYS + SCALAR_KEYS)}")
    if key in SCALAR_KEYS:
        if isinstance(raw, (list, tuple)):
            if len(raw) != 1:
                raise SpecError(key, raw, "a single value (a sweep holds it fixed)")
            raw = raw[0]
        return _one(key, raw)
    items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",") if isinstance(raw, str) else [raw]
    if not items:
        raise SpecError(key, raw, "a non-empty list of values")
    values = tuple(dict.fromkeys(_one(key, x) for x in items))
    return values


def _one(key: str, raw: Any) -> Any:
    if key in _INT_KEYS:
        text = str(raw).strip() if isinstance(raw, (int, str)) and not isinstance(raw, bool) else ""
        if not re.fullmatch(r"[0-9]{1,16}", text) or not (0 if key == "zero" else 1) <= int(text) <= MAX_INT:
            raise SpecError(key, raw, "a non-negative integer" if key == "zero" else "a positive integer up to 2**53")
        v = int(text)
        if key == "zero" and v not in (0, 1, 2, 3):
            raise SpecError(key, raw, "one of 0, 1, 2, 3")
        return v
    if key in _BOOL_KEYS:
        if isinstance(raw, bool):
            return raw
        w = str(raw).strip().lower()
        if w not in _BOOL_WORDS:
            raise SpecError(key, raw, "true or false")
        return _BOOL_WORDS[w]
    allowed = _WORD_KEYS[key]
    w = str(raw).strip()
    if w not in allowed:
        raise SpecError(key, raw, f"one of {', '.join(allowed)}")
    return w


def parse_fix(text: str | None) -> dict[str, Any]:
    """``"tp=8 zero=1 mbs=1,2"`` -> {"tp": (8,), "zero": (1,), "mbs": (1, 2)}."""
    out: dict[str, Any] = {}
    if not text:
        return out
    for token in text.split():
        if "=" not in token:
            raise SpecError("fix", token, "space-separated key=value pairs, e.g. 'tp=8 zero=1' (lists: mbs=1,2)")
        k, _, v = token.partition("=")
        if k.strip() in out:
            raise SpecError(k.strip(), v.strip(), f"given once; --fix sets {k.strip()} twice")
        out[k.strip()] = coerce_values(k.strip(), v.strip())
    return out


def load_space_file(path: str | Path) -> dict[str, Any]:
    """A YAML mapping ``key: value-or-list`` -> coerced values."""
    p = Path(path)
    if not path_exists(p):
        raise SpecError("space", str(path), "an existing YAML file mapping plan keys to lists of values")
    data = read_mapping(p, "space")
    return {str(k): coerce_values(str(k), v) for k, v in data.items()}


def build_space(space_file: str | Path | None = None, fix: str | None = None, gbs: int | None = None,
                base: SweepSpace | None = None) -> SweepSpace:
    """Defaults, then the space file, then ``--fix`` (which wins), then ``--gbs``."""
    values: dict[str, Any] = {}
    if space_file:
        values.update(load_space_file(space_file))
    values.update(parse_fix(fix))
    if gbs is not None:
        if "gbs" in values and values["gbs"] != (gbs,):
            raise SpecError("gbs", gbs, f"conflicts with gbs={list(values['gbs'])} from --space/--fix")
        values["gbs"] = (_one("gbs", gbs),)
    return (base or SweepSpace()).narrowed(values)

