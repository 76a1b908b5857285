"""Which layers recompute their activations in backward, per virtual stage.

* ``full``: each layer keeps only its input and re-runs its forward in backward (Chen et al.
  2016; Megatron-LM ``--recompute-granularity full``).
* ``selective``: only the attention core is recomputed (Korthikanti et al. 2022, Sec. 5).
* ``stage-aware``: virtual stage v recomputes its first ``recompute_layers[v]`` layers fully
  and keeps the rest (Merak, Lai et al. 2023, Sec. 5.2); all of them when unset. The fewest
  that fit are found by ``fewest_recomputed`` (``costs.stage_aware``, ``partition.stage_cost``).
* ``shifted_critical_path``: the last pipeline rank recomputes nothing (Merak, Sec. 5.1).

The SimPy engine (``sim.compute``), the analytic memory (``costs.memory``), the partitioner,
the fast path's tables and the executor's ``apply_ac`` all take the policy from here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from parsim.specs import ModelSpec, Plan, plan_stack, stage_layers

from .ops import Op, layer_ops
from .placement import rank_of_stage

if TYPE_CHECKING:
    from .comm import Collective


def stage_policy(plan: Plan, vstage: int) -> str:
    """The recompute policy a virtual stage follows: the plan's, except ``none`` on the last
    pipeline rank under Merak's shifted critical path."""
    if plan.shifted_critical_path and plan.recompute != "none" and rank_of_stage(plan, vstage) == plan.pp - 1:
        return "none"
    return plan.recompute


def layer_recompute(plan: Plan, vstage: int, num_layers: int) -> list[tuple[int, str]]:
    """(layers, policy) groups of a virtual stage of ``num_layers`` layers, in layer order; each
    policy one of ``none``, ``full``, ``selective``."""
    policy = stage_policy(plan, vstage)
    if policy == "stage-aware":
        full = plan.recompute_layers[vstage] if plan.recompute_layers is not None else num_layers
        return [(full, "full"), (num_layers - full, "none")]
    return [(num_layers, policy)]


def stage_recompute(model: ModelSpec, plan: Plan, vstage: int) -> list[tuple[int, str]]:
    """``layer_recompute`` of one virtual stage of ``model`` (its ``stage_layers``)."""
    return layer_recompute(plan, vstage, stage_layers(model, plan)[vstage])


def recomputed_ops(ops: list[Op], policy: str, early_stop: bool = False) -> list[Op]:
    """The forward ops of a layer (``costs.layer_ops``, in order) that its backward re-runs first
    under a layer ``policy``: all of them under ``full`` (Chen et al. 2016; with their TP
    collectives, ``recomputes_collectives``) -- with ``early_stop`` (``stops_early``) all up to,
    not including, the MLP-down GEMM --, the attention core under ``selective`` (Korthikanti et
    al. 2022, Sec. 5), none under ``none``."""
    if policy == "full":
        if early_stop:
            names = [op.name for op in ops]
            return list(ops[:names.index("mlp_down")]) if "mlp_down" in names else list(ops)
        return list(ops)
    if policy == "selective":
        return [op for op in ops if op.attention_core]
    return []


def stops_early(model: ModelSpec, plan: Plan) -> bool:
    """Does a fully recomputed layer's re-run stop before its MLP-down GEMM? Non-reentrant
    ``torch.utils.checkpoint`` (``Stack.checkpoint_early_stop``) packs a GEMM's input before
    running it and raises its stop as soon as the region's last saved tensor is back: in a layer
    that is MLP-down's input (its output, the bias and the residual add save nothing), unless a
    dropout after it saves its mask. Measured on the executor's cpu-small layer (torch 2.13): the
    re-run issues one ``mm`` fewer; 1F1B pp=2 recompute=full adds 30-33 ms per microbatch to B
    against a 47-51 ms F. The executor turns it off for sub-pipelined TP (``executor/model.py``)."""
    return (plan_stack(plan).checkpoint_early_stop and not model.dropout and plan.tp_overlap != "subpipe")


def rerun(model: ModelSpec, plan: Plan, policy: str) -> tuple[list[Op], list["Collective"]]:
    """What a layer's backward re-runs first under a layer ``policy``: its forward ops
    (``recomputed_ops``, stopping early where ``stops_early``) and the forward TP collectives
    among them (``recomputes_collectives``: those after an op it runs; a collective after an op
    the re-run stops before is not issued). Every engine prices the re-run from this."""
    from .comm import tp_collectives_per_layer     # comm -> memory -> this module: imported here

    ops = recomputed_ops(layer_ops(model, plan), policy, stops_early(model, plan))
    if not recomputes_collectives(policy):
        return ops, []
    names = {op.name for op in ops}
    return ops, [c for c in tp_collectives_per_layer(model, plan, "fwd") if c.after in names]


def recomputes_collectives(policy: str) -> bool:
    """Does the re-run forward repeat the layer's TP collectives? Only a full recomputation
    (Megatron-LM's checkpointed forward; Korthikanti et al. 2022, Sec. 3): the attention core
    has none inside it."""
    return policy == "full"


def recomputes_fully(groups: list[tuple[int, str]]) -> bool:
    """Does some layer of these (layers, policy) groups (``layer_recompute``) re-run its whole
    forward?"""
    return any(policy == "full" and n for n, policy in groups)


def fewest_recomputed(most: int, bytes_with: Callable[[int], float], budget: float) -> int | None:
    """The least k in 0..``most`` with ``bytes_with(k)`` <= ``budget`` bytes, where
    ``bytes_with(k)`` is the memory with k layers (or graph segments) recomputed and does not
    grow with k (Merak's stage-aware recomputation: recompute only what the memory needs);
    None when even ``most`` does not fit. Bisection: O(log most) evaluations."""
    if bytes_with(most) > budget:
        return None
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi) // 2
        if bytes_with(mid) <= budget:
            hi = mid
        else:
            lo = mid + 1
    return lo
