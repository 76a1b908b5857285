"""The loop over plans (numba): each plan's rows of the cost tables in, its metrics out.

``fast.memory.plan_memory`` gives the peak memory (``costs.memory_by_stage``: the rules of
``costs.footprint`` over the moments of ``costs.peak_moments``), ``fast.timing.plan_time`` the step time
and where it goes. Both read only the table rows of the plan's keys, so a plan costs a few
microseconds and the loop runs at hundreds of thousands of plans per second on one core.
"""
from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from .memory import plan_memory
from .plans import PlanTable
from .split_timing import plan_time_split
from .timing import DPSync, PlanKnobs, plan_time


class PlanColumns(NamedTuple):
    """The plan columns the kernel reads (int64 arrays of ``fast.plans.PlanTable``: words as codes;
    ``m`` the microbatches per step)."""
    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    m: np.ndarray
    schedule: np.ndarray
    zero: np.ndarray
    offload: np.ndarray
    dp_impl: np.ndarray

    @classmethod
    def of(cls, plans: PlanTable) -> "PlanColumns":
        return cls(*(plans.microbatches if name == "m" else plans.cols[name] for name in cls._fields))


@numba.njit(cache=True)
def evaluate_all(out, plans, tables, sync):
    """Write every plan's metrics into its row of ``out``: ``plans`` a ``PlanColumns``, ``tables``
    a ``fast.tables.CostTables``, ``sync`` the sweep's ``DPSync``. The plans with a graph
    (``fast.dag.timed_by_graph``) are timed by it (``fast.split_timing``), the others by
    ``fast.timing``."""
    for i in range(plans.dp.shape[0]):
        dp, pp = plans.dp[i], plans.pp[i]
        off = tables.rank_offset[tables.rank_id[i]]
        ranks = tables.rank[off:off + pp]
        soff = tables.send_offset[tables.send_id[i]]
        send = tables.send[soff:soff + pp + 1]       # the sends, then S_HOLDS (``fast.ranks.send_rows``)
        moff = tables.moment_offset[tables.moment_id[i]]
        lrow, hrow = tables.layer[tables.layer_id[i]], tables.head[tables.head_id[i]]
        plan_memory(out[i], dp, pp, plans.vpp[i], plans.zero[i], plans.offload[i], lrow, hrow,
                    tables.dtype[tables.dtype_id[i]], ranks, tables.moments, tables.moment_start[moff:moff + pp],
                    tables.moment_count[moff:moff + pp], sync.bucket_bytes)
        knobs = PlanKnobs(dp, plans.tp[i], pp, plans.vpp[i], plans.m[i], plans.schedule[i], plans.zero[i],
                          plans.offload[i], plans.dp_impl[i])
        g = tables.graph_id[i]
        if tables.node_count[g] > 0:
            start = tables.node_start[g]
            plan_time_split(out[i], knobs, lrow, hrow, ranks, send, sync,
                            tables.nodes[start:start + tables.node_count[g]], tables.node_m[g])
        else:
            plan_time(out[i], knobs, lrow, hrow, ranks, send, sync)
