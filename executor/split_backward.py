"""The backward split into input gradients (I) and weight gradients (W), through autograd.

torch 2.13 ships the split its own zero-bubble schedules run (``torch.distributed.pipelining.
_backward``): ``stage_backward_input`` takes ``autograd.grad`` of the stage's output w.r.t. its
input with ``retain_graph=True`` and captures the gradient arriving at every weight's node;
``stage_backward_weight`` later takes ``autograd.grad`` from those nodes to the weights and adds
the result into ``.grad``. They are used here rather than rewritten: the module is private, but
it is the code torch's ``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV`` run, so the executor
measures what a torch user gets (including its costs: the retained graph keeps the stored
activations until W, and with non-reentrant activation checkpointing each weight group's
``autograd.grad`` is a new graph task that recomputes the layer again; ``costs.split_backward``
models both). As torch's ``PipelineStage`` does, the first stage -- whose input is token ids, with
no gradient to compute -- runs nothing in I and its whole backward in W.

Weight gradients added by ``stage_backward_weight`` bypass autograd's accumulation hooks, so the
caller is told which parameters received them (the DP buckets count them; ``dp_parallel``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from .model import StageModule


@dataclass
class PendingWeights:
    """What an I leaves for its W: torch's parameter groups (their captured output gradients), or,
    on the first stage, the output and its gradient for a whole backward."""
    param_groups: list | None
    output: torch.Tensor | None = None
    grad: torch.Tensor | None = None


def backward_input(output: torch.Tensor, grad: torch.Tensor | None, x: torch.Tensor,
                   chunk: StageModule) -> PendingWeights:
    """I: the gradient w.r.t. the stage input ``x`` (left in ``x.grad``) from ``output`` (the scaled
    loss when ``grad`` is None, else the stage output and its received gradient)."""
    if not x.requires_grad:          # first stage: token ids in, nothing to send back
        return PendingWeights(None, output, grad)
    _, groups = stage_backward_input([output], None if grad is None else [grad], [x], chunk.parameters())
    return PendingWeights(groups)


def backward_weight(pending: PendingWeights, chunk: StageModule) -> list[torch.nn.Parameter]:
    """W: the weight gradients, added into ``.grad``; returns the parameters whose gradients were
    added without autograd's accumulation hooks (none after a whole backward)."""
    if pending.param_groups is None:
        torch.autograd.backward(pending.output, pending.grad)
        return []
    stage_backward_weight(chunk.parameters(), pending.param_groups)
    return [p for p in chunk.parameters() if p.requires_grad]
