"""Activation recomputation (``apply_ac``), with non-reentrant ``torch.utils.checkpoint``.

* ``full``: each transformer layer keeps only its input and reruns its forward in backward
  (Chen et al. 2016; Megatron-LM ``--recompute-granularity full --recompute-method uniform``
  with one layer per group).
* ``selective``: only the attention core softmax(QK^T)V is recomputed (Korthikanti et al.
  2022, Sec. 5).
* ``stage-aware``: virtual stage s recomputes its first ``recompute_layers[s]`` layers fully
  and keeps the rest (Merak, Lai et al. 2023); all layers when ``recompute_layers`` is unset.
* ``shifted_critical_path``: the last pipeline rank recomputes nothing (Merak).

The same policy per layer as ``parsim.costs.memory.rank_recompute`` uses for the simulator.
"""
from __future__ import annotations

from parsim.specs import Plan

from .model import StageModule


def layer_policies(plan: Plan, stage: int, num_layers: int) -> list[str]:
    """Recompute policy (``none``/``full``/``selective``) of each layer of a virtual stage."""
    if plan.recompute == "none":
        return ["none"] * num_layers
    if plan.shifted_critical_path and stage % plan.pp == plan.pp - 1:
        return ["none"] * num_layers
    if plan.recompute == "stage-aware":
        full = plan.recompute_layers[stage] if plan.recompute_layers is not None else num_layers
        return ["full"] * full + ["none"] * (num_layers - full)
    return [plan.recompute] * num_layers


def apply_ac(stage_module: StageModule, plan: Plan, stage: int) -> None:
    """Mark each layer of ``stage_module`` for full or selective recomputation."""
    blocks = list(stage_module.layers.values())
    for block, policy in zip(blocks, layer_policies(plan, stage, len(blocks))):
        block.recompute_full = policy == "full"
        block.attn.recompute_core = policy == "selective"
