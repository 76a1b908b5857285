"""Peak memory of one plan (numba): ``parsim.costs.memory_by_stage``, rank by rank.

The rules are ``costs.footprint``'s own functions, compiled by numba (``fast.rules``): a rank's model
states and staging bytes (ZeRO sharding, ZeRO-Offload; Rajbhandari et al. 2020, Ren et al.
2021), the gathered ZeRO-3 layers, each chunk's held bytes (Korthikanti et al. 2022 Table 2
stash, the embedding's and head's, the sent output) and the backward's working set and
recompute transient. They run per plan because their inputs pair a layer shape with a rank
layout (about 10^4 pairs in a sweep, each with pp x vpp chunks): the cost tables hold each
input once per key, priced by ``costs`` (``fast.tables``), and combining them here costs
nanoseconds where tabulating every pair in Python would cost more than the whole sweep. The
kernel itself only adds up: each chunk's held bytes times the microbatches the schedule holds
at each candidate moment (``fast.inflight``, from ``costs.peak_moments``), the heaviest one
wins. tests/test_fast_memory.py holds the fast path equal to ``memory_by_stage`` and
tests/test_fast_vs_sim.py to the SimPy engine.
"""
from __future__ import annotations

import numba

from .codes import O_ACT, O_GRADS, O_OPT, O_OTHER, O_PARAMS, O_PEAK, O_PEAK_STAGE, OFF_NONE, OFF_OPT_PARAMS
from .ranks import R_CHUNK, R_PARAMS
from .rules import (backward_bytes, backward_working, gathered_layers, held_bytes, model_states, offload_staging,
                    stack_state_bytes, stash_bytes)
from .tables import (D_FP32_SHARDS, D_GATHERED_LAYERS, D_GRAD, D_GRAD_COPY, D_MAX_LIVE, D_OPT, D_PARAM, H_EMB_ACT,
                     H_HEAD_ACT, H_LOGITS_GRAD, H_SBH, H_TIED, H_VOCAB_GRAD, L_ACT, L_PARAMS, L_TRANSIENT, L_WORK)


@numba.njit(cache=True)
def plan_memory(out, dp, pp, vpp, zero, offload, lrow, hrow, drow, ranks, moments, mstart, mcount, bucket_bytes):
    """Write the peak (bytes), its pipeline rank and its breakdown into ``out``."""
    offload_optimizer = offload != OFF_NONE
    offload_params = offload == OFF_OPT_PARAMS
    gathered = gathered_layers(lrow[L_PARAMS], drow[D_PARAM], zero, offload_params, drow[D_GATHERED_LAYERS],
                               drow[D_MAX_LIVE])
    pb, gb, ob = stack_state_bytes(drow[D_PARAM], drow[D_GRAD], drow[D_OPT], zero, drow[D_FP32_SHARDS] > 0,
                                   drow[D_GRAD_COPY])
    peak = -1.0
    for r in range(pp):
        params, grads, opt = model_states(ranks[r, R_PARAMS], pb, gb, ob, dp, zero,
                                          offload_optimizer, offload_params)
        other = offload_staging(bucket_bytes, offload_optimizer) + gathered
        extra = backward_bytes(lrow[L_TRANSIENT], 0.0, _rank_working(r, pp, vpp, lrow, hrow, ranks))
        act, best = 0.0, -1.0
        for i in range(mstart[r], mstart[r] + mcount[r]):
            held = 0.0
            for c in range(vpp):
                if moments[i, c] > 0:
                    held += moments[i, c] * _chunk_held(r, c, pp, vpp, lrow, hrow, ranks)
            if held + extra > best:
                best, act = held + extra, held
        other += extra
        total = params + grads + opt + act + other
        if total > peak:
            peak = total
            out[O_PEAK_STAGE] = r
            out[O_PARAMS], out[O_GRADS], out[O_OPT], out[O_ACT], out[O_OTHER] = params, grads, opt, act, other
    out[O_PEAK] = peak


@numba.njit(cache=True)
def _chunk_stash(r, c, pp, vpp, lrow, hrow, ranks):
    """``footprint.stash_bytes`` of chunk c of rank r (virtual stage c pp + r)."""
    return stash_bytes(ranks[r, R_CHUNK + c] * lrow[L_ACT], r == 0 and c == 0, r == pp - 1 and c == vpp - 1,
                       hrow[H_EMB_ACT], hrow[H_HEAD_ACT])


@numba.njit(cache=True)
def _chunk_held(r, c, pp, vpp, lrow, hrow, ranks):
    """``footprint.held_bytes`` of chunk c of rank r."""
    return held_bytes(_chunk_stash(r, c, pp, vpp, lrow, hrow, ranks), r == pp - 1 and c == vpp - 1, hrow[H_SBH])


@numba.njit(cache=True)
def _rank_working(r, pp, vpp, lrow, hrow, ranks):
    """``costs.memory.rank_backward_working``: the largest ``footprint.backward_working`` of the
    rank's chunks."""
    best = 0.0
    for c in range(vpp):
        w = backward_working(lrow[L_WORK], hrow[H_SBH], hrow[H_HEAD_ACT], hrow[H_VOCAB_GRAD], hrow[H_LOGITS_GRAD],
                             hrow[H_TIED] > 0, r == 0 and c == 0, r == pp - 1 and c == vpp - 1,
                             _chunk_stash(r, c, pp, vpp, lrow, hrow, ranks))
        best = max(best, w)
    return best
