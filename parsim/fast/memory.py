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
at each candidate moment (``fast.inflight``, from ``costs.peak_moments``), and the optimizer
step's temporaries (``footprint.optimizer_temporaries``), the heaviest one wins.
tests/test_fast_memory.py holds the fast path equal to ``memory_by_stage`` and
tests/test_fast_vs_sim.py to the SimPy engine.
"""
from __future__ import annotations

import numba

from .codes import O_ACT, O_GRADS, O_OPT, O_OTHER, O_PARAMS, O_PEAK, O_PEAK_STAGE, OFF_NONE, OFF_OPT_PARAMS
from .inflight import KIND_FIRST_I, KIND_I, KIND_W
from .ranks import R_CHUNK, R_LAST, R_OWNED, R_PARAMS, R_WINDOW, R_WINDOW_OWNED
from .rules import (backward_working, gathered_layers, held_bytes, input_grad_end, model_states, offload_staging,
                    optimizer_step_peaks, optimizer_temporaries, split_kept, stack_state_bytes, stash_bytes,
                    weight_working)
from .tables import (D_FP32_SHARDS, D_GATHERED_LAYERS, D_GRAD, D_GRAD_COPY, D_MAX_LIVE, D_OPT, D_PARAM,
                     D_ZERO1_WHOLE, H_EMB_ACT, H_EMB_GRAD, H_HEAD_ACT, H_HEAD_KEPT, H_LOGITS_GRAD, H_LOSS_FWD,
                     H_LOSS_SAVED, H_SBH,
                     H_TIED, H_VOCAB_GRAD, L_ACT, L_FWD_COPIES, L_I_ATTENTION, L_KEPT, L_PARAMS, L_TRANSIENT, L_W_RESIDUE,
                     L_W_RESIDUE_TOP, L_WORK, L_WORK_I, L_WORK_W)


@numba.njit(cache=True)
def plan_memory(out, dp, pp, vpp, zero, offload, lrow, hrow, drow, ranks, moments, mstart, mcount, bucket_bytes):
    """Write the peak (bytes), its pipeline rank and its breakdown into ``out``. A moment row
    holds per chunk the microbatches held, then (split backward) those holding their output
    gradients, then the kind of pass starting (its working set; ``fast.inflight.KIND_OF``)."""
    offload_optimizer = offload != OFF_NONE
    offload_params = offload == OFF_OPT_PARAMS
    gathered = gathered_layers(lrow[L_PARAMS], drow[D_PARAM], zero, offload_params, drow[D_GATHERED_LAYERS],
                               drow[D_MAX_LIVE])
    pb, gb, ob = stack_state_bytes(drow[D_PARAM], drow[D_GRAD], drow[D_OPT], zero, drow[D_FP32_SHARDS] > 0,
                                   drow[D_GRAD_COPY])
    width = (moments.shape[1] - 2) // 2
    peak = -1.0
    for r in range(pp):
        params, grads, opt = model_states(ranks[r, R_PARAMS], pb, gb, ob, dp, zero,
                                          offload_optimizer, offload_params,
                                          ranks[r, R_OWNED] if drow[D_ZERO1_WHOLE] > 0 else -1.0)
        staging = offload_staging(bucket_bytes, offload_optimizer)
        act, best, extra = 0.0, -1.0, 0.0
        for i in range(mstart[r], mstart[r] + mcount[r]):
            held = 0.0
            for c in range(vpp):
                if moments[i, c] > 0:
                    held += moments[i, c] * _chunk_held(r, c, pp, vpp, lrow, hrow, ranks)
            for c in range(vpp):
                if moments[i, width + c] > 0:
                    held += moments[i, width + c] * _chunk_kept(r, c, lrow, hrow, ranks)
            kind, c = moments[i, 2 * width], int(moments[i, 2 * width + 1])     # the pass starting, its chunk
            if kind == KIND_I:
                x = max(_chunk_working(r, c, pp, vpp, lrow, hrow, ranks, True), _chunk_input_end(r, c, lrow, hrow, ranks))
            elif kind == KIND_W:
                x = _chunk_w_residue(c, lrow, ranks[r]) + _chunk_weight_working(r, c, lrow, hrow, ranks)
            elif kind == KIND_FIRST_I:
                x = 0.0                  # the first stage's I runs nothing
            else:                        # a B, or the first stage's W (its whole backward)
                x = _chunk_working(r, c, pp, vpp, lrow, hrow, ranks, False)
            if held + x > best:
                best, act, extra = held + x, held, x
        extra += gathered                # held during every action, not by the optimizer step
        temporaries = optimizer_temporaries(ranks[r, R_WINDOW], dp, zero, drow[D_ZERO1_WHOLE] > 0, offload_optimizer,
                                            ranks[r, R_WINDOW_OWNED])
        if optimizer_step_peaks(act + extra, temporaries, 0.0):    # (FSDP2: ``evaluate._fsdp2_memory``)
            act, extra = 0.0, temporaries
        other = staging + extra
        total = params + grads + opt + act + other
        if total > peak:
            peak = total
            out[O_PEAK_STAGE] = r
            out[O_PARAMS], out[O_GRADS], out[O_OPT], out[O_ACT], out[O_OTHER] = params, grads, opt, act, other
    out[O_PEAK] = peak


@numba.njit(cache=True)
def _chunk_stash(r, c, pp, vpp, lrow, hrow, ranks):
    """``footprint.stash_bytes`` of chunk c of rank r (stage 0 is rank 0's chunk 0; the last
    stage the chunk ``R_LAST`` names)."""
    return stash_bytes(ranks[r, R_CHUNK + c] * lrow[L_ACT], r == 0 and c == 0, ranks[r, R_LAST] == c,
                       hrow[H_EMB_ACT], hrow[H_HEAD_ACT])


@numba.njit(cache=True)
def _chunk_held(r, c, pp, vpp, lrow, hrow, ranks):
    """``footprint.held_bytes`` of chunk c of rank r."""
    return held_bytes(_chunk_stash(r, c, pp, vpp, lrow, hrow, ranks), ranks[r, R_LAST] == c, hrow[H_SBH])


@numba.njit(cache=True)
def _chunk_kept(r, c, lrow, hrow, ranks):
    """What chunk c of rank r keeps from an I to its W (``costs.memory``'s ``kept``,
    ``footprint.split_kept``; none on the first stage, which runs its whole backward as W)."""
    if r == 0 and c == 0:
        return 0.0
    return split_kept(ranks[r, R_CHUNK + c] * lrow[L_KEPT], hrow[H_HEAD_KEPT], hrow[H_LOSS_SAVED], hrow[H_SBH],
                      hrow[H_SBH], ranks[r, R_LAST] == c)


@numba.njit(cache=True)
def _chunk_input_end(r, c, lrow, hrow, ranks):
    """``footprint.input_grad_end`` of chunk c of rank r (not the first stage), as
    ``costs.memory.stage_footprints`` prices a stage's I."""
    return input_grad_end(ranks[r, R_CHUNK + c] * lrow[L_KEPT], hrow[H_HEAD_KEPT], hrow[H_SBH], ranks[r, R_LAST] == c,
                          lrow[L_I_ATTENTION])


@numba.njit(cache=True)
def _chunk_working(r, c, pp, vpp, lrow, hrow, ranks, input_only):
    """``costs.memory._stage_working``: ``footprint.backward_working`` of chunk c of rank r, the
    recompute transient on the layer phase (``input_only``: an I's, without the weight gradients)."""
    wg = 0.0 if input_only else 1.0
    last = ranks[r, R_LAST] == c
    # the forward's end: the chunk's recomputed layers' weight copies, the loss's on the last
    forward = ranks[r, R_CHUNK + c] * lrow[L_FWD_COPIES] + (hrow[H_LOSS_FWD] if last else 0.0)
    return backward_working(lrow[L_WORK_I] if input_only else lrow[L_WORK], hrow[H_SBH], hrow[H_HEAD_ACT],
                            wg * hrow[H_VOCAB_GRAD], wg * hrow[H_EMB_GRAD], hrow[H_LOGITS_GRAD], hrow[H_TIED] > 0,
                            r == 0 and c == 0, last, _chunk_stash(r, c, pp, vpp, lrow, hrow, ranks),
                            lrow[L_TRANSIENT], forward)


@numba.njit(cache=True)
def _chunk_w_residue(c, lrow, rank_row):
    """What W's re-runs of chunk c's recomputed layers leave until it ends
    (``costs.split_backward.w_recompute_residue``; every fast-path chunk holds a layer:
    k L_W_RESIDUE + L_W_RESIDUE_TOP, both 0 unless full)."""
    return rank_row[R_CHUNK + c] * lrow[L_W_RESIDUE] + lrow[L_W_RESIDUE_TOP]


@numba.njit(cache=True)
def _chunk_weight_working(r, c, lrow, hrow, ranks):
    """The weight-gradient working set of chunk c of rank r (``costs.memory._stage_weight_working``,
    ``footprint.weight_working``; not the first stage, whose W is its whole backward)."""
    return weight_working(lrow[L_WORK_W], hrow[H_VOCAB_GRAD], ranks[r, R_CHUNK + c] * lrow[L_KEPT],
                          ranks[r, R_LAST] == c)
