"""Step time of a plan whose schedule is timed by its action graph (numba): the split-backward
family (zb-h1, zb-h2, interleaved-zb, zbv, dualpipev), looped BFS, and interleaved 1F1B over
model chunks of different layer counts (``fast.dag.timed_by_graph``).

Per model chunk c of rank r (L_rc layers; the embedding on stage 0, the output head on the last
stage, wherever the placement puts them: ``fast.ranks`` R_LAST), one microbatch's passes from the
layer rows (``costs.split_backward``): F, B = I + W, I (the input-gradient ops, the backward TP
collectives, the recomputation), W (the weight-gradient ops, W's re-runs of a recomputed forward)
and DualPipe's overlapped F&B slot (``split_backward.overlapped_time``). ``fast.dag`` plays the
schedule's graph with them (each node starts when its rank is free and its inputs from other
ranks have arrived, plus the pipeline send between the two ranks, ``fast.ranks.send_between``;
where the stack's sends hold their sender, ``costs.p2p_holds_sender``, the rank stays held for
its own send after the pass); a step longer than the
graph's canonical microbatches adds the steady-state period per extra microbatch: the bottleneck
rank's work per microbatch, sum_c (F_rc + I_rc + W_rc) (I + W exceeds B where W re-runs a
recomputed forward; DualPipeV's steady state runs overlapped F&B slots: their time in place of
F + B; interleaved's sum_c (F_rc + B_rc) and its held sends), and for looped BFS
sum_c (max_r F_rc + max_r B_rc) (each chunk's forwards, then its backwards, pace at the slowest
stage). ZeRO-3's waits inside the actions follow ``fast.timing``: a B's debt is paid while its
last reduce-scatters drain (``fast.zero3.chunk_paid``), and a forward before the rank's first
backward waits for no reduce-scatter. ZeRO-2's reduce-scatters on the TP collectives' port
queue node by node (``fast.port``).

End of the step, per rank: each chunk's gradients are complete when its last B or W ends (the
graph gives when); DP buckets of the chunks go out in that order (``fast.dp_end._sync_end``'s rule
with the graph's times), then the optimizer and the parameter traffic as in ``fast.timing`` (the
rank rows' optimizer block, ``fast.ranks``).
"""
from __future__ import annotations

import numba
import numpy as np

from .codes import DUALPIPEV, LOOPED_BFS, ZB_H1, O_BUBBLE, O_DP, O_PIPE, O_PP, O_STEP, O_TP, OFF_NONE
from .comm import (C_AG_ALL, C_OWED_EMB, C_OWED_HEAD, C_Z2_EMB, C_Z2_HEAD, C_Z3_EMB_GATHER, C_Z3_EMB_SCATTER,
                   C_Z3_HEAD_GATHER, C_Z3_HEAD_SCATTER, C_Z3_ROOT_GATHER, C_Z3_ROOT_SCATTER, C_Z3_SCATTER)
from .dag import K_B, K_F, K_FB, K_I, K_W, N_CHUNK, N_CHUNK_B, N_DEP0, N_DEP1, N_KIND, N_KIND_B, N_RANK
from .ranks import (R_CHUNK, R_COMM, R_LAST, R_LAYERS, R_PARAMS, R_STEP, S_GRADS_DOWN, S_OPT_STEP, S_PARAMS_UP,
                    send_between)
from .rules import overlapped_time, paid_beside_drain
from .tables import (H_EMB_BWD, H_EMB_FWD, H_HEAD_BWD, H_HEAD_BWD_W, H_HEAD_FWD, H_HEAD_TP_COVER, L_BWD, L_BWD_I,
                     L_BWD_W, L_FWD, L_PRE_BWD, L_RECOMPUTE, L_SPLIT_W, L_SPLIT_W2, L_TP_BWD, L_TP_COVER,
                     L_TP_RECOMPUTE, L_TP_W_RECOMPUTE, L_W_RECOMPUTE)
from .dp_end import (_scatter_end, _sync_rounds, blocked_exposed, blocked_zero2_post, rank_scatters,
                     tie_embedding)
from .timing import _held, _holds, _plan_terms, held_send, rank_scatters_owed, zero3_unwaited
from .port import P_ON, Q_B, Q_W, layer_queues, port_rows, queue_node
from .zero3 import chained, chained_backward, chunk_paid, split_owed

# per (rank, chunk): one microbatch's pass times and the communication inside them (seconds)
P_F, P_B, P_I, P_W, P_F_COMM, P_B_COMM, P_I_COMM, P_WIDTH = range(8)


@numba.njit(cache=True)
def pass_times(plan, t, lrow, hrow, ranks, shared, q):
    """(pp, vpp, P_WIDTH) pass times of every chunk (module docstring); ``shared``, ``q``: the
    plan's ``layer_queues``."""
    out = np.zeros((plan.pp, plan.vpp, P_WIDTH))
    # I's TP collectives hide nothing behind a weight-gradient GEMM (``L_TP_COVER``: 0 but for
    # stacks that overlap them, ``costs.stack.tp_covered``)
    i_layer = lrow[L_BWD_I] + (lrow[L_TP_BWD] + lrow[L_TP_COVER]) + lrow[L_RECOMPUTE] + lrow[L_TP_RECOMPUTE]
    w_layer = lrow[L_BWD_W] + lrow[L_W_RECOMPUTE] + lrow[L_TP_W_RECOMPUTE]
    zi, zw = split_owed(t, i_layer, w_layer, lrow[L_PRE_BWD])
    for r in range(plan.pp):
        # the compute the rank's backwards owe per microbatch for their reduce-scatters, and
        # those reduce-scatters' seconds: each chunk takes its share
        # (where the scatters share the TP collectives' port, ``play`` charges it node by node)
        owed = 0.0 if shared else rank_scatters_owed(plan, t, hrow, ranks, r, ranks[r, R_LAST] >= 0)
        scattered = rank_scatters(ranks[r, R_COMM:R_STEP], ranks[r, R_LAYERS])
        for c in range(plan.vpp):
            L = ranks[r, R_CHUNK + c]
            first, last = r == 0 and c == 0, ranks[r, R_LAST] == c
            p = out[r, c]
            if t.zero3:
                p[P_F] = chained(L, 1, t.f_wait, t.f_layer, t.f_stream)
                p[P_B] = chained_backward(L, 1, t.b_wait, t.b_layer, t.b_second, t.b_stream)
                p[P_I] = chained(L, 1, t.b_wait, i_layer + t.block_gather + t.owed_gather, t.gather)
                p[P_W] = chained(L, 1, 0.0, w_layer + t.block_scatter + t.owed_scatter, t.scatter)
                # W waits for none of its reduce-scatters: it owes its compute beside them, paid
                # at the next pass's start while they drain (``costs.overlap.paid_beside_drain``)
                drain = p[P_W] - L * (w_layer + t.block_scatter + t.owed_scatter)
                p[P_W] += L * zw - paid_beside_drain(L * zw, drain)
            else:       # ZeRO-2: W completes a layer's gradients and reduce-scatters them
                # (on the TP collectives' port: each layer but the first waits, ``layer_queues``)
                p[P_F], p[P_B] = L * t.f_layer, L * t.b_layer + max(L - 1.0, 0.0) * q[Q_B]
                p[P_I] = L * i_layer
                p[P_W] = L * (w_layer + t.block_scatter + t.owed_scatter) + max(L - 1.0, 0.0) * q[Q_W]
            # W run apart from its I costs more than its ops (``split_weight_overhead``)
            p[P_W] += L * lrow[L_SPLIT_W] + L * L * lrow[L_SPLIT_W2]
            # what is not the layers' compute: TP collectives, ZeRO-3 waits (an overlapped slot
            # hides them behind the other pass's compute), but for ZeRO collectives that block the rank
            p[P_F_COMM] = p[P_F] - L * (lrow[L_FWD] + t.block_gather + t.owed_gather)
            p[P_B_COMM] = p[P_B] - L * (lrow[L_BWD] + lrow[L_RECOMPUTE] + t.block_gather + t.block_scatter
                                        + t.owed_gather + t.owed_scatter)
            p[P_I_COMM] = p[P_I] - L * (lrow[L_BWD_I] + lrow[L_RECOMPUTE] + t.block_gather + t.owed_gather)
            # ZeRO-3: the compute F's, B's and I's collectives ran beside, owed (paid at the next pass's
            # start; ZeRO-2's, where it has some, ``play`` charges node by node)
            zb = L * t.zb if t.zero3 else 0.0
            p[P_F], p[P_B], p[P_I], root = p[P_F] + L * t.zf, p[P_B] + zb, p[P_I] + L * zi, 0.0
            if t.zero3 and (first or last):
                # the chunk's own root unit: both ends where one chunk holds both (pp = 1), else
                # its end alone (V placement holds the first stage and the last in two chunks)
                g, s = (C_Z3_ROOT_GATHER, C_Z3_ROOT_SCATTER) if first and last else \
                    ((C_Z3_EMB_GATHER, C_Z3_EMB_SCATTER) if first else (C_Z3_HEAD_GATHER, C_Z3_HEAD_SCATTER))
                root = ranks[r, R_COMM + s]
                p[P_F] += ranks[r, R_COMM + g]
                p[P_B] += ranks[r, R_COMM + g] + root
                # split: I gathers it (the head's input gradient needs its weight), W scatters
                # its gradients (the first stage's W, the whole backward, is P_B below)
                p[P_I] += ranks[r, R_COMM + g]
                p[P_W] += ranks[r, R_COMM + s]
            # a B's debt is paid while its last reduce-scatters drain (the root unit's on its chunk)
            p[P_B] -= chunk_paid(t, L, root)
            if first:
                p[P_F] += hrow[H_EMB_FWD]
                p[P_B] += hrow[H_EMB_BWD]
            if last:
                p[P_F] += hrow[H_HEAD_FWD]
                p[P_B] += hrow[H_HEAD_BWD]
                p[P_I] += hrow[H_HEAD_BWD] - hrow[H_HEAD_BWD_W] + hrow[H_HEAD_TP_COVER]
                p[P_W] += hrow[H_HEAD_BWD_W]
            if t.zero2:     # the edges' scatters after their W: blocking in line, beside a side stream their copies
                emb, head = (C_Z2_EMB, C_Z2_HEAD) if t.block_scatter > 0.0 else (C_OWED_EMB, C_OWED_HEAD)
                edge = (ranks[r, R_COMM + emb] if first else 0.0) + (ranks[r, R_COMM + head] if last else 0.0)
                # ... and the compute owed for the chunk's share of the rank's reduce-scatters
                chunk = L * ranks[r, R_COMM + C_Z3_SCATTER] + (ranks[r, R_COMM + C_Z2_EMB] if first else 0.0) \
                    + (ranks[r, R_COMM + C_Z2_HEAD] if last else 0.0)
                edge += owed * chunk / scattered if scattered > 0.0 else 0.0
                p[P_B] += edge
                p[P_W] += edge
            if first:
                # no input gradient: the first stage's I runs nothing, its W the whole backward
                p[P_I], p[P_I_COMM], p[P_W] = 0.0, 0.0, p[P_B]
    return out


@numba.njit(cache=True)
def node_time(p, kind, c, cb, kind_b):
    """Seconds of one node: a pass of chunk ``c``, or an overlapped F (chunk c) & B/I (chunk cb)."""
    if kind == K_F:
        return p[c, P_F]
    if kind == K_B:
        return p[c, P_B]
    if kind == K_I:
        return p[c, P_I]
    if kind == K_W:
        return p[c, P_W]
    b, b_comm = (p[cb, P_B], p[cb, P_B_COMM]) if kind_b == K_B else (p[cb, P_I], p[cb, P_I_COMM])
    return overlapped_time(p[c, P_F] - p[c, P_F_COMM], p[c, P_F_COMM], b - b_comm, b_comm)


@numba.njit(cache=True)
def play(plan, nodes, passes, send, port, unwaited):
    """The graph's makespan; per rank its busy seconds; per (rank, chunk) the end, duration and
    kind of its last gradient-producing node (B, W, or an overlapped slot's B); per rank the
    start, duration and chunk of its first, and the seconds the port's queue added. ``port``
    (``port_rows``): where ZeRO-2's reduce-scatters share the port with the TP collectives, a
    node's first TP collective waits for those queued before it (``sim.network.Port``, first
    come first served: ``queue_node``)."""
    pp, vpp = plan.pp, plan.vpp
    n = nodes.shape[0]
    end = np.empty(n)
    free = np.zeros(pp)
    busy = np.zeros(pp)
    queue = np.zeros(pp)                        # when the port's queued reduce-scatters are through
    grad = np.full((pp, vpp, 3), -1.0)          # end, duration, kind
    first = np.full((pp, 3), -1.0)              # start, duration, chunk
    owed = np.zeros(pp)                         # compute owed for overlapping the scatters
    added = np.zeros(pp)                        # seconds the port's queue added to the rank
    shared = port[0, 0, P_ON] > 0.0
    holds = _holds(plan, send)
    for i in range(n):
        r = nodes[i, N_RANK]
        start = free[r]
        for j in (N_DEP0, N_DEP1):
            d = nodes[i, j]
            if d >= 0:
                src = nodes[d, N_RANK]
                start = max(start, end[d] + send_between(send, src, r))
        kind, c, cb, kind_b = nodes[i, N_KIND], nodes[i, N_CHUNK], nodes[i, N_CHUNK_B], nodes[i, N_KIND_B]
        d = node_time(passes[r], kind, c, cb, kind_b)
        if kind == K_F and first[r, 0] < 0.0:
            d -= unwaited       # no backward before it: no reduce-scatter to wait for
        g_chunk = c if kind != K_FB else cb
        if shared:
            alone = d
            d = queue_node(port[r, g_chunk], queue, owed, r, kind, kind_b, start, d)
            added[r] += d - alone
        end[i] = start + d
        free[r] = end[i] + (held_send(plan, send, r, kind == K_F, c) if holds else 0.0)
        busy[r] += d
        if kind == K_B or kind == K_W or (kind == K_FB and kind_b == K_B):
            g = grad[r, g_chunk]
            g[0], g[1], g[2] = end[i], d, kind
            if first[r, 0] < 0.0:
                first[r, 0], first[r, 1], first[r, 2] = start, d, g_chunk
    return free.max(), busy, grad, first, added


@numba.njit(cache=True)
def period(plan, passes, send):
    """Seconds one more microbatch adds to a long step (module docstring); per rank its work per
    microbatch, and the seconds its sends hold it (``fast.timing._held``)."""
    pp, vpp = plan.pp, plan.vpp
    work, held = np.zeros(pp), np.zeros(pp)
    split = plan.schedule >= ZB_H1 and plan.schedule != DUALPIPEV and plan.schedule != LOOPED_BFS  # I and W
    for r in range(pp):
        for c in range(vpp):
            p = passes[r, c]
            work[r] += p[P_F] + (p[P_I] + p[P_W] if split else p[P_B])
        held[r] = _held(plan, send, r)
        if plan.schedule == DUALPIPEV and vpp == 2:
            p = passes[r]
            work[r] = (overlapped_time(p[0, P_F] - p[0, P_F_COMM], p[0, P_F_COMM], p[1, P_B] - p[1, P_B_COMM],
                                       p[1, P_B_COMM])
                       + overlapped_time(p[1, P_F] - p[1, P_F_COMM], p[1, P_F_COMM], p[0, P_B] - p[0, P_B_COMM],
                                         p[0, P_B_COMM]))
    if plan.schedule != LOOPED_BFS:
        return (work + held).max(), work, held
    slope = 0.0
    for c in range(vpp):
        slope += passes[:, c, P_F].max() + passes[:, c, P_B].max()
    return slope, work, held


@numba.njit(cache=True)
def plan_time_split(out, plan, lrow, hrow, ranks, send, sync, nodes, m_played):
    """``fast.timing.plan_time`` for a schedule timed by its graph ``nodes`` of ``m_played``
    microbatches (``fast.dag``): step time, pipeline time, bubble and exposed communication;
    ``send`` the plan's send rows (``fast.ranks``)."""
    t = _plan_terms(plan, lrow, hrow, ranks)
    shared, q = layer_queues(t, lrow, ranks)
    passes = pass_times(plan, t, lrow, hrow, ranks, shared, q)
    # a first forward waits for no reduce-scatter: ZeRO-3's gather (ZeRO-2's TP collectives
    # queue on the port node by node, ``queue_node``)
    unwaited = zero3_unwaited(t)
    makespan, busy, grad, first, added = play(plan, nodes, passes, send, port_rows(plan, t, lrow, ranks, shared, q),
                                              unwaited)
    slope, work, held = period(plan, passes, send)
    # the port's waits and owed compute, per microbatch played
    work += added / m_played
    slope = (work + held).max() if plan.schedule != LOOPED_BFS else slope + (added / m_played).max()
    extra = plan.m - m_played
    t_pipe = makespan + extra * slope
    step, exposed_dp, busy_all = 0.0, 0.0, 0.0
    tp_total, sends = 0.0, 0.0
    on_host = plan.offload != OFF_NONE
    ready, post = np.empty(plan.pp), np.empty(plan.pp)
    for r in range(plan.pp):
        for c in range(plan.vpp):
            grad[r, c, 0] += extra * slope
        ready[r], post[r] = _ready(plan, ranks, t, sync, r, grad[r], passes[r], slope, first[r])
    tie_embedding(plan, ranks, ready)
    for r in range(plan.pp):
        if on_host and (t.zero3 or t.zero2):
            ready[r] += ranks[r, t.opt_block + S_GRADS_DOWN]          # the accumulated gradient shard
        end_r = grad[r, :, 0].max()
        opt = ranks[r, t.opt_block + S_OPT_STEP]
        if on_host:
            opt += ranks[r, t.opt_block + S_PARAMS_UP]          # the updated parameter shard comes back
        else:
            busy_all += opt
        step = max(step, ready[r] + opt + post[r])
        exposed_dp += ready[r] - end_r + post[r] + blocked_exposed(plan, ranks, t, r)
        busy_all += busy[r] + extra * work[r]
        for c in range(plan.vpp):
            tp_total += passes[r, c, P_F_COMM] + passes[r, c, P_I_COMM]
        if r < plan.pp - 1:
            sends += send[r]
    out[O_STEP] = step
    out[O_PIPE] = t_pipe
    # idle share of the step, >= 0 (the difference can round below zero when no rank idles)
    out[O_BUBBLE] = max(0.0, 1.0 - busy_all / (plan.pp * step)) if step > 0 else 0.0
    out[O_TP] = plan.m * tp_total / plan.pp
    out[O_DP] = exposed_dp / plan.pp
    out[O_PP] = (plan.m + 1.0) * sends / plan.pp


@numba.njit(cache=True)
def _ready(plan, ranks, t, sync, r, grad, passes, slope, first):
    """(when rank r's gradients are reduced, the DP parameter traffic after its step), its chunks'
    last gradient passes ending at ``grad[c, 0]`` after ``grad[c, 1]`` seconds (``fast.timing.
    _gradients_ready`` with the graph's times)."""
    end_r = grad[:, 0].max()
    if t.zero2 and t.block_scatter > 0.0:       # blocking: as ``fast.dp_end._gradients_ready``
        return end_r, blocked_zero2_post(ranks, t, r)
    if t.zero2:
        last = 0
        for c in range(plan.vpp):
            if grad[c, 0] > grad[last, 0]:
                last = c
        # the DP stream's work starts with the first reduce-scatter: after the first layer of
        # the rank's first gradient pass (the graph's, however far the schedule defers its Ws)
        window = end_r - first[0] - first[1] / max(ranks[r, R_CHUNK + int(first[2])], 1.0)
        return (_scatter_end(plan, ranks, t, r, ranks[r, R_CHUNK + last], end_r, window),
                ranks[r, R_COMM + C_AG_ALL])
    if t.zero3:
        return end_r + t.scatter, 0.0
    if plan.dp == 1:
        return end_r, 0.0
    sync_all, sync_last, post = _sync_rounds(ranks[r, R_COMM:R_STEP], plan.zero, plan.dp_impl)
    if not sync.overlap:
        return end_r + sync_all, post
    n = ranks[r, R_PARAMS]
    done = -1e300
    order = np.argsort(grad[:, 0])
    for c in order:
        L = ranks[r, R_CHUNK + c]
        share = L * t.layer_params
        first_layer = t.b_layer if grad[c, 2] != K_W else passes[c, P_W] / max(L, 1.0)
        tail = sync_last
        if ranks[r, R_LAST] == c:
            share += t.head_params
        if r == 0 and c == 0:
            share += t.emb_params
            tail = max(sync_last, sync_all * t.emb_params / n) if n > 0 else sync_last
        duration = sync_all * share / n if n > 0 else 0.0
        done = max(max(done, grad[c, 0] - grad[c, 1] + first_layer) + duration, grad[c, 0] + tail)
    return done, post
