"""Enumerate every valid plan of a sweep space for a model on a cluster.

Candidates are built as a cartesian product in numpy and filtered with ``valid_mask``
(the specs' rule table on whole columns). Two pairings prune the product before the mask
without changing its result: (dp, tp, pp) only as factorisations of the device count, and
(schedule, vpp) / (zero, offload) only in the pairs that the rules reading just those two
fields accept (``plan_mask`` on the pairs alone).
"""
from __future__ import annotations

import math

import numpy as np

from parsim.fast.plans import COLUMNS, WORDS, PlanTable, valid_mask
from parsim.specs import ClusterSpec, ModelSpec, plan_mask
from parsim.specs.codes import OFF_OPT, OFF_OPT_PARAMS

from .space import SweepSpace


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order (pairs d, n/d up to sqrt(n): O(sqrt n))."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def default_gbs(cluster: ClusterSpec) -> int:
    """Global batch when none is given: one sequence per device."""
    return cluster.num_devices


def degree_triples(n: int, space: SweepSpace) -> list[tuple[int, int, int]]:
    """(dp, tp, pp) with dp*tp*pp = n, each in its list (None = any divisor)."""
    out = []
    for tp in divisors(n):
        if space.tp is not None and tp not in space.tp:
            continue
        for pp in divisors(n // tp):
            if space.pp is not None and pp not in space.pp:
                continue
            dp = n // (tp * pp)
            if space.dp is not None and dp not in space.dp:
                continue
            out.append((dp, tp, pp))
    return out


def space_values(cluster: ClusterSpec, space: SweepSpace) -> dict[str, tuple]:
    """Every key's candidate list with the device-count defaults filled in (for product_table)."""
    n = cluster.num_devices
    vals = {k: getattr(space, k) for k in COLUMNS}
    for k in ("dp", "tp", "pp"):
        if vals[k] is None:
            vals[k] = tuple(divisors(n))
    if vals["gbs"] is None:
        vals["gbs"] = (default_gbs(cluster),)
    return vals


def enumerate_plans(model: ModelSpec, cluster: ClusterSpec, space: SweepSpace, canonical: bool = True) -> PlanTable:
    """Every plan of the space that ``validate`` accepts; with ``canonical``, without the
    choices that change nothing (see ``redundant_mask``)."""
    table = candidate_plans(model, cluster, space)
    keep = valid_mask(model, cluster, table)
    if canonical:
        keep &= ~redundant_mask(table, space_values(cluster, space))
    return table.take(np.flatnonzero(keep))


def candidate_plans(model: ModelSpec, cluster: ClusterSpec, space: SweepSpace) -> PlanTable:
    """The product of the space's values that ``enumerate_plans`` filters with ``valid_mask``:
    (dp, tp, pp) as factorisations of the device count, (schedule, vpp) and (zero, offload) as
    accepted pairs (``_accepted_pairs``), every other key free."""
    vals = space_values(cluster, space)
    triples = np.array(degree_triples(cluster.num_devices, space), dtype=np.int64).reshape(-1, 3)
    sched_vpp_a = _accepted_pairs(model, cluster, "schedule", "vpp", vals)
    zero_off_a = _accepted_pairs(model, cluster, "zero", "offload", vals)
    axes = [np.arange(len(triples)), np.arange(len(sched_vpp_a)), _codes("mbs", vals), _codes("gbs", vals),
            np.arange(len(zero_off_a)), _codes("recompute", vals), _codes("sp", vals), _codes("dtype", vals),
            _codes("dp_impl", vals)]
    grids = [g.ravel() for g in np.meshgrid(*axes, indexing="ij")]
    tri, sv, zo = triples[grids[0]], sched_vpp_a[grids[1]], zero_off_a[grids[4]]
    cols = {"dp": tri[:, 0], "tp": tri[:, 1], "pp": tri[:, 2], "vpp": sv[:, 1], "mbs": grids[2], "gbs": grids[3],
            "schedule": sv[:, 0], "zero": zo[:, 0], "offload": zo[:, 1], "recompute": grids[5], "sp": grids[6],
            "dtype": grids[7], "dp_impl": grids[8]}
    return PlanTable({k: np.ascontiguousarray(cols[k], dtype=np.int64) for k in COLUMNS},
                     dp_bucket_bytes=space.dp_bucket_bytes, dp_overlap=space.dp_overlap, stack=space.stack)


def count_candidates(model: ModelSpec, cluster: ClusterSpec, space: SweepSpace) -> int:
    """How many plans ``candidate_plans`` would build (without building them)."""
    vals = space_values(cluster, space)
    n = len(degree_triples(cluster.num_devices, space))
    n *= len(_accepted_pairs(model, cluster, "schedule", "vpp", vals))
    n *= len(_accepted_pairs(model, cluster, "zero", "offload", vals))
    for key in ("mbs", "gbs", "recompute", "sp", "dtype", "dp_impl"):
        n *= len(vals[key])
    return n


def _accepted_pairs(model: ModelSpec, cluster: ClusterSpec, a: str, b: str, vals: dict[str, tuple]) -> np.ndarray:
    """(a, b) code pairs of the space, in product order, that every rule reading only a and b accepts."""
    ca, cb = (g.ravel() for g in np.meshgrid(_codes(a, vals), _codes(b, vals), indexing="ij"))
    keep = plan_mask(model, cluster, {a: ca, b: cb}, partial=True)
    return np.stack([ca[keep], cb[keep]], axis=1).reshape(-1, 2)


def redundant_mask(table: PlanTable, vals: dict[str, tuple]) -> np.ndarray:
    """Plans identical to a simpler plan of the same space:

    * pp = 1: every schedule but ``1f1b`` (one stage: no pipeline to schedule; GPipe would
      only keep more activations alive)
    * looped BFS with one stage per rank: GPipe (all forwards, then all backwards; torch 2.13
      runs the backwards in reverse microbatch order, the same time and memory)
    * dp = 1: ZeRO stages above the least the offload needs (nothing to shard over one rank)
    """
    out = np.zeros(len(table), dtype=bool)
    one_f_one_b = WORDS["schedule"].index("1f1b")
    if "1f1b" in vals["schedule"]:
        out |= (table["pp"] == 1) & (table["schedule"] != one_f_one_b)
    if "gpipe" in vals["schedule"]:
        out |= (table["schedule"] == WORDS["schedule"].index("looped-bfs")) & (table["vpp"] == 1)
    least_zero = np.select([table["offload"] == OFF_OPT_PARAMS, table["offload"] == OFF_OPT], [3, 1], 0)
    needed_in_space = np.isin(least_zero, np.array(vals["zero"]))
    out |= (table["dp"] == 1) & (table["zero"] != least_zero) & needed_in_space
    return out


def _codes(key: str, vals: dict[str, tuple]) -> np.ndarray:
    if key in WORDS:
        return np.array([WORDS[key].index(v) for v in vals[key]], dtype=np.int64)
    return np.array([int(v) for v in vals[key]], dtype=np.int64)
