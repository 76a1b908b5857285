"""The analytic cost graph of a parsim ModelSpec decoder (torch-free).

One node per transformer layer, plus the embedding before and the output head after, priced
with the same cost model the simulator uses: ops from ``parsim.costs.ops`` (TP/SP applied),
durations from ``parsim.costs.timing.op_time``, parameters from ``parsim.costs.params``,
activations from Korthikanti et al. 2022 (``parsim.costs.activations``). So a partition found
on this graph is judged by the same numbers the simulator plays. With tp > 1 a layer also
pays its Megatron-LM TP collectives (``tp_collectives_per_layer``), and the vocab-parallel
embedding / output layer one b*s*h all-reduce each (forward after the lookup, backward into
the logits' input; Shoeybi et al. 2019, Sec. 3), all counted as exposed (no overlap).
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.costs import (embedding_activation_bytes, embedding_ops, embedding_params,
                          head_activation_bytes, head_ops, head_params, layer_activation_bytes, layer_ops,
                          layer_params, layer_tensors, microbatch_activation_bytes, recomputed_ops, rerun,
                          tp_collectives_per_layer)
from parsim.costs.activations import backward_working_bytes, stage_output_bytes
from parsim.costs.host import dram_weight, rank_cache_bytes
from parsim.costs.memory import gathered_bytes
from parsim.costs.params import embedding_largest_tensor, head_largest_tensor
from parsim.costs.stack import tp_covered
from parsim.costs.timing import collective_time, op_time
from parsim.specs import ClusterSpec, DeviceProfile, ModelSpec, Plan, RankLayout

from .graph import CostGraph, CostNode


@dataclass(frozen=True)
class PassTimes:
    """Seconds of a group of ops per pass, and the memory-bound part of each (what a shared
    host slows by its streaming contention, ``costs.host``; the rest is GEMM/attention)."""
    fwd: float = 0.0
    bwd: float = 0.0
    fwd_membound: float = 0.0
    bwd_membound: float = 0.0


def pass_times(device: DeviceProfile, ops, dtype: str, recompute_core: bool = False,
               cache_bytes: float | None = None) -> PassTimes:
    """``op_time`` summed over ``ops`` per pass. ``recompute_core``: selective recomputation
    re-runs the attention core in backward (Korthikanti et al. 2022, Sec. 5). The memory-bound
    parts are the seconds a shared host slows by its memory-bound factor, as the SimPy engine
    splits them (``costs.host.dram_weight`` with ``cache_bytes``, a rank's share of the
    last-level cache: ``costs.host.rank_cache_bytes``; None: every memory-bound op whole)."""
    fwd = [(op, "fwd") for op in ops]
    bwd = [(op, "bwd") for op in ops] + [(op, "fwd") for op in recomputed_ops(
        ops, "selective" if recompute_core else "none")]   # a re-run is priced as a forward

    def totals(pairs) -> tuple[float, float]:         # (all seconds, the memory-bound part): each op priced once
        priced = [(op_time(device, op, p, dtype), dram_weight(op, p, cache_bytes)) for op, p in pairs]
        return sum(t for t, _ in priced), sum(t * w for t, w in priced)
    (f, f_membound), (b, b_membound) = totals(fwd), totals(bwd)
    return PassTimes(f, b, f_membound, b_membound)


def _tp_times(model: ModelSpec, plan: Plan, cluster: ClusterSpec) -> tuple[float, float, float, float]:
    """Seconds of TP collectives: (layer forward, layer backward, one b*s*h all-reduce, the full
    re-run's: ``costs.rerun``); a backward one less what the stack hides behind the
    weight-gradient GEMM (``costs.stack.tp_covered``)."""
    if plan.tp == 1:
        return 0.0, 0.0, 0.0, 0.0
    group = RankLayout(plan.dp, plan.tp, plan.pp).tp_groups()[0]
    ops = layer_ops(model, plan)
    # synchronous TP collectives: priced in situ (timing.collective_time)
    def seconds(colls, p: str) -> float:
        return sum(max(collective_time(cluster, c.op, c.nbytes, group, in_situ=True)
                       - tp_covered(cluster.device, ops, c.after, p, plan.dtype), 0.0) for c in colls)
    fwd, bwd = (seconds(tp_collectives_per_layer(model, plan, p), p) for p in ("fwd", "bwd"))
    edge = collective_time(cluster, "all_reduce", microbatch_activation_bytes(model, plan), group, in_situ=True)
    return fwd, bwd, edge, seconds(rerun(model, plan, "full")[1], "fwd")


def analytic_graph(model: ModelSpec, plan: Plan, cluster: ClusterSpec) -> CostGraph:
    """Embedding, layers 0..L-1, head: per-device costs of one microbatch under ``plan``
    (its tp, sp, mbs, dtype; ``recompute=selective`` is folded into every layer; full and
    stage-aware recomputation are chosen per stage by the partitioner)."""
    selective = plan.recompute == "selective"
    policy = "selective" if selective else "none"
    # the residual stream between layers: b x s x h (s/t with sequence parallelism)
    boundary = stage_output_bytes(model, plan)
    dev, cache = cluster.device, rank_cache_bytes(cluster, plan.world_size)
    emb = pass_times(dev, embedding_ops(model, plan), plan.dtype, cache_bytes=cache)
    layer = pass_times(dev, layer_ops(model, plan), plan.dtype, recompute_core=selective, cache_bytes=cache)
    head = pass_times(dev, head_ops(model, plan), plan.dtype, cache_bytes=cache)
    tp_f, tp_b, tp_edge, tp_rerun = _tp_times(model, plan, cluster)
    rerun_s = pass_times(dev, rerun(model, plan, "full")[0], plan.dtype).fwd + tp_rerun
    L = model.layers
    nodes = [CostNode("embedding", emb.fwd + tp_edge, emb.bwd, boundary, embedding_activation_bytes(model, plan),
                      params=("embedding",), unit=-1, scope="embedding", fwd_membound_s=emb.fwd_membound,
                      bwd_membound_s=emb.bwd_membound, fwd_comm_s=tp_edge)]
    act = layer_activation_bytes(model, plan, policy)
    for i in range(L):
        nodes.append(CostNode(f"layers.{i}", layer.fwd + tp_f, layer.bwd + tp_b, boundary, act, params=(f"layers.{i}",),
                              inputs=(i,), unit=i, scope=f"layers.{i}", fwd_membound_s=layer.fwd_membound,
                              bwd_membound_s=layer.bwd_membound, fwd_comm_s=tp_f, bwd_comm_s=tp_b, rerun_s=rerun_s))
    nodes.append(CostNode("head", head.fwd, head.bwd + tp_edge, 0.0, head_activation_bytes(model, plan),
                          params=("head",), inputs=(L,), unit=-1, scope="head", fwd_membound_s=head.fwd_membound,
                          bwd_membound_s=head.bwd_membound, bwd_comm_s=tp_edge))
    numel = {"embedding": embedding_params(model, plan), "head": head_params(model, plan)}
    numel.update({f"layers.{i}": layer_params(model, plan.tp) for i in range(L)})
    largest = {"embedding": embedding_largest_tensor(model, plan), "head": head_largest_tensor(model, plan)}
    largest.update({f"layers.{i}": max(layer_tensors(model, plan.tp)) for i in range(L)})
    return CostGraph(
        name=model.name, nodes=tuple(nodes), param_numel=numel, param_largest=largest, output_inputs=(L + 1,),
        # a fully recomputed layer keeps only its input (Korthikanti 2022 Table 2: 2sbh)
        unit_checkpoint_bytes={i: layer_activation_bytes(model, plan, "full") for i in range(L)},
        layers=L, source="analytic",
        backward_working=lambda first, last, stash, transient, recomputed: backward_working_bytes(
            model, plan, first, last, stash, layer_extra=transient, recomputed_layers=recomputed),
        output_bytes=stage_output_bytes(model, plan), weight_grad_share=weight_grad_share(model, plan, cluster),
        gathered_bytes=gathered_bytes(model, plan))


def weight_grad_share(model: ModelSpec, plan: Plan, cluster: ClusterSpec) -> float:
    """A layer's weight-gradient ops' share of its backward (``timing.op_time`` of "bwd_weight"
    over "bwd"; ``costs.split_backward``)."""
    ops = layer_ops(model, plan)
    weight = sum(op_time(cluster.device, op, "bwd_weight", plan.dtype) for op in ops)
    total = sum(op_time(cluster.device, op, "bwd", plan.dtype) for op in ops)
    return weight / total if total > 0 else 0.5
