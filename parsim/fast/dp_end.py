"""The data-parallel end of a step in the fast path: when each pipeline rank's gradients are
reduced and what DP traffic follows its optimizer step (``fast.timing.plan_time`` and
``fast.split_timing`` call these with the plan's terms).

* DDP buckets (PyTorch DDP, Li et al. 2020 Sec. 3.2.3): all-reduced (ZeRO-1: reduce-scattered,
  the parameters all-gathered after the step), chunk by chunk as the last backward completes
  them (``_sync_end``), or after it where the sweep does not overlap them;
* ZeRO-2 (Rajbhandari et al. 2020 Sec. 5.2): every backward's per-layer reduce-scatters
  (``_scatter_end``; the compute they cost beside it, ``scatters_owed``), or, where ZeRO
  collectives block the rank (``fast.comm.C_ZERO_BLOCKING``), in line with the backward, the
  parameters then gathered after the step (unit by unit under FSDP2: the SimPy engine's
  ``sim.actions.fsdp2_gathers``);
* ZeRO-3: the last layer's reduce-scatter;
* the tied embedding's gradient all-reduce between the first and the last rank
  (``tie_embedding``).

Seconds throughout.
"""
from __future__ import annotations

import numba
import numpy as np

from .codes import NAIVE, OFF_NONE, PS
from .comm import (C_AG_ALL, C_AR_ALL, C_AR_LAST, C_OWED_EMB, C_OWED_HEAD, C_PS_ALL, C_PS_BCAST, C_PS_LAST, C_RS_ALL,
                   C_RS_LAST, C_TIED, C_TIED_SHARD, C_Z2_EMB, C_Z2_HEAD, C_Z3_GATHER, C_Z3_ROOT_GATHER, C_Z3_SCATTER)
from .ranks import R_CHUNK, R_COMM, R_LAYERS, R_PARAMS, R_STEP, S_BUCKET_DOWN, S_BUCKETS_DOWN
from .rules import queued_behind, reduce_scatters_buckets, scatter_overlap, warmup_chunks


@numba.njit(cache=True)
def blocked_edges(t, c) -> float:
    """ZeRO-2 with blocking collectives: the embedding's and the head's gradient reduce-scatters
    (non-zero on the ranks holding them, ``fast.comm``), in line after every backward
    (``sim.actions.zero2_scatters``)."""
    if not (t.zero2 and t.block_scatter > 0.0):
        return 0.0
    return c[C_Z2_EMB] + c[C_Z2_HEAD]


@numba.njit(cache=True)
def edges_in_line(t, c) -> float:
    """ZeRO-2: what the embedding's and the head's gradient reduce-scatters add to every
    backward of the ranks holding them: the blocking collectives (``blocked_edges``), or beside
    a side stream the compute FSDP2's copies around them leave the rank (``fast.comm.C_OWED_EMB``
    / ``C_OWED_HEAD``; 0 elsewhere)."""
    x = blocked_edges(t, c) + (c[C_OWED_EMB] + c[C_OWED_HEAD] if t.zero2 else 0.0)
    if t.zero2 and t.b_stream > 0.0:
        # on the port the TP collectives use (``fast.timing._plan_terms``): the head's ahead of
        # the first layer's backward, the embedding's with the first layer's after the backward
        each = c[C_Z3_SCATTER]
        x += queued_behind(c[C_Z2_HEAD], t.pre_b)[0]
        if c[C_Z2_EMB] > 0.0:
            x += queued_behind(each + c[C_Z2_EMB], t.pre_next)[0] - queued_behind(each, t.pre_next)[0]
    return x


@numba.njit(cache=True)
def rank_scatters(c, layers) -> float:
    """ZeRO-2: seconds of a backward's reduce-scatters on a rank of ``layers`` layers, its edges'
    included (``fast.comm``: C_Z2_EMB / C_Z2_HEAD non-zero on the ranks holding them)."""
    return layers * c[C_Z3_SCATTER] + c[C_Z2_EMB] + c[C_Z2_HEAD]


@numba.njit(cache=True)
def scatters_owed(t, c, m, layers, compute, backward, alone) -> float:
    """ZeRO-2 beside a side stream: the compute a backward of a rank's ``layers`` layers owes,
    on average over the step's ``m``, for the reduce-scatters of their gradients and of the
    edges' (``fast.comm``: C_Z2_EMB / C_Z2_HEAD non-zero on the ranks holding them): the stack's
    slowdown x the compute they run beside (``costs.overlap.scatter_overlap``). A backward a
    forward follows runs them beside the rank's ``compute`` seconds per microbatch and the
    compute they owe, paid at that forward's start while they still run; one of the ``alone``
    (in microbatches) that the next backward follows after the pipeline's wait (the warm-up's
    count, ``schedules.warmup_chunks``) beside its own ``backward`` seconds only, its debt paid
    after the wait; the last backward beside its own but for its last part (the embedding's,
    else the last layer's), issued as it ends.
    The SimPy engine's ``Device.ledger``, charged by ``sim.actions.zero3_collective`` for each of
    ``zero2_scatters``; 0 elsewhere (``t.slowdown`` is 0 where the collectives block)."""
    if not (t.zero2 and t.slowdown > 0.0):
        return 0.0
    if t.b_stream > 0.0:
        # on the port the TP collectives use, a reduce-scatter runs beside the compute up to
        # the next TP collective only (``fast.timing._plan_terms``): a layer's beside the next
        # layer's (``t.zb`` owed), the head's beside the first layer's; the embedding's queues
        # behind the first layer's
        return (layers - 1.0 / m) * t.zb + t.slowdown * queued_behind(c[C_Z2_HEAD], t.pre_b)[1]
    scatters = rank_scatters(c, layers)
    steady = scatter_overlap(scatters, compute, t.slowdown)
    apart = scatter_overlap(scatters, backward, 0.0)
    last = scatters - (c[C_Z2_EMB] if c[C_Z2_EMB] > 0.0 else c[C_Z3_SCATTER])
    alone = min(alone, m - 1.0)
    return t.slowdown * ((m - 1.0 - alone) * steady + alone * apart + scatter_overlap(last, backward, 0.0)) / m


@numba.njit(cache=True)
def blocked_exposed(plan, ranks, t, r) -> float:
    """Seconds rank r waits a step for ZeRO collectives that block it (``fast.timing._plan_terms``
    puts them in line): every layer's gather in forward and backward and its reduce-scatter, and
    ZeRO-2's edge reduce-scatters, every microbatch; 0 where they do not block."""
    if not t.block_scatter > 0.0:
        return 0.0
    return plan.m * (ranks[r, R_LAYERS] * (2.0 * t.block_gather + t.block_scatter)
                     + blocked_edges(t, ranks[r, R_COMM:R_STEP]))


@numba.njit(cache=True)
def blocked_zero2_post(ranks, t, r) -> float:
    """ZeRO-2 with blocking collectives: the parameter all-gathers after rank r's step, unit by
    unit under FSDP2 (its layers, then its root unit: ``sim.actions.fsdp2_gathers``), else in
    DDP-sized buckets."""
    c = ranks[r, R_COMM:R_STEP]
    return ranks[r, R_LAYERS] * c[C_Z3_GATHER] + c[C_Z3_ROOT_GATHER] if t.fsdp2 else c[C_AG_ALL]


@numba.njit(cache=True)
def _sync_rounds(c, zero, dp_impl):
    """(gradient reduction of all buckets, of the last bucket, post-step parameter traffic)."""
    if dp_impl == PS:
        return c[C_PS_ALL], c[C_PS_LAST], c[C_PS_BCAST]
    if not reduce_scatters_buckets(zero):
        return c[C_AR_ALL], c[C_AR_LAST], 0.0
    return c[C_RS_ALL], c[C_RS_LAST], c[C_AG_ALL]     # ZeRO-1: reduce-scatter, then all-gather


# What ``plan_time`` reads of one plan (numba-compatible records: plain tuples with names).
# The plan's integer knobs (codes: ``fast.codes``; ``m`` the microbatches per step):


@numba.njit(cache=True, inline="always")
def tie_embedding(plan, ranks, ready):
    """The tied embedding's gradient all-reduce (``fast.comm`` C_TIED / C_TIED_SHARD, non-zero
    on the first and the last pipeline rank only): both start it when the later of the two has
    its gradients reduced, and end it together (``sim.dp.finish_step``). ``ready`` in place."""
    column = R_COMM + (C_TIED_SHARD if plan.zero >= 2 else C_TIED)
    meet, seconds = -1e300, 0.0
    for r in range(plan.pp):
        if ranks[r, column] > 0:
            meet, seconds = max(meet, ready[r]), ranks[r, column]
    if seconds > 0:
        for r in range(plan.pp):
            if ranks[r, column] > 0:
                ready[r] = meet + seconds


@numba.njit(cache=True, inline="always")
def _gradients_ready(plan, ranks, t, sync, r, end_r, b_rank, t_pipe, max_b, max_x):
    """(when rank r's gradients are reduced and on their way to the optimizer, the DP
    parameter traffic after its step) for a rank whose last backward ends at ``end_r``."""
    L = ranks[r, R_LAYERS]
    vpp, dp = plan.vpp, plan.dp
    ready, post = end_r, 0.0
    if t.zero2 and t.block_scatter > 0.0:
        post = blocked_zero2_post(ranks, t, r)      # each backward's reduce-scatters ran in line
    elif t.zero2:
        window = _backward_window(plan, b_rank, t_pipe, max_b, max_x)
        ready = _scatter_end(plan, ranks, t, r, L if vpp == 1 else ranks[r, R_CHUNK], end_r, window)
        post = ranks[r, R_COMM + C_AG_ALL]
    elif dp > 1 and not t.zero3:
        sync_all, sync_last, post = _sync_rounds(ranks[r, R_COMM:R_STEP], plan.zero, plan.dp_impl)
        ready = _sync_end(plan, ranks, t, r, end_r, b_rank, sync_all, sync_last, sync.overlap)
        if t.shared and sync.overlap:
            # the buckets and the last backward's TP collectives take turns on the port
            tp_last = L * t.tp_last_layer / vpp
            ready = max(ready, end_r - b_rank / vpp + t.b_layer + sync_all + tp_last)
        if plan.offload != OFF_NONE:
            # each reduced bucket's shard goes down over PCIe as it is done
            one, every = ranks[r, t.opt_block + S_BUCKET_DOWN], ranks[r, t.opt_block + S_BUCKETS_DOWN]
            ready = max(ready + one, ready - sync_all + every)
    elif t.zero3:
        ready = end_r + t.scatter                   # the last layer's gradient reduce-scatter
    return ready, post


@numba.njit(cache=True, inline="always")
def _backward_window(plan, b_rank, t_pipe, max_b, max_x):
    """Seconds from a rank's first backward's start to its last one's end, counted in model
    chunks (``b_rank`` its backward over all of them, per microbatch). A rank's backwards follow
    the pace at which the last rank starts them: after the ``w`` forwards of its warm-up
    (Megatron-LM ``num_warmup_microbatches`` on the last rank, ``schedules.warmup_forwards``:
    none in 1F1B, (v - 1) p chunks interleaved) one forward + backward pair at a time, at the
    slowest rank's pace (``max_x`` per microbatch), then its cool-down's ``w`` backwards at the
    slowest rank's backward pace (``max_b``). Where that warm-up holds every forward
    (interleaved with few microbatches; GPipe) all backwards run at the backward pace; the naive
    schedule runs one microbatch at a time (``t_pipe / m`` each)."""
    m, vpp, p = plan.m, plan.vpp, plan.pp
    if plan.schedule == NAIVE:
        return (m - 1.0) * t_pipe / m + b_rank
    total = m * vpp
    w = warmup_chunks(plan.schedule, p - 1, p, m, vpp)
    pairs = max(total - w, 1)
    return (b_rank + (pairs - 1.0) * max_x + (total - pairs) * max_b) / vpp


@numba.njit(cache=True, inline="always")
def _scatter_end(plan, ranks, t, r, layers, end_r, window):
    """ZeRO-2: when the reduce-scatters of the rank's last backward (model chunk 0: ``layers``
    layers, the embedding on rank 0, the head on the last rank without interleaving) are
    through, each starting when backward completes its gradients and the one before it is done;
    and no earlier than the step's whole DP stream work (m backwards of the rank's layers and
    edges) fits after the rank's first backward, ``window`` before ``end_r``."""
    c = ranks[r, R_COMM:R_STEP]
    last, vpp, L = plan.pp - 1, plan.vpp, ranks[r, R_LAYERS]
    emb = t.emb_bwd if r == 0 else 0.0
    head = t.head_bwd if r == last and vpp == 1 else 0.0
    per = t.b_stream if t.b_stream > 0.0 else t.b_layer  # a layer's period (shared port: ``fast.timing``)
    t_ = end_r - t.b_layer - (layers - 1.0) * per - emb - head        # the last backward's start
    end = -1e300
    if r == last and vpp == 1:
        t_ += head
        end = t_ + c[C_Z2_HEAD]
    for i in range(int(layers)):
        t_ += t.b_layer if i == 0 else per
        end = max(end, t_) + c[C_Z3_SCATTER]
    if r == 0:
        end = max(end, end_r) + c[C_Z2_EMB]
    per_microbatch = L * c[C_Z3_SCATTER] + (c[C_Z2_EMB] if r == 0 else 0.0) + (c[C_Z2_HEAD] if r == last else 0.0)
    return max(max(end, end_r), end_r - window + plan.m * per_microbatch)


@numba.njit(cache=True, inline="always")
def _sync_end(plan, ranks, t, r, end_r, b_rank, sync_all, sync_last, overlap):
    """When the rank's gradient buckets are all reduced: chunk by chunk (last chunk first),
    each starting when its first bucket is complete in its last backward and never ending
    before its last bucket, produced at the end of that backward, is through. The output
    head's gradients come first, the embedding's last."""
    if not overlap:
        return end_r + sync_all
    pp, vpp = plan.pp, plan.vpp
    last, L, n, lp = pp - 1, ranks[r, R_LAYERS], ranks[r, R_PARAMS], t.layer_params
    b_chunk = b_rank / vpp
    emb = t.emb_params if r == 0 else 0.0
    head = t.head_params if r == last else 0.0
    t_ = -1e300
    for i in range(vpp):
        c = vpp - 1 - i
        chunk_end = end_r - c * pp * b_chunk
        chunk_start = chunk_end - b_chunk
        share = (ranks[r, R_CHUNK + c] if vpp > 1 else L) * lp
        first, tail = t.b_layer, sync_last
        if c == vpp - 1 and head > 0:
            share += head
            first = t.head_bwd
        if c == 0 and emb > 0:
            share += emb
            tail = max(sync_last, sync_all * emb / n)
        duration = sync_all * share / n if n > 0 else 0.0
        t_ = max(max(t_, chunk_start + first) + duration, chunk_end + tail)
    return t_
