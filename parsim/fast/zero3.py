"""ZeRO-3 actions in closed form (numba): an action's layers chained behind their DP stream,
its root unit, and the compute it owes paid while the last reduce-scatters drain.

What the SimPy engine plays out (``sim.actions``): an action gathers its root unit (embedding /
head) first, then walks its layers, asking for each layer's all-gather and the next one's on
entering it (prefetch one layer ahead, ``sim.actions._enter_layer``), and in a backward
reduce-scatters each layer's gradients once its compute is done; all on the device's DP stream,
one transfer at a time. The compute that ran beside those collectives is owed
(``costs.stack.comm_compute_slowdown``, ``ComputeLedger``) and paid at the next action's start.
Seconds throughout.
"""
from __future__ import annotations

import numba

from .comm import C_Z3_ROOT_GATHER, C_Z3_ROOT_SCATTER
from .rules import paid_beside_drain, zero3_backward_layer, zero3_forward_layer
from .tables import L_MID_BWD, L_PRE_BWD, L_PRE_FWD, L_TP1_BWD


@numba.njit(cache=True, inline="always")
def layer_periods(lrow, f_layer, b_layer, gather, h2d, scatter, shared, slowdown, owed_gather, owed_scatter):
    """A layer's DP-bound periods and the compute its collectives cost it: (forward period,
    ``zf``, backward period, ``zb``, a backward's second layer's period, ``PlanTerms.b_second``)
    for a layer of ``f_layer`` / ``b_layer`` seconds (``lrow``: its row of ``fast.tables``) whose
    gather takes ``h2d`` + ``gather`` and reduce-scatter ``scatter`` seconds (``costs.overlap``:
    on a ``shared`` port a layer's first TP collective queues behind the DP transfers issued at
    its start); ``slowdown`` x the compute beside them is owed."""
    f_stream, beside_f = zero3_forward_layer(f_layer, lrow[L_PRE_FWD], gather, h2d, shared)
    b_stream, beside_b = zero3_backward_layer(b_layer, lrow[L_PRE_BWD], lrow[L_TP1_BWD], lrow[L_MID_BWD],
                                              gather, h2d, scatter, shared)
    b_second = b_stream if shared else h2d + gather
    if not shared:
        # FSDP2's copies are owed too, paid after the layer (``sim.actions.fsdp_copy``): a layer
        # its own DP stream bounds takes them on top of the stream's period (on a shared port
        # the period holds the layer's compute, copies in)
        f_stream += owed_gather
        b_stream += owed_gather + owed_scatter
        b_second += owed_gather + owed_scatter
    return f_stream, slowdown * beside_f, b_stream, slowdown * beside_b, b_second


@numba.njit(cache=True)
def root_unit(zero3: bool, c, forward: bool) -> float:
    """ZeRO-3: the rank's root unit (embedding / head), gathered before its forward, gathered
    again and reduce-scattered around its backward, blocking (``sim.actions.run_stepped``)."""
    if not zero3:
        return 0.0
    return c[C_Z3_ROOT_GATHER] + (0.0 if forward else c[C_Z3_ROOT_SCATTER])


@numba.njit(cache=True)
def chained(layers: float, chunks: int, first_wait: float, per_layer: float, stream: float) -> float:
    """An action of ``layers`` layers split in ``chunks`` actions, each waiting ``first_wait``
    for its first layer, then running layers at max(compute, DP stream) each (the last
    layer's compute runs after the last transfer)."""
    if layers <= 0:
        return 0.0
    return chunks * (first_wait + per_layer) + (layers - chunks) * max(per_layer, stream)


@numba.njit(cache=True)
def chained_backward(layers: float, chunks: int, first_wait: float, per_layer: float, second: float,
                      stream: float) -> float:
    """``chained`` for a ZeRO-3 backward: its first two layers' gathers are asked for together
    (prefetch one layer ahead, ``sim.actions._enter_layer``), so the second layer's waits for
    no reduce-scatter; it starts ``second`` after the first (``PlanTerms.b_second``), the
    others ``stream`` after the one before, each chunk alike."""
    if layers <= 0:
        return 0.0
    n2 = min(float(chunks), layers - chunks)
    return (chunks * (first_wait + per_layer) + n2 * max(per_layer, second)
            + (layers - chunks - n2) * max(per_layer, stream))


@numba.njit(cache=True, inline="always")
def chunk_paid(t, L, root):
    """ZeRO-3 with the compute slowdown: seconds of one backward action's debt (its ``L`` layers'
    ``zb`` and FSDP2 copies) paid while its last reduce-scatters drain (``costs.overlap.
    paid_beside_drain``): the layer's, which the next action's first gather waits for where
    ``PlanTerms.f_wait`` (a forward after a backward) or ``b_wait`` (a backward after one) counts
    it, and ``root`` seconds of the root unit's where the action's chunk holds it."""
    owed = L * (t.zb + t.owed_gather + t.owed_scatter)
    scatter = t.f_wait + t.b_wait - 2.0 * t.gather         # the waits' reduce-scatter, if they count one
    if not t.zero3 or owed <= 0.0 or scatter <= 0.0:
        return 0.0
    return paid_beside_drain(owed, scatter + root)


@numba.njit(cache=True, inline="always")
def drain_paid(plan, t, c, L):
    """``chunk_paid`` per microbatch over a rank's ``L`` layers in ``vpp`` chunks, the root unit
    (the rank's ``c`` row) on one of them."""
    per = L / plan.vpp
    return (plan.vpp - 1) * chunk_paid(t, per, 0.0) + chunk_paid(t, per, c[C_Z3_ROOT_SCATTER])


@numba.njit(cache=True)
def split_owed(t, i_layer: float, w_layer: float, pre: float) -> tuple[float, float]:
    """Split backwards: the compute a layer of I (``i_layer`` s; its first TP collective after
    ``pre``) and of W (``w_layer``) owe for the ZeRO-3 collectives beside them, as ``PlanTerms.zf``
    / ``zb`` are F's and B's: I gathers the layers' weights (a forward's traffic, ``costs.overlap.
    zero3_forward_layer``), W reduce-scatters their gradients (``zero3_backward_layer`` without a
    gather, the port taken as the DP stream's own: min(W, scatter))."""
    if not t.zero3 or t.slowdown <= 0.0:
        return 0.0, 0.0
    beside_i = zero3_forward_layer(i_layer, pre, t.gather - t.h2d, t.h2d, t.shared)[1]
    beside_w = zero3_backward_layer(w_layer, 0.0, 0.0, 0.0, 0.0, 0.0, t.scatter, False)[1]
    return t.slowdown * beside_i, t.slowdown * beside_w
