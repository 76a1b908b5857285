"""ZeRO collectives beside compute, in closed form: how long a layer takes when its DP traffic
shares the device's port with its TP collectives, and how much compute runs while a ZeRO
collective is on the wire.

The SimPy engine plays these out event by event: ``sim.actions`` issues a layer's ZeRO-3
all-gather (prefetched one layer ahead) and reduce-scatter, and ZeRO-2's per-part
reduce-scatters (``zero2_scatters``), on the device's DP stream; a port carries one transfer at a
time, first come first served (``sim.network.Port``), so on a port shared with TP the layer's
next TP collective queues behind them; and each collective charges the compute that ran beside
it, ``costs.stack.comm_compute_slowdown`` x that overlap, to the rank's ``ComputeLedger``
(``costs.host``), which pays it before the rank's next action. The fast path (``fast.timing``,
``fast.split_timing``) adds the same debt per layer and per backward with these rules; they are
plain arithmetic, so numba compiles them into its kernels (``fast.rules``).

Seconds throughout.
"""
from __future__ import annotations


def scatter_overlap(scatters: float, compute: float, slowdown: float) -> float:
    """Compute seconds that run beside one backward's ZeRO-2 reduce-scatters: ``scatters``
    seconds of them queue on the DP stream as the backward completes each part's gradients
    (``sim.actions.zero2_scatters``), while the rank goes on computing ``compute`` seconds per
    microbatch (its forward and backward, where the next action follows at once). The compute
    they slow (``slowdown`` s owed per s of compute beside them, ``costs.stack.
    comm_compute_slowdown``) is compute too, and runs beside them as well: the ledger
    (``ComputeLedger.collective``) charges on the rank's busy time, the owed seconds in. Busy
    time b = compute + slowdown x min(scatters, b) gives min(scatters, compute / (1 - slowdown))
    beside them (slowdown < 1: each second beside a collective does 1 - slowdown seconds of
    the work alone)."""
    if slowdown >= 1.0:
        return scatters
    return min(scatters, compute / (1.0 - slowdown))


def paid_beside_drain(owed: float, drain: float) -> float:
    """Seconds of a rank's owed compute that run while the DP transfers of the action before
    drain: the SimPy engine pays the debt (``ComputeLedger.pay``) at the start of the rank's
    next action (``sim.device``), before that action issues anything on the DP stream, while
    the reduce-scatters the last one queued there are still going (ZeRO-3: its last layer's and
    its root unit's, ``sim.actions``). So the next action's first all-gather starts after
    max(owed, drain) seconds, not their sum: min(owed, drain) of them overlap. The payment is
    a plain wait, not compute the ledger logs, so it owes nothing itself."""
    return min(owed, drain)


def queued_behind(transfer: float, pre: float) -> tuple[float, float]:
    """(seconds a TP collective waits, compute seconds beside the transfer) where a DP transfer
    of ``transfer`` seconds takes the port the TP collectives use and the rank computes ``pre``
    seconds before asking for it (``sim.network.Port``, first come first served): ZeRO-2's
    reduce-scatters ahead of the next layer's, the next action's, or the first layer's first TP
    collective (``fast.timing._plan_terms``, ``fast.dp_end``)."""
    return max(0.0, transfer - pre), min(pre, transfer)


def zero3_forward_layer(f_layer: float, pre: float, gather: float, h2d: float, shared: bool) -> tuple[float, float]:
    """(seconds between the starts of two forward layers, bounded by the DP stream; compute
    seconds beside the ZeRO-3 all-gather) for a forward layer of ``f_layer`` seconds while the
    next layer's all-gather (``h2d`` seconds over PCIe with parameter offload, then ``gather``
    on the port) runs from its start (``sim.actions._enter_layer``). On its own port the whole
    layer's compute runs beside the gather: min(f_layer, h2d + gather). On the port the layer's
    TP collectives use, the first of them (after ``pre`` seconds of compute) waits for the
    gather: the layer takes the gather and the rest of the layer after it, and only
    min(pre, gather) of compute runs beside it."""
    if shared:
        return max(gather + h2d, gather + f_layer - pre), min(pre, gather)
    return gather + h2d, min(f_layer, h2d + gather)


def zero3_backward_layer(b_layer: float, pre: float, tp1: float, mid: float, gather: float, h2d: float,
                         scatter: float, shared: bool) -> tuple[float, float]:
    """(seconds between the starts of two backward layers, bounded by the DP stream; compute
    seconds beside the layer's ZeRO-3 collectives) for a backward layer of ``b_layer`` seconds
    whose DP stream runs, from its start, the previous layer's reduce-scatter (``scatter``) and
    then the next layer's all-gather (``h2d`` seconds over PCIe with parameter offload, then
    ``gather`` on the port): ``sim.actions._segment_done`` / ``_enter_layer``.

    On its own port: the stream's gather + scatter, all of the layer's compute beside them.
    On the port its TP collectives use (``sim.network.Port``, first come first served): the
    layer computes ``pre`` seconds, asks for the port for its first TP collective (``tp1``),
    which goes after the reduce-scatter; the gather asks when the stream reaches it, after
    the collective that asked first; the ``mid`` seconds of compute up to the second TP
    collective run beside the gather, which that collective then waits for; the rest of the
    layer follows. A gather that asks after the second TP collective (a long host-to-device
    copy first) runs beside the rest of the layer. With ``tp1 = mid = 0`` and no copy this is
    the stream's work, then all of the layer after ``pre``. ZeRO-2 on a shared port is the
    case without a gather (``gather = h2d = 0``: ``fast.timing._plan_terms``)."""
    if not shared:
        return h2d + gather + scatter, min(b_layer, h2d + gather + scatter)
    if pre > scatter + h2d:                 # the gather takes the port before the first TP collective
        start = scatter + h2d
        end = start + gather
        return max(pre, end) + b_layer - pre, scatter + max(0.0, min(pre, end) - start)
    first = max(pre, scatter) + tp1         # the first TP collective is through; ``mid`` starts
    rest = b_layer - pre - tp1              # the layer after its first TP collective
    if scatter + h2d > first + mid:         # the second TP collective asks first: the gather goes later
        start = scatter + h2d               # (a later collective of the layer may wait for it: left out)
        return max(first + rest, start + gather), min(pre, scatter) + min(gather, max(0.0, first + rest - start))
    start = max(scatter + h2d, first)       # the gather's turn on the port, before the second one's
    end = start + gather
    period = max(first + mid, end) + rest - mid
    return period, min(pre, scatter) + max(0.0, min(first + mid, end) - max(first, start))
