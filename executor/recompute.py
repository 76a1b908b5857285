"""Activation recomputation (``apply_ac``), with non-reentrant ``torch.utils.checkpoint``.

* ``full``: each transformer layer keeps only its input and reruns its forward in backward
  (Chen et al. 2016; Megatron-LM ``--recompute-granularity full --recompute-method uniform``
  with one layer per group).
* ``selective``: only the attention core softmax(QK^T)V is recomputed (Korthikanti et al.
  2022, Sec. 5).
* ``stage-aware``: virtual stage s recomputes its first ``recompute_layers[s]`` layers fully
  and keeps the rest (Merak, Lai et al. 2023); all layers when ``recompute_layers`` is unset.
* ``shifted_critical_path``: the last pipeline rank recomputes nothing (Merak).

The policy of each layer is ``parsim.costs.layer_recompute``'s, the one the simulator plays.
"""
from __future__ import annotations

from parsim.costs import layer_recompute
from parsim.specs import Plan

from .model import StageModule


def layer_policies(plan: Plan, stage: int, num_layers: int) -> list[str]:
    """Recompute policy (``none``/``full``/``selective``) of each layer of a virtual stage."""
    return [policy for n, policy in layer_recompute(plan, stage, num_layers) for _ in range(n)]


def apply_ac(stage_module: StageModule, plan: Plan, stage: int) -> None:
    """Mark each layer of ``stage_module`` for full or selective recomputation."""
    blocks = list(stage_module.layers.values())
    for block, policy in zip(blocks, layer_policies(plan, stage, len(blocks))):
        block.recompute_full = policy == "full"
        block.attn.recompute_core = policy == "selective"
