"""The loop over plans (numba): each plan's rows of the cost tables in, its metrics out.

``fast.memory.plan_memory`` gives the peak memory (``costs.memory_by_stage``: the rules of
``costs.footprint`` over the moments of ``costs.peak_moments``), ``fast.timing.plan_time`` the step time
and where it goes. Both read only the table rows of the plan's keys, so a plan costs a few
microseconds and the loop runs at hundreds of thousands of plans per second on one core.
"""
from __future__ import annotations

import numba

from .codes import ZB_H1
from .memory import plan_memory
from .split_timing import plan_time_split
from .timing import DPSync, PlanKnobs, plan_time


@numba.njit(cache=True)
def evaluate_all(out, dp, tp, pp, vpp, mbs, gbs, schedule, zero, offload, recompute, dp_impl,
                 layer, head, dtype, layer_id, head_id, dtype_id, rank, rank_offset, rank_id,
                 moments, moment_start, moment_count, moment_offset, moment_id, bucket_bytes, dp_overlap, k,
                 nodes, node_start, node_count, node_m, graph_id):
    """Every plan's memory and time; the schedules from zb-h1 on (codes ``specs.codes``) are timed
    by their action graph (``fast.split_timing``), the others by ``fast.timing``."""
    for i in range(dp.shape[0]):
        off = rank_offset[rank_id[i]]
        ranks = rank[off:off + pp[i]]
        moff = moment_offset[moment_id[i]]
        m = gbs[i] // (dp[i] * mbs[i])
        lrow, hrow, drow = layer[layer_id[i]], head[head_id[i]], dtype[dtype_id[i]]
        plan_memory(out[i], dp[i], pp[i], vpp[i], zero[i], offload[i], lrow, hrow, drow, ranks, moments,
                    moment_start[moff:moff + pp[i]], moment_count[moff:moff + pp[i]], bucket_bytes)
        knobs = PlanKnobs(dp[i], tp[i], pp[i], vpp[i], m, schedule[i], zero[i], offload[i], dp_impl[i])
        if schedule[i] >= ZB_H1:
            g = graph_id[i]
            plan_time_split(out[i], knobs, lrow, hrow, drow, ranks, DPSync(bucket_bytes, dp_overlap), k,
                            nodes[node_start[g]:node_start[g] + node_count[g]], node_m[g])
        else:
            plan_time(out[i], knobs, lrow, hrow, drow, ranks, DPSync(bucket_bytes, dp_overlap), k)
