"""Closed-form step time of a 1F1B / interleaved plan from parsim.costs (a cross-check of
the SimPy engine, and a stand-in until it lands).

Per pipeline rank and microbatch: forward + backward (+ recomputed forward) of its layers,
with Megatron-LM's TP collectives exposed (not overlapped in Megatron-LM 2021), blocking
p2p at every virtual-stage boundary, then the pipeline's fill/drain:
    step = (m + (p - 1) / v) * t_stage          (Narayanan et al. 2021, Sec. 2.2.2)
followed by the DP gradient all-reduce (not overlapped in Megatron-LM 2021) and Adam.
"""
from __future__ import annotations

from parsim.costs import (dp_grad_bytes, embedding_ops, head_ops, layer_ops, p2p_bytes, stage_params,
                          tp_collectives_per_layer)
from parsim.costs import timing
from parsim.specs import ClusterSpec, ModelSpec, Plan, RankLayout, stage_layers


def _ops_time(cluster: ClusterSpec, ops, pass_: str, dtype: str) -> float:
    return sum(timing.op_time(cluster.device, op, pass_, dtype) for op in ops)


def _tp_time(cluster: ClusterSpec, model: ModelSpec, plan: Plan, phase: str) -> float:
    group = list(range(plan.tp))
    return sum(timing.collective_time(cluster, c.op, c.nbytes, group)
               for c in tp_collectives_per_layer(model, plan, phase))


def step_time(model: ModelSpec, plan: Plan, cluster: ClusterSpec) -> float:
    dt = plan.dtype
    ops = layer_ops(model, plan)
    fwd = _ops_time(cluster, ops, "fwd", dt) + _tp_time(cluster, model, plan, "fwd")
    bwd = _ops_time(cluster, ops, "bwd", dt) + _tp_time(cluster, model, plan, "bwd")
    recompute = fwd if plan.recompute == "full" else 0.0
    per_layer = fwd + bwd + recompute
    layers = stage_layers(model, plan)
    v = plan.vpp
    per_rank = [sum(layers[r + i * plan.pp] for i in range(v)) * per_layer for r in range(plan.pp)]
    emb = embedding_ops(model, plan)
    head = head_ops(model, plan)
    per_rank[0] += _ops_time(cluster, emb, "fwd", dt) + _ops_time(cluster, emb, "bwd", dt)
    per_rank[-1] += _ops_time(cluster, head, "fwd", dt) + _ops_time(cluster, head, "bwd", dt)
    layout = RankLayout(plan.dp, plan.tp, plan.pp)
    if plan.pp > 1:
        src, dst = layout.rank(0, 0, 0), layout.rank(1, 0, 0)
        p2p = timing.p2p_time(cluster, p2p_bytes(model, plan), src, dst)
        per_rank = [t + 2 * v * p2p for t in per_rank]
    t_stage = max(per_rank)
    m = plan.num_microbatches
    if v > 1:
        pipe = (m + (plan.pp - 1) / v) * t_stage
    else:   # 1F1B: m steps of the slowest rank plus the others' fill and drain
        pipe = (m - 1) * t_stage + sum(per_rank)
    dp = opt = 0.0
    for r in range(plan.pp):
        group = [layout.rank(r, d, 0) for d in range(plan.dp)]
        dp = max(dp, timing.collective_time(cluster, "all_reduce", dp_grad_bytes(model, plan, r), group))
        opt = max(opt, timing.optimizer_time(cluster, stage_params(model, plan)[r], dt))
    return pipe + dp + opt
