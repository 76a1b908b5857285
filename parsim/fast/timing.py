"""Step time of one plan (numba): closed forms of what the SimPy engine plays out.

Per microbatch, rank r runs forward F_r and backward B_r over its L_r layers (per-layer times
from ``fast.tables``: op times, TP collectives on the critical path, recomputation), plus the
embedding on rank 0 and the output head on the last rank, and where the stack's sends hold
their sender (``costs.p2p_holds_sender``) its own sends (``_held``). With X_r = F_r + B_r:

    T_pipe = sum_r X_r + (m - 1) max_r X_r + fill/drain sends      (GPipe, 1F1B)
           = sum_r X_r / v + (m - 1/v) max_r X_r + sends            (interleaved, v chunks)
           = m (sum_r X_r + sends)                                 (naive)
For equal stages these are (m + p - 1) X and (m + (p - 1)/v) X: Narayanan et al. 2021
Sec. 2.2 (Eq. 1 and the interleaved bubble (p - 1)/v), Huang et al. 2019 (GPipe). Interleaved
plans whose chunks hold different layer counts are timed by their graph instead
(``fast.dag.timed_by_graph``, ``fast.split_timing``): the fill and drain run through particular
chunks, which the X_r / v of the form does not follow.

ZeRO-3 (Rajbhandari et al. 2020 Sec. 7; DeepSpeed prefetching one layer ahead): every
action waits for its first layer's all-gather (behind the previous backward's last gradient
reduce-scatter), then a layer takes max(compute, DP stream work): the gather, and in backward
also the reduce-scatter; with parameter offload each gather is preceded by the shard's
host-to-device copy (ZeRO-Infinity, Rajbhandari et al. 2021). The compute its collectives
slow is owed and paid at the next action's start, while the last reduce-scatters drain
(``fast.zero3``).

ZeRO-2 (Rajbhandari et al. 2020 Sec. 5.2): every backward reduce-scatters each layer's (and
the head's, the embedding's) gradients on the DP stream as it completes them, hidden behind
compute except after the rank's last backward: the step's gradients are reduced when that
backward's queue of reduce-scatters drains (or, if the DP stream cannot keep up, when all m of
them are through), then the sharded step and the once-per-step parameter all-gather. Beside a
side stream, the compute those reduce-scatters run beside costs the stack's slowdown on it
(``costs.overlap.scatter_overlap``), added to every backward. Where they share the port with
the TP collectives (the engine's ports are first come, first served), each TP collective asked
for after a reduce-scatter waits for it: a backward layer's period is its compute plus what of
the previous layer's reduce-scatter its compute before its first TP collective does not cover
(``costs.overlap.zero3_backward_layer`` without a gather), a forward after a backward waits the
same for the backward's last one, and only that compute runs beside them.

End of the step, per rank (PyTorch DDP bucketing, Li et al. 2020 Sec. 3.2.3): the gradient
buckets of a stage are reduced one after another on the DP link as its last backward
produces them (head first, layers from the last, embedding last); with interleaving the
rank's chunks finish their last backward p backward passes apart, last chunk first. Then the
optimizer step (on the device, or on the host after the gradient shard went down over PCIe:
ZeRO-Offload, Ren et al. 2021 Sec. 4), then the ZeRO-1/2 parameter all-gather or the
parameter server's broadcast. The step ends when the slowest rank is done.
"""
from __future__ import annotations

from collections import namedtuple

import numba
import numpy as np

from .codes import (GPIPE, INTERLEAVED, NAIVE, O_BUBBLE, O_DP, O_PIPE, O_PP, O_STEP, O_TP, OFF_NONE, ONE_F_ONE_B,
                    PS, ZB_H1)
from .comm import (C_COMM_SLOWDOWN, C_OWED_GATHER, C_OWED_SCATTER, C_SHARED_LINK, C_Z3_GATHER, C_Z3_SCATTER,
                   C_ZERO_BLOCKING)
from .dp_end import _gradients_ready, blocked_exposed, edges_in_line, scatters_owed, tie_embedding
from .ranks import R_COMM, R_LAYERS, R_STEP, S_GRADS_DOWN, S_LAYER_UP, S_OPT_STEP, S_PARAMS_UP, step_block
from .rules import gathers_layers, queued_behind, scatters_every_backward, warmup_chunks, zero3_backward_layer
from .tables import (H_EMB_BWD, H_EMB_FWD, H_EMB_PARAMS, H_HEAD_BWD, H_HEAD_FWD, H_HEAD_PARAMS_PP1,
                     H_HEAD_PARAMS_PPN, L_BWD, L_FWD, L_MID_BWD, L_PARAMS, L_PRE_BWD, L_PRE_FWD, L_RECOMPUTE, L_TP1_BWD,
                     L_TP_BWD, L_TP_FWD, L_TP_RECOMPUTE)
from .zero3 import chained, chained_backward, drain_paid, layer_periods, root_unit


@numba.njit(cache=True)
def _edges(r: int, last: int, hrow) -> float:
    """Embedding (rank 0) and output head (last rank) work per microbatch, forward + backward."""
    x = 0.0
    if r == 0:
        x += hrow[H_EMB_FWD] + hrow[H_EMB_BWD]
    if r == last:
        x += hrow[H_HEAD_FWD] + hrow[H_HEAD_BWD]
    return x


# What ``plan_time`` reads of one plan (numba-compatible records: plain tuples with names).
# The plan's integer knobs (codes: ``fast.codes``; ``m`` the microbatches per step):
PlanKnobs = namedtuple("PlanKnobs", "dp tp pp vpp m schedule zero offload dp_impl")
# the sweep's DP bucketing: bucket bytes, and whether buckets overlap the last backward
DPSync = namedtuple("DPSync", "bucket_bytes overlap")
# the plan's terms shared by the pipeline and the end of the step (seconds, parameters, bytes;
# flags), read once from its rows so the per-rank steps take scalars
# ``block_gather`` / ``block_scatter``: a layer's ZeRO collectives where they block the rank
# (``fast.comm.C_ZERO_BLOCKING``), already in ``f_layer`` / ``b_layer``; ``fsdp2``: ZeRO-2 gathers
# unit by unit after the step (the SimPy engine's ``actions.fsdp2_gathers``); ``owed_gather`` /
# ``owed_scatter``: FSDP2's copies a layer's collectives leave to the compute beside a side
# stream (``fast.comm.C_OWED_*``), also already in ``f_layer`` / ``b_layer``; ``f_stream`` /
# ``b_stream``: a ZeRO-3 layer's period where its DP stream bounds it (``b_second``: a backward's
# second layer's, no reduce-scatter ahead of its gather), ``zf`` / ``zb`` the compute its
# collectives cost it (``costs.overlap``); ``slowdown``: compute seconds a rank owes per second
# of compute a collective runs beside (``costs.stack.comm_compute_slowdown``; 0 where they block)
PlanTerms = namedtuple("PlanTerms", "f_layer b_layer tp_layer f_stream b_stream b_second gather scatter f_wait b_wait "
                                    "h2d zf zb zero3 zero2 shared tp_last_layer layer_params emb_bwd head_bwd "
                                    "emb_params head_params opt_block block_gather block_scatter fsdp2 "
                                    "owed_gather owed_scatter slowdown pre_b pre_next")


@numba.njit(cache=True)
def plan_time(out, plan, lrow, hrow, ranks, send, sync):
    """Write step time, pipeline time, bubble fraction and exposed communication into ``out``:
    ``plan`` a ``PlanKnobs``; its rows of the cost tables (``fast.tables``): ``lrow`` (layer),
    ``hrow`` (embedding / head), the (pp, ...) ``ranks`` rows and ``send`` (each rank's pipeline
    send, ``fast.ranks``); ``sync`` the sweep's ``DPSync``. The per-rank steps read
    scalars only (``PlanTerms``): array arguments of inlined helpers cost a reference count
    each, a quarter more time per plan."""
    t = _plan_terms(plan, lrow, hrow, ranks)
    t_pipe, rank_x, sends, held, tp_total, queued_tp, max_b, max_x = _pipeline(plan, hrow, ranks, send, t)
    step, exposed_dp, busy = _end_of_step(plan, hrow, ranks, send, t, sync, t_pipe, rank_x, max_b, max_x)
    m, pp = plan.m, plan.pp
    out[O_STEP] = step
    out[O_PIPE] = t_pipe
    # idle share of the step, >= 0 (the difference can round below zero when no rank idles)
    out[O_BUBBLE] = max(0.0, 1.0 - busy / (pp * step)) if step > 0 else 0.0
    out[O_TP] = m * (tp_total + queued_tp) / pp
    # a time blocked is >= 0; the difference can round below zero when the terms are huge
    out[O_DP] = max(0.0, exposed_dp - m * queued_tp) / pp
    # each rank waits one send per microbatch on the wire, and once more in the fill; a blocking
    # stack's rank also its own sends
    out[O_PP] = ((2.0 * m if plan.schedule == NAIVE else m + 1.0) * sends + m * held) / pp


@numba.njit(cache=True, inline="always")
def _plan_terms(plan, lrow, hrow, ranks):
    """One layer's forward / backward seconds (TP collectives and recomputation in), the
    ZeRO-3 per-layer DP work and the waits before an action's first layer, and what the end
    of the step reads of the layer and head rows."""
    f_layer = lrow[L_FWD] + lrow[L_TP_FWD]
    b_layer = lrow[L_BWD] + lrow[L_TP_BWD] + lrow[L_RECOMPUTE] + lrow[L_TP_RECOMPUTE]
    tp_layer = lrow[L_TP_FWD] + lrow[L_TP_BWD] + lrow[L_TP_RECOMPUTE]
    opt_block = step_block(plan.zero, plan.offload)   # the plan's optimizer columns in the rank rows (fast.ranks)
    zero3 = gathers_layers(plan.zero, plan.dp)
    zero2 = scatters_every_backward(plan.zero, plan.dp, plan.dp_impl == PS)
    # beside a side stream, FSDP2's copies around a layer's gather and reduce-scatter are
    # compute the rank owes (``fast.comm.C_OWED_*``; 0 elsewhere): in the layer's compute
    owed_gather = ranks[0, R_COMM + C_OWED_GATHER] if zero3 else 0.0
    owed_scatter = ranks[0, R_COMM + C_OWED_SCATTER] if zero3 or zero2 else 0.0
    f_layer += owed_gather
    b_layer += owed_gather + owed_scatter
    # TP and DP on one port: the DP stream's transfers queue with the TP collectives
    shared = ranks[0, R_COMM + C_SHARED_LINK] > 0
    gather, scatter, zf, zb, f_stream, b_stream, b_second = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    f_wait, b_wait, h2d, pre_b, pre_next = 0.0, 0.0, 0.0, 0.0, 0.0
    # NCCL kernels share the SMs: compute that runs beside a ZeRO collective costs slowdown x
    # that much more compute (``costs.stack.comm_compute_slowdown``; the SimPy engine's
    # ``Device.ledger``: compute owed for the overlap, paid before the next action)
    slowdown = ranks[0, R_COMM + C_COMM_SLOWDOWN]
    if zero3:
        gather = ranks[0, R_COMM + C_Z3_GATHER]
        h2d = ranks[0, opt_block + S_LAYER_UP]          # parameter offload: over PCIe, not the port TP uses
        scatter = ranks[0, R_COMM + C_Z3_SCATTER]
        f_stream, zf, b_stream, zb, b_second = layer_periods(lrow, f_layer, b_layer, gather, h2d, scatter, shared,
                                                             slowdown, owed_gather, owed_scatter)
        gather += h2d
        # an action's first gather waits behind the previous backward's last reduce-scatter
        # when it follows that backward directly: forwards in 1F1B, backwards in GPipe
        schedule = plan.schedule
        f_wait = gather + (scatter if schedule == ONE_F_ONE_B or schedule == INTERLEAVED else 0.0)
        b_wait = gather + (scatter if schedule == GPIPE else 0.0)
    elif zero2 and shared and plan.schedule < ZB_H1:
        # ZeRO-2 on the port its TP collectives use (``sim.network.Port``, first come first
        # served; split schedules reduce-scatter in W, which has no TP collectives): a backward
        # layer's first TP collective queues behind the reduce-scatter of the layer before it,
        # which runs beside that layer's compute only until then (``costs.overlap``, no gather);
        # an action's first one behind the last reduce-scatter of the backward it follows
        pre_b, pre_f = lrow[L_PRE_BWD], lrow[L_PRE_FWD]
        each = ranks[0, R_COMM + C_Z3_SCATTER]
        b_stream, overlapped = zero3_backward_layer(b_layer, pre_b, lrow[L_TP1_BWD], lrow[L_MID_BWD],
                                                    0.0, 0.0, each, True)
        zb = slowdown * overlapped
        # (GPipe: a backward follows a backward, the wait hidden where the rank waits for the
        # next one's gradient, or behind the head's backward)
        pre_next = pre_b if plan.schedule == GPIPE else pre_f
        f_wait = 0.0 if plan.schedule == GPIPE else queued_behind(each, pre_f)[0]
    # ZeRO collectives that block the rank (no side stream: ``fast.comm``): a layer's run in line
    # with its compute, the gather before it, the reduce-scatter after its backward (``sim.actions``)
    blocking = ranks[0, R_COMM + C_ZERO_BLOCKING]
    block_gather, block_scatter = 0.0, 0.0
    if blocking > 0 and (zero3 or zero2):
        block_scatter = ranks[0, R_COMM + C_Z3_SCATTER]
        block_gather = gather if zero3 else 0.0
        f_layer += block_gather
        b_layer += block_gather + block_scatter
        gather, scatter, f_wait, b_wait, zf, zb, f_stream, b_stream = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        b_second = 0.0
        pre_b, pre_next = 0.0, 0.0
        slowdown = 0.0              # no compute runs beside a collective the rank waits for
    head_params = hrow[H_HEAD_PARAMS_PP1] if plan.pp == 1 else hrow[H_HEAD_PARAMS_PPN]
    return PlanTerms(f_layer, b_layer, tp_layer, f_stream, b_stream, b_second, gather, scatter, f_wait, b_wait, h2d,
                     zf, zb, zero3, zero2, shared, lrow[L_TP_BWD] + lrow[L_TP_RECOMPUTE], lrow[L_PARAMS],
                     hrow[H_EMB_BWD], hrow[H_HEAD_BWD], hrow[H_EMB_PARAMS], head_params, opt_block, block_gather,
                     block_scatter, blocking == 2.0, owed_gather, owed_scatter, slowdown, pre_b, pre_next)


@numba.njit(cache=True, inline="always")
def rank_scatters_owed(plan, t, hrow, ranks, r, head):
    """ZeRO-2: the compute rank r's backward owes for its reduce-scatters (``dp_end.scatters_owed``)
    beside its compute per microbatch (its layers' and its edges' forward and backward; ``head``:
    the rank holds the output head, wherever the placement puts it)."""
    L = ranks[r, R_LAYERS]
    backward = L * t.b_layer + (hrow[H_EMB_BWD] if r == 0 else 0.0) + (hrow[H_HEAD_BWD] if head else 0.0)
    alone = warmup_chunks(plan.schedule, r, plan.pp, plan.m, plan.vpp) / plan.vpp   # in microbatches
    return scatters_owed(t, ranks[r, R_COMM:R_STEP], plan.m, L, L * (t.f_layer + t.b_layer)
                         + _edges(r, r if head else -1, hrow), backward, alone)


@numba.njit(cache=True, inline="always")
def _backward(t, L, vpp):
    """The backward of a rank's ``L`` layers in ``vpp`` actions (ZeRO-3: their DP waits in;
    ZeRO-2 on a shared port: their TP collectives' waits behind the reduce-scatters)."""
    if t.zero3:
        return chained_backward(L, vpp, t.b_wait, t.b_layer + t.zb, t.b_second + t.zb, t.b_stream + t.zb)
    if t.zero2 and t.b_stream > 0.0:
        return chained(L, vpp, t.b_wait, t.b_layer, t.b_stream)
    return L * t.b_layer


@numba.njit(cache=True, inline="always")
def zero3_unwaited(t):
    """ZeRO-3: seconds of a forward's first gather wait behind the previous backward's last
    reduce-scatter (what ``f_wait`` counts beyond the gather: 1F1B, interleaved), which a forward
    no backward precedes does not wait; 0 otherwise."""
    return t.f_wait - t.gather if t.zero3 else 0.0


@numba.njit(cache=True, inline="always")
def _fill_unwaited(plan, t):
    """Seconds of a rank's per-microbatch waits behind a previous backward's DP transfers that
    its first forwards, in the pipeline's fill, do not wait: ZeRO-2's TP collectives behind the
    reduce-scatters (``f_wait``), ZeRO-3's first gather behind the last reduce-scatter
    (``zero3_unwaited``)."""
    if t.zero2:
        return plan.vpp * t.f_wait
    return plan.vpp * zero3_unwaited(t)


@numba.njit(cache=True, inline="always")
def _zero2_queued(t, L, vpp):
    """ZeRO-2 on a shared port: seconds a rank's ``L`` layers in ``vpp`` chunks wait per
    microbatch for their TP collectives behind the reduce-scatters (``_plan_terms``; 0 elsewhere)."""
    if not (t.zero2 and t.b_stream > 0.0):
        return 0.0
    return vpp * t.f_wait + _backward(t, L, vpp) - L * t.b_layer


@numba.njit(cache=True, inline="always")
def _holds(plan, send):
    """Whether the plan's pipeline sends hold their sender: the flag after its sends
    (``fast.ranks.send_rows``: ``costs.p2p_holds_sender``, 0 without pipelining)."""
    return send[plan.pp] > 0.0


@numba.njit(cache=True, inline="always")
def held_send(plan, send, r, forward, c):
    """Seconds a pass of rank r's chunk c holds it for its send where sends hold their sender
    (``_holds``; GPipe, 1F1B, interleaved: stages in a loop, stage c pp + r): a forward sends to
    the next stage (``send[r]``; the last rank's, to rank 0, is the loop's turn), a backward to
    the one before (``send[r - 1]``; rank 0's goes to the last rank); none past either end."""
    pp = plan.pp
    stage = c * pp + r
    if forward:
        return send[r] if stage < pp * plan.vpp - 1 else 0.0
    return send[r - 1 if r > 0 else pp - 1] if stage > 0 else 0.0


@numba.njit(cache=True, inline="always")
def _held(plan, send, r):
    """Seconds rank r's own sends hold it per microbatch where they hold their sender
    (``_holds``): ``held_send`` over each of its vpp chunks' forward and backward."""
    if not _holds(plan, send):
        return 0.0
    held = 0.0
    for c in range(plan.vpp):
        held += held_send(plan, send, r, True, c) + held_send(plan, send, r, False, c)
    return held


@numba.njit(cache=True, inline="always")
def _pipeline(plan, hrow, ranks, send, t):
    """One microbatch per rank, and the pipeline: (pipeline time, each rank's forward +
    backward per microbatch, sends of the fill, the ranks' held sends per microbatch
    (``_held``, summed), TP time per microbatch, TP time queued behind
    ZeRO-3 transfers, the slowest rank's backward, the slowest rank's forward + backward)."""
    pp, vpp = plan.pp, plan.vpp
    last = pp - 1
    sum_x, max_x, sends, held, tp_total = 0.0, 0.0, 0.0, 0.0, 0.0
    rank_x = np.zeros(pp)
    queued_tp = 0.0        # TP collectives waiting behind ZeRO-3 transfers on a shared port
    max_b = 0.0            # the slowest rank's backward (GPipe's backwards run at its pace)
    for r in range(pp):
        L = ranks[r, R_LAYERS]
        if t.zero3:
            x = (chained(L, vpp, t.f_wait, t.f_layer + t.zf, t.f_stream + t.zf)
                 + _backward(t, L, vpp))
            if t.shared:
                queued_tp += x - (chained(L, vpp, t.f_wait, t.f_layer + t.zf, t.gather + t.zf)
                                  + chained_backward(L, vpp, t.b_wait, t.b_layer + t.zb, t.gather + t.zb,
                                                     t.gather + t.scatter + t.zb))
            x -= drain_paid(plan, t, ranks[r, R_COMM:R_STEP], L)
        else:
            queued = _zero2_queued(t, L, vpp)
            x = L * (t.f_layer + t.b_layer) + queued
            queued_tp += queued
        root_b = root_unit(t.zero3, ranks[r, R_COMM:R_STEP], False)
        # a blocking stack's sends hold the rank in its steady state (``_held``)
        held_r = _held(plan, send, r)
        held += held_r
        root_b += edges_in_line(t, ranks[r, R_COMM:R_STEP])
        root_b += rank_scatters_owed(plan, t, hrow, ranks, r, r == last)
        x += _edges(r, last, hrow) + root_unit(t.zero3, ranks[r, R_COMM:R_STEP], True) + root_b + held_r
        max_b = max(max_b, _backward(t, L, vpp) + (hrow[H_EMB_BWD] if r == 0 else 0.0)
                    + (hrow[H_HEAD_BWD] if r == last else 0.0) + root_b)
        rank_x[r] = x
        sum_x += x - _fill_unwaited(plan, t)  # the fill's forwards follow no backward
        max_x = max(max_x, x)
        tp_total += L * t.tp_layer
        if r < last:
            sends += send[r]
    m = plan.m
    if plan.schedule == NAIVE:
        t_pipe = m * (sum_x + 2.0 * sends)
    elif plan.schedule == INTERLEAVED:
        t_pipe = sum_x / vpp + (m - 1.0 / vpp) * max_x + 2.0 * sends
    else:
        t_pipe = sum_x + (m - 1) * max_x + 2.0 * sends
    return t_pipe, rank_x, sends, held, tp_total, queued_tp, max_b, max_x


@numba.njit(cache=True, inline="always")
def _end_of_step(plan, hrow, ranks, send, t, sync, t_pipe, rank_x, max_b, max_x):
    """End of the step, rank by rank (rank 0 runs the last backward; rank r ends earlier by the
    backwards and sends of the ranks before it): (step time, exposed DP time summed over
    ranks, compute-busy rank-seconds)."""
    pp, vpp, m = plan.pp, plan.vpp, plan.m
    last = pp - 1
    end_r = t_pipe
    ends, ready, post = np.empty(pp), np.empty(pp), np.empty(pp)
    for r in range(pp):
        L = ranks[r, R_LAYERS]
        b_rank = _backward(t, L, vpp)
        if r == 0:
            b_rank += hrow[H_EMB_BWD]
        if r == last:
            b_rank += hrow[H_HEAD_BWD]
        b_rank += root_unit(t.zero3, ranks[r, R_COMM:R_STEP], False) + edges_in_line(t, ranks[r, R_COMM:R_STEP])
        b_rank += rank_scatters_owed(plan, t, hrow, ranks, r, r == last)
        if r > 0:
            end_r -= b_rank / vpp + send[r - 1]
        # a blocking stack's rank is done when its last backward's send is through
        ends[r] = end_r + (send[r - 1] if r > 0 and _holds(plan, send) else 0.0)
        ready[r], post[r] = _gradients_ready(plan, ranks, t, sync, r, end_r, b_rank, t_pipe, max_b, max_x)
    tie_embedding(plan, ranks, ready)
    step, exposed_dp, busy = 0.0, 0.0, 0.0
    on_host = plan.offload != OFF_NONE
    for r in range(pp):
        if on_host and (t.zero3 or t.zero2):
            ready[r] += ranks[r, t.opt_block + S_GRADS_DOWN]          # the accumulated gradient shard
        exposed = ready[r] - ends[r] + post[r]
        opt = ranks[r, t.opt_block + S_OPT_STEP]
        if on_host:
            opt += ranks[r, t.opt_block + S_PARAMS_UP]          # the updated parameter shard comes back
        else:
            busy += opt
        held = _held(plan, send, r)
        if t.zero3:
            # inside the actions: the waits for gathers that compute did not hide
            exposed += m * (rank_x[r] - held - ranks[r, R_LAYERS] * (t.f_layer + t.b_layer) - _edges(r, last, hrow))
        exposed += m * _zero2_queued(t, ranks[r, R_LAYERS], vpp)
        exposed += blocked_exposed(plan, ranks, t, r)
        step = max(step, ready[r] + opt + post[r])
        exposed_dp += exposed
        busy += m * (rank_x[r] - held)              # whole actions, waits inside them included
    return step, exposed_dp, busy


