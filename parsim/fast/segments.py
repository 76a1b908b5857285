"""Where a layer's TP collectives sit in its compute, for the fast path's layer rows
(``fast.tables``): what a port shared by the layer's TP collectives and its ZeRO-3 traffic sees
at the start of a layer (``costs.overlap``).

The SimPy engine cuts a layer's ops into compute segments after each op a TP collective follows
(``sim.compute._chain``; ``Collective.after`` names the op, "" the chain's start); the compute
blocks between the calls are ``costs.timing.compute_before``'s, and a call is priced in situ as
``fast.tables._tp_seconds`` prices them all.
"""
from __future__ import annotations

from parsim.costs import layer_ops, rerun, tp_collectives_per_layer
from parsim.costs import timing
from parsim.costs.stack import tp_covered
from parsim.specs import ClusterSpec, ModelSpec, Plan

from .comm import tp_group_ranks


def compute_before_first_collective(cluster: ClusterSpec, model: ModelSpec, plan: Plan, phase: str, ops) -> float:
    """Compute seconds of a layer's forward ("fwd") or backward ("bwd", ops reversed) before
    its first TP collective (``Collective.after`` names the op it follows; "" = layer start):
    how long a collective's port stays free for other traffic at the start of a layer."""
    colls = tp_collectives_per_layer(model, plan, phase)
    if not colls:
        return sum(timing.op_time(cluster.device, op, phase, plan.dtype) for op in ops)
    first = colls[0].after
    order = ops if phase == "fwd" else list(reversed(ops))
    total = 0.0
    if first == "":
        return total
    for op in order:
        total += timing.op_time(cluster.device, op, phase, plan.dtype)
        if op.name == first:
            break
    return total


def backward_lead(cluster: ClusterSpec, model: ModelSpec, plan: Plan, host_ranks: int | None = None,
                  rerun_full: bool = False) -> tuple[float, float]:
    """(seconds of a layer's first backward TP collective, compute seconds between it and the
    second): on a port shared with ZeRO-3 traffic the next layer's all-gather runs beside
    that compute (``costs.overlap.zero3_backward_layer``). ``rerun_full``: the backward starts
    with the fully re-run forward (``costs.rerun``), whose collectives come first. (0, 0)
    without two TP collectives. The collective priced in situ after its compute block, less
    what the stack hides behind the weight-gradient GEMM (``costs.stack.tp_covered``), as the
    engine's TP segment."""
    ops = layer_ops(model, plan)
    if rerun_full:
        order, colls = rerun(model, plan, "full")
        phase = "fwd"
    else:
        order, colls, phase = ops[::-1], tp_collectives_per_layer(model, plan, "bwd"), "bwd"
    if len(colls) < 2:
        return 0.0, 0.0
    blocks = timing.compute_before(cluster.device, order, colls, phase, plan.dtype)
    first = colls[0]
    seconds = timing.collective_time(cluster, first.op, first.nbytes, tp_group_ranks(1, plan.tp, 1), True, host_ranks,
                                     blocks[0])
    return max(seconds - tp_covered(cluster.device, ops, first.after, phase, plan.dtype), 0.0), blocks[1]
