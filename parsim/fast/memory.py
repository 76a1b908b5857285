"""Peak memory of one plan (numba): ``parsim.costs.memory_by_stage``, rank by rank.

Model states per rank are sharded by ZeRO (Rajbhandari et al. 2020 Sec. 5) and moved to the
host by ZeRO-Offload (Ren et al. 2021), as ``costs.memory_by_stage`` does to the byte.
Activations: per microbatch bytes (Korthikanti et al. 2022 Table 2, ``costs.activations``)
times the microbatches in flight (``costs.inflight_microbatches``): 1 (naive), m (GPipe),
min(p - r, m) (1F1B). For the interleaved schedule the chunks a rank holds are counted one by
one (``fast.inflight``): the first and last virtual stages also keep the embedding's and the
output head's activations, so which chunks are in flight matters, not just how many. This is
what the SimPy engine's memory timeline holds; tests/test_fast_memory.py holds the fast path
equal to ``memory_by_stage`` and tests/test_fast_vs_sim.py to the engine.
"""
from __future__ import annotations

import numba

from .codes import (GPIPE, INTERLEAVED, NAIVE, O_ACT, O_GRADS, O_OPT, O_OTHER, O_PARAMS, O_PEAK, O_PEAK_STAGE,
                    OFF_NONE, OFF_OPT_PARAMS, ONE_F_ONE_B)
from .tables import (D_GRAD, D_OPT, D_PARAM, H_EMB_ACT, H_HEAD_ACT, H_LOGITS_GRAD, H_SBH, H_TIED, H_VOCAB_GRAD,
                     L_ACT, L_ACT_FULL, L_ACT_NONE, L_PARAMS, L_WORK, R_CHUNK, R_LAYERS, R_PARAMS)


@numba.njit(cache=True)
def inflight(schedule: int, pp: int, m: int, r: int, vpp: int) -> float:
    """``costs.inflight_microbatches`` (Huang 2019; Narayanan 2021 Sec. 2.2.1 / Megatron-LM warm-up)."""
    if schedule == NAIVE:
        return 1.0
    if schedule == GPIPE:
        return float(m)
    if schedule == ONE_F_ONE_B:
        return float(min(pp - r, m))
    chunks = min((pp - r - 1) * 2 + (vpp - 1) * pp + 1, m * vpp)
    return chunks / vpp


@numba.njit(cache=True)
def warmup_chunks(pp: int, m: int, vpp: int, r: int) -> float:
    """Chunks a rank holds at the end of its interleaved warm-up: its warm-up forwards + 1
    (``schedules.warmup_forwards``; all of them when m = pp), at most all m v."""
    total = m * vpp
    if m == pp:
        return float(total)
    return float(min(2 * (pp - r - 1) + (vpp - 1) * pp + 1, total))


@numba.njit(cache=True)
def plan_memory(out, dp, pp, vpp, m, schedule, zero, offload, full_rc, lrow, hrow, drow, ranks,
                moments, mstart, mcount, bucket_bytes):
    """Write the peak (bytes), its pipeline rank and its breakdown into ``out``."""
    lp = lrow[L_PARAMS]
    pb, gb, ob = drow[D_PARAM], drow[D_GRAD], drow[D_OPT]
    last = pp - 1
    rc_extra = lrow[L_ACT_NONE] - lrow[L_ACT_FULL] if full_rc else 0.0
    peak = -1.0
    for r in range(pp):
        L = ranks[r, R_LAYERS]
        n = ranks[r, R_PARAMS]
        params = n * pb / (dp if zero >= 3 else 1)
        grads = n * gb / (dp if zero >= 2 else 1)
        opt = n * ob / (dp if zero >= 1 else 1)
        other = 0.0
        if offload != OFF_NONE:
            opt = 0.0
            grads = 0.0
            other += bucket_bytes
        if offload == OFF_OPT_PARAMS:
            params = 0.0
        if zero >= 3 or offload == OFF_OPT_PARAMS:
            other += 2 * lp * pb          # the current and the prefetched layer, gathered
        working = rank_working(r, last, vpp, lrow, hrow, ranks)
        if schedule == INTERLEAVED and mcount[r] > 0:
            act, transient = _interleaved_peak(r, last, vpp, lrow, hrow, ranks, moments, mstart[r], mcount[r],
                                               rc_extra, working)
            other += transient
        elif schedule == INTERLEAVED:
            # equal chunks (none holds the embedding or the head): the most chunks in flight,
            # each 1/v of the rank's layers and the output it sent
            act = (L / vpp * lrow[L_ACT] + hrow[H_SBH]) * warmup_chunks(pp, m, vpp, r)
            other += working + (rc_extra if L > 0 else 0.0)
        else:
            fl = inflight(schedule, pp, m, r, vpp)
            act = L * lrow[L_ACT] * fl
            other += working + (rc_extra if L > 0 else 0.0)
            if r == 0:
                act += hrow[H_EMB_ACT] * fl
            if r == last:
                act += hrow[H_HEAD_ACT] * (m if schedule == GPIPE else 1)
            else:
                act += hrow[H_SBH] * fl
        total = params + grads + opt + act + other
        if total > peak:
            peak = total
            out[O_PEAK_STAGE] = r
            out[O_PARAMS], out[O_GRADS], out[O_OPT], out[O_ACT], out[O_OTHER] = params, grads, opt, act, other
    out[O_PEAK] = peak


@numba.njit(cache=True)
def _chunk_stash(r, c, last, vpp, lrow, hrow, ranks):
    """Bytes one microbatch stores in chunk c of rank r (its layers; the embedding's on virtual
    stage 0, the head's on the last), without the output it sends."""
    chunk = ranks[r, R_CHUNK + c] * lrow[L_ACT]
    if r == 0 and c == 0:
        chunk += hrow[H_EMB_ACT]
    if r == last and c == vpp - 1:
        chunk += hrow[H_HEAD_ACT]
    return chunk


@numba.njit(cache=True)
def rank_working(r, last, vpp, lrow, hrow, ranks):
    """``costs.memory.rank_backward_working``: the largest backward working set of the rank's
    chunks (``costs.activations.backward_working_bytes``)."""
    best = 0.0
    for c in range(vpp):
        first_v = r == 0 and c == 0
        last_v = r == last and c == vpp - 1
        w = lrow[L_WORK]
        if last_v:
            tied = hrow[H_VOCAB_GRAD] if (hrow[H_TIED] > 0 and first_v) else 0.0
            w = max(w - hrow[H_HEAD_ACT] + tied, hrow[H_SBH] + hrow[H_VOCAB_GRAD], hrow[H_LOGITS_GRAD])
        if first_v:
            k = 3.0 if (hrow[H_TIED] > 0 and last_v) else 1.0
            w = max(w, k * hrow[H_VOCAB_GRAD] + (0.0 if last_v else 2 * hrow[H_SBH])
                    - _chunk_stash(r, c, last, vpp, lrow, hrow, ranks))
        best = max(best, w)
    return best


@numba.njit(cache=True)
def _interleaved_peak(r, last, vpp, lrow, hrow, ranks, moments, start, count, rc_extra, working):
    """(activations, backward transient) at the rank's heaviest moment: chunk c holds
    layers(r, c) x per-layer bytes, plus the embedding's on virtual stage 0 (rank 0, chunk 0),
    the head's on the last one (last rank, chunk v - 1) and the sent output on the others."""
    best_act, best_extra, best = 0.0, 0.0, -1.0
    for i in range(start, start + count):
        act = 0.0
        for c in range(vpp):
            held = moments[i, 1 + c]
            chunk = _chunk_stash(r, c, last, vpp, lrow, hrow, ranks)
            if not (r == last and c == vpp - 1):
                chunk += hrow[H_SBH]
            act += held * chunk
        extra = moments[i, 0] * (rc_extra + working)
        if act + extra > best:
            best, best_act, best_extra = act + extra, act, extra
    return best_act, best_extra
