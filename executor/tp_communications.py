"""Tensor- and sequence-parallel collectives as small autograd functions (Megatron-LM's
``mappings.py``; Shoeybi et al. 2019 Fig. 3 "f" and "g"; Korthikanti et al. 2022 Sec. 4.2.2).

=====================  forward                       backward
copy_to_tp  ("f")      identity                      all-reduce
reduce_from_tp ("g")   all-reduce                    identity
gather_sequence        all-gather along sequence     reduce-scatter along sequence
scatter_sequence       reduce-scatter along seq.     all-gather along sequence
=====================  ===========================  ==========================

Activations are ``[batch, sequence, hidden]``; the sequence dimension is 1. Every collective
is recorded on the ``tp`` stream of the step recorder (kind ``tp_allreduce`` /
``tp_allgather`` / ``tp_reducescatter``) with the layer it belongs to.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.autograd import Function

if TYPE_CHECKING:
    from .tp_parallel import TensorParallelRegion

SEQ_DIM = 1


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def all_reduce(x: torch.Tensor, region: "TensorParallelRegion") -> torch.Tensor:
    x = x.contiguous()
    with region.recorder.comm("tp", "tp_allreduce", _nbytes(x), layer=region.layer):
        dist.all_reduce(x, group=region.group)
    return x


def all_gather_sequence(x: torch.Tensor, region: "TensorParallelRegion") -> torch.Tensor:
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(region.size)]
    with region.recorder.comm("tp", "tp_allgather", _nbytes(x) * region.size, layer=region.layer):
        dist.all_gather(parts, x, group=region.group)
    return torch.cat(parts, dim=SEQ_DIM)


def reduce_scatter_sequence(x: torch.Tensor, region: "TensorParallelRegion") -> torch.Tensor:
    parts = [p.contiguous() for p in x.chunk(region.size, dim=SEQ_DIM)]
    out = torch.empty_like(parts[0])
    with region.recorder.comm("tp", "tp_reducescatter", _nbytes(x), layer=region.layer):
        dist.reduce_scatter(out, parts, group=region.group)
    return out


class _CopyToTensorParallel(Function):
    @staticmethod
    def forward(ctx, x, region):
        ctx.region = region
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.region), None


class _ReduceFromTensorParallel(Function):
    @staticmethod
    def forward(ctx, x, region):
        return all_reduce(x.clone(), region)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherSequence(Function):
    @staticmethod
    def forward(ctx, x, region):
        ctx.region = region
        return all_gather_sequence(x, region)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_sequence(grad, ctx.region), None


class _ScatterSequence(Function):
    @staticmethod
    def forward(ctx, x, region):
        ctx.region = region
        return reduce_scatter_sequence(x, region)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_sequence(grad, ctx.region), None


def copy_to_tp(x, region):
    return _CopyToTensorParallel.apply(x, region)


def reduce_from_tp(x, region):
    return _ReduceFromTensorParallel.apply(x, region)


def gather_sequence(x, region):
    return _GatherSequence.apply(x, region)


def scatter_sequence(x, region):
    return _ScatterSequence.apply(x, region)


class _VocabParallelCrossEntropy(Function):
    """Cross-entropy over logits split along the vocabulary (Megatron-LM
    ``vocab_parallel_cross_entropy``): three all-reduces (max, target logit, sum of exp) of
    ``[batch, sequence]`` numbers instead of gathering ``[batch, sequence, vocab]`` logits."""

    @staticmethod
    def forward(ctx, logits, target, vocab_start, region):
        logits = logits.float()
        vocab_local = logits.shape[-1]
        logits_max = logits.max(dim=-1).values
        with region.recorder.comm("tp", "tp_allreduce", _nbytes(logits_max), layer=region.layer):
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=region.group)
        logits = logits - logits_max.unsqueeze(-1)
        outside = (target < vocab_start) | (target >= vocab_start + vocab_local)
        local_target = (target - vocab_start).masked_fill(outside, 0)
        target_logit = logits.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp_logits = logits.exp()
        sum_exp = exp_logits.sum(dim=-1)
        both = torch.stack([target_logit, sum_exp])
        with region.recorder.comm("tp", "tp_allreduce", _nbytes(both), layer=region.layer):
            dist.all_reduce(both, group=region.group)
        target_logit, sum_exp = both[0], both[1]
        loss = torch.log(sum_exp) - target_logit
        softmax = exp_logits.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, outside, local_target)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, outside, local_target = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, local_target.unsqueeze(-1), -(~outside).to(grad.dtype).unsqueeze(-1))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None, None


def vocab_parallel_cross_entropy(logits, target, vocab_start: int, region) -> torch.Tensor:
    """Per-token loss ``[batch, sequence]`` from this rank's vocabulary slice of the logits."""
    return _VocabParallelCrossEntropy.apply(logits, target, vocab_start, region)
