"""A column table of plans (one numpy array per plan key) and its validity mask.

``valid_mask`` is the specs' rule table evaluated on whole columns at once
(``parsim.specs.plan_mask``: the rules ``validate`` applies to one plan, accepting exactly the
same plans; tests/test_sweep_enumeration.py checks this plan by plan), so a sweep never calls
the per-plan validator on hundreds of thousands of candidates. Words (schedule, offload, ...)
are stored as their codes (``parsim.specs.codes``: their index in the tuple that lists them).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from parsim.specs import OFFLOADS, RECOMPUTES, SCHEDULES, ClusterSpec, ModelSpec, Plan, SpecError, plan_mask
from parsim.specs.codes import OFF_NONE, WORDS, code
from parsim.specs.plan import DEFAULT_DP_BUCKET_BYTES, DP_IMPLS, DTYPES
from parsim.specs.stack import AUTO

COLUMNS = ("dp", "tp", "pp", "vpp", "mbs", "gbs", "schedule", "zero", "offload", "recompute", "sp", "dtype",
           "dp_impl")
# Plan fields the fast path does not model; a plan using them cannot enter a PlanTable
_UNSUPPORTED_DEFAULTS = {"partition": None, "recompute_layers": None, "shifted_critical_path": False,
                         "tp_overlap": "none"}


def _decoded(key: str, codes: list[int]) -> list:
    """Plan-level values of column ``key`` from its integer codes: words for word columns,
    booleans for ``sp``, the integers themselves otherwise."""
    if key in WORDS:
        return [WORDS[key][c] for c in codes]
    if key == "sp":
        return [bool(c) for c in codes]
    return codes


@dataclass
class PlanTable:
    """Plans as columns. ``cols[key]`` is an int64 array (words and booleans as codes)."""

    cols: dict[str, np.ndarray]
    dp_bucket_bytes: int = DEFAULT_DP_BUCKET_BYTES
    dp_overlap: bool = True
    stack: str = AUTO                  # one software stack for the whole table (``specs.stack``)

    def __len__(self) -> int:
        return int(self.cols["dp"].shape[0])

    def __getitem__(self, key: str) -> np.ndarray:
        return self.cols[key]

    @property
    def microbatches(self) -> np.ndarray:
        return self.cols["gbs"] // (self.cols["dp"] * self.cols["mbs"])

    def take(self, index: np.ndarray) -> "PlanTable":
        return PlanTable({k: v[index] for k, v in self.cols.items()}, self.dp_bucket_bytes, self.dp_overlap, self.stack)

    def value(self, key: str, i: int):
        """The plan-level value (word, bool or int) of column ``key`` at row ``i``."""
        return _decoded(key, [int(self.cols[key][i])])[0]

    def plan(self, i: int) -> Plan:
        return self._plan_of(self.value(k, i) for k in COLUMNS)

    def plans(self) -> Iterator[Plan]:
        """``plan(i)`` of every row in order, each column converted to plan values once."""
        for row in zip(*(_decoded(k, self.cols[k].tolist()) for k in COLUMNS)):
            yield self._plan_of(row)

    def _plan_of(self, values: Iterable) -> Plan:
        """The Plan of one row's plan-level values, in ``COLUMNS`` order."""
        return Plan(**dict(zip(COLUMNS, values)), dp_bucket_bytes=self.dp_bucket_bytes, dp_overlap=self.dp_overlap,
                    stack=self.stack)

    def plan_strings(self) -> list[str]:
        """``Plan.to_string()`` of every row, built without constructing Plan objects."""
        c = {k: v.tolist() for k, v in self.cols.items()}
        d = Plan()
        tail = ""
        if self.dp_bucket_bytes != d.dp_bucket_bytes:
            tail += f" dp_bucket_bytes={self.dp_bucket_bytes}"
        if self.dp_overlap != d.dp_overlap:
            tail += f" dp_overlap={'true' if self.dp_overlap else 'false'}"
        stack = f" stack={self.stack}" if self.stack != d.stack else ""
        out = []
        for i in range(len(self)):
            s = f"dp={c['dp'][i]} tp={c['tp'][i]} pp={c['pp'][i]}"
            if c["vpp"][i] != 1:
                s += f" vpp={c['vpp'][i]}"
            s += f" mbs={c['mbs'][i]} gbs={c['gbs'][i]} schedule={SCHEDULES[c['schedule'][i]]}"
            if c["zero"][i]:
                s += f" zero={c['zero'][i]}"
            if c["offload"][i] != OFF_NONE:
                s += f" offload={OFFLOADS[c['offload'][i]]}"
            if RECOMPUTES[c["recompute"][i]] != d.recompute:
                s += f" recompute={RECOMPUTES[c['recompute'][i]]}"
            if c["sp"][i]:
                s += " sp=true"
            if DTYPES[c["dtype"][i]] != d.dtype:
                s += f" dtype={DTYPES[c['dtype'][i]]}"
            s += tail
            if DP_IMPLS[c["dp_impl"][i]] != d.dp_impl:
                s += f" dp_impl={DP_IMPLS[c['dp_impl'][i]]}"
            out.append(s + stack)
        return out

    def decoded(self) -> dict[str, list]:
        """Columns with words and booleans decoded (for tables and CSV)."""
        out: dict[str, list] = {}
        for k in COLUMNS:
            v = self.cols[k]
            if k in WORDS:
                out[k] = [WORDS[k][x] for x in v.tolist()]
            elif k == "sp":
                out[k] = v.astype(bool).tolist()
            else:
                out[k] = v.tolist()
        return out

    @classmethod
    def from_plans(cls, plans: list[Plan]) -> "PlanTable":
        """Plans -> table. All must share dp_bucket_bytes/dp_overlap/stack and use only fast-path keys."""
        if not plans:
            return cls({k: np.zeros(0, dtype=np.int64) for k in COLUMNS})
        for p in plans:
            for key, default in _UNSUPPORTED_DEFAULTS.items():
                if getattr(p, key) != default:
                    raise SpecError(key, getattr(p, key), f"the default ({default}) in a sweep: the fast path does not model it")
        first = plans[0]
        for p in plans:
            if (p.dp_bucket_bytes, p.dp_overlap, p.stack) != (first.dp_bucket_bytes, first.dp_overlap, first.stack):
                raise SpecError("dp_bucket_bytes/dp_overlap/stack", f"{p.dp_bucket_bytes}/{p.dp_overlap}/{p.stack}",
                                "one value for all plans of a table")
        cols = {}
        for k in COLUMNS:
            if k in WORDS:
                cols[k] = np.array([WORDS[k].index(getattr(p, k)) for p in plans], dtype=np.int64)
            else:
                cols[k] = np.array([int(getattr(p, k)) for p in plans], dtype=np.int64)
        return cls(cols, first.dp_bucket_bytes, first.dp_overlap, first.stack)


def valid_mask(model: ModelSpec, cluster: ClusterSpec, t: PlanTable) -> np.ndarray:
    """True where ``parsim.specs.validate`` accepts the plan: the specs' rule table on the
    columns, the fields a table does not hold at the values every one of its plans has."""
    fixed = {k: code(k, v) if k in WORDS else v for k, v in _UNSUPPORTED_DEFAULTS.items()}
    return plan_mask(model, cluster, {**t.cols, **fixed, "dp_bucket_bytes": t.dp_bucket_bytes,
                                      "dp_overlap": t.dp_overlap})


def product_table(values: dict[str, tuple], dp_bucket_bytes: int = DEFAULT_DP_BUCKET_BYTES,
                  dp_overlap: bool = True, stack: str = AUTO) -> PlanTable:
    """The full cartesian product of per-key value lists (words given as words)."""
    coded = []
    for k in COLUMNS:
        vals = values[k]
        if k in WORDS:
            coded.append(np.array([WORDS[k].index(v) for v in vals], dtype=np.int64))
        else:
            coded.append(np.array([int(v) for v in vals], dtype=np.int64))
    grids = np.meshgrid(*coded, indexing="ij")
    return PlanTable({k: g.ravel() for k, g in zip(COLUMNS, grids)}, dp_bucket_bytes, dp_overlap, stack)


def concat(tables: list[PlanTable]) -> PlanTable:
    if not tables:
        return PlanTable({k: np.zeros(0, dtype=np.int64) for k in COLUMNS})
    first = tables[0]
    return PlanTable({k: np.concatenate([t.cols[k] for t in tables]) for k in COLUMNS},
                     first.dp_bucket_bytes, first.dp_overlap, first.stack)
