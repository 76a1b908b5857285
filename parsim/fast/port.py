"""ZeRO-2's reduce-scatters on the port the TP collectives use, for the schedules timed by their
action graph (numba; ``fast.split_timing``): each layer's first TP collective waits for the
reduce-scatter of the layer before it, a pass's first for those its rank queued before it
(``sim.network.Port``, first come first served), and the compute beside them is owed at the
stack's slowdown (``sim.device``: the ledger paid before the next action). Seconds throughout.
"""
from __future__ import annotations

import numba
import numpy as np

from .comm import C_Z2_EMB, C_Z2_HEAD, C_Z3_SCATTER
from .dag import K_B, K_F, K_FB, K_W
from .ranks import R_CHUNK, R_COMM, R_LAST, R_STEP
from .rules import queued_behind, zero3_backward_layer
from .tables import L_BWD_W, L_MID_BWD, L_PRE_BWD, L_PRE_FWD, L_TP1_BWD, L_TP_W_RECOMPUTE, L_W_RECOMPUTE

# per (rank, chunk), ZeRO-2 on the port the TP collectives use (``port_rows``): on; compute
# before a forward's / backward's first TP collective; the chunk's layers; its reduce-scatters'
# seconds and its last one's; compute owed per second beside them; compute beside one in a
# backward layer with TP collectives; whether the chunk's W has TP collectives (the first
# stage's, its whole backward; a W that re-runs a recomputed forward); compute before a W
# layer's first and beside a scatter in a W layer
P_ON, P_PRE_F, P_PRE_B, P_LAYERS, P_SCATTERS, P_EACH, P_SLOW, P_INNER, P_WHOLE_W, P_PRE_W, P_INNER_W, PORT_WIDTH = \
    range(12)


# ``layer_queues``: seconds a backward layer / a W layer waits on the port behind the layer
# before's reduce-scatter, and the compute beside that scatter (all 0 off the shared port)
Q_B, Q_B_BESIDE, Q_W, Q_W_BESIDE = range(4)


@numba.njit(cache=True)
def layer_queues(t, lrow, ranks):
    """ZeRO-2 on the TP collectives' port (``fast.timing._plan_terms``): in a pass with TP
    collectives, each layer's first waits for the reduce-scatter of the layer before it
    (``costs.overlap.zero3_backward_layer`` without a gather): a backward layer's after
    ``L_PRE_BWD``, a W layer's that re-runs its recomputed forward after ``L_PRE_FWD`` (a W
    without TP collectives waits for none). (whether the scatters take that port, the
    ``Q_*`` tuple: zeros where they do not)."""
    if not (t.zero2 and t.shared and t.block_scatter == 0.0):
        return False, (0.0, 0.0, 0.0, 0.0)
    each = ranks[0, R_COMM + C_Z3_SCATTER]
    b_period, b_beside = zero3_backward_layer(t.b_layer, lrow[L_PRE_BWD], lrow[L_TP1_BWD], lrow[L_MID_BWD],
                                              0.0, 0.0, each, True)
    w_wait, w_beside = 0.0, 0.0
    if lrow[L_TP_W_RECOMPUTE] > 0.0:
        w_layer = lrow[L_BWD_W] + lrow[L_W_RECOMPUTE] + lrow[L_TP_W_RECOMPUTE]
        w_period, w_beside = zero3_backward_layer(w_layer, lrow[L_PRE_FWD], 0.0, 0.0, 0.0, 0.0, each, True)
        w_wait = max(0.0, w_period - w_layer)
    return True, (max(0.0, b_period - t.b_layer), b_beside, w_wait, w_beside)


@numba.njit(cache=True)
def port_rows(plan, t, lrow, ranks, shared, q):
    """(pp, vpp, PORT_WIDTH) rows of ``fast.split_timing.play``'s port queue (``q`` the plan's
    ``layer_queues``); one row of zeros where ZeRO-2's reduce-scatters do not take the TP
    collectives' port."""
    if not shared:
        return np.zeros((1, 1, PORT_WIDTH))
    port = np.zeros((plan.pp, plan.vpp, PORT_WIDTH))
    w_tp = lrow[L_TP_W_RECOMPUTE] > 0.0
    for r in range(plan.pp):
        c = ranks[r, R_COMM:R_STEP]
        for k in range(plan.vpp):
            first, last = r == 0 and k == 0, ranks[r, R_LAST] == k
            row = port[r, k]
            row[P_ON], row[P_PRE_F], row[P_PRE_B] = 1.0, lrow[L_PRE_FWD], lrow[L_PRE_BWD]
            row[P_LAYERS] = max(ranks[r, R_CHUNK + k], 1.0)
            row[P_SCATTERS] = ranks[r, R_CHUNK + k] * c[C_Z3_SCATTER] + (c[C_Z2_EMB] if first else 0.0) \
                + (c[C_Z2_HEAD] if last else 0.0)
            row[P_EACH] = c[C_Z2_EMB] if first else c[C_Z3_SCATTER]
            row[P_SLOW], row[P_INNER], row[P_WHOLE_W] = t.slowdown, q[Q_B_BESIDE], 1.0 if first or w_tp else 0.0
            row[P_PRE_W], row[P_INNER_W] = ((lrow[L_PRE_BWD], q[Q_B_BESIDE]) if first
                                            else (lrow[L_PRE_FWD], q[Q_W_BESIDE]))
    return port


@numba.njit(cache=True)
def queue_node(q, queue, owed, r, kind, kind_b, start, d):
    """``fast.split_timing.play``'s node of ``d`` seconds on rank r starting at ``start`` where
    ZeRO-2's scatters take the TP collectives' port (``q`` its chunk's ``port_rows`` row): the
    compute it owes first (``sim.device``: the ledger paid before an action), its first TP
    collective's wait behind the queued scatters (a W has none, but the first stage's, its whole
    backward, and one that re-runs a recomputed forward), then its own scatters queued; the
    compute beside the queue owes ``P_SLOW`` per second. Returns the node's seconds; updates the
    rank's ``queue`` end and ``owed``."""
    if d <= 0.0:
        return d
    paid, behind = owed[r], max(0.0, queue[r] - start)
    owed[r] = 0.0
    scatters = kind == K_W or kind == K_B or (kind == K_FB and kind_b == K_B)
    with_tp = kind != K_W or q[P_WHOLE_W] > 0.0
    if with_tp:
        pre = q[P_PRE_W] if kind == K_W else (q[P_PRE_F] if kind == K_F or kind == K_FB else q[P_PRE_B])
        wait, beside = queued_behind(behind, paid + pre)
        d += paid + wait
        if scatters:        # its layers' scatters queue behind their next layer's TP collectives
            beside += (q[P_LAYERS] - 1.0) * (q[P_INNER_W] if kind == K_W else q[P_INNER])
    else:
        d += paid
    end = start + d
    if scatters:
        # issued as the pass completes each layer's gradients: the first after one layer, the
        # last at its end
        queue[r] = max(max(queue[r], end - (d - paid) * (1.0 - 1.0 / q[P_LAYERS])) + q[P_SCATTERS],
                       end + q[P_EACH])
    if not with_tp:
        beside = min(d, queue[r] - start)
    owed[r] = q[P_SLOW] * beside
    return d
