"""Tensor- and sequence-parallel collectives as small autograd functions (Megatron-LM's
``mappings.py``; Shoeybi et al. 2019 Fig. 3 "f" and "g"; Korthikanti et al. 2022 Sec. 4.2.2).

=====================  forward                       backward
copy_to_tp  ("f")      identity                      all-reduce
reduce_from_tp ("g")   all-reduce                    identity
gather_sequence        all-gather along sequence     reduce-scatter along sequence
scatter_sequence       reduce-scatter along seq.     all-gather along sequence
=====================  ===========================  ==========================

Activations are ``[batch, sequence, hidden]``; the sequence dimension is 1. The sequence
collectives are the tensor forms Megatron-LM calls (``all_gather_into_tensor``,
``reduce_scatter_tensor``), which the simulator and ``calibration.insitu`` price: gloo's list forms
cost ~0.37 ms more a call on 2 ranks (0.96-0.98 against 0.58-0.62 ms fixed, 2026-11-28). Every collective
is recorded on the ``tp`` stream of the step recorder (kind ``tp_allreduce`` /
``tp_allgather`` / ``tp_reducescatter``) with the layer it belongs to.

Sub-pipelined TP (Merak, Lai et al. 2023) issues the same four mappings asynchronously, each as a
pair of autograd functions around an ``AsyncCollective`` cell: ``start`` launches the forward
collective (``async_op=True``) and returns a zero-storage token of the output's shape, ``wait``
completes it and returns the real output. In backward the roles swap: ``wait``'s backward
launches the backward collective and passes a token on, ``start``'s backward completes it and
returns the real input gradient. Whatever autograd runs between the two (the other half of the
microbatch, see ``model.Block``) overlaps the collective.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.autograd import Function

if TYPE_CHECKING:
    from .tp_parallel import TensorParallelRegion

SEQ_DIM = 1


def tensor_forms(dist_module=dist):
    """(all-gather, reduce-scatter) tensor forms of ``dist_module``: torch 2.13's names
    (``all_gather_single``, ``reduce_scatter_single``) where it has them, else the older
    ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` (deprecated in 2.13; a GPU image may
    carry an older torch). Signatures ``(output, input, group=..., async_op=...)`` alike."""
    gather = getattr(dist_module, "all_gather_single", None) or dist_module.all_gather_into_tensor
    scatter = getattr(dist_module, "reduce_scatter_single", None) or dist_module.reduce_scatter_tensor
    return gather, scatter


# this torch's tensor forms, resolved once (every TP layer calls them)
ALL_GATHER, REDUCE_SCATTER = tensor_forms()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def all_reduce(x: torch.Tensor, region: "TensorParallelRegion") -> torch.Tensor:
    x = x.contiguous()
    with region.recorder.comm("tp", "tp_allreduce", _nbytes(x), layer=region.layer, tensors=(x,)):
        dist.all_reduce(x, group=region.group)
    return x


def _gather_buffers(x: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(this rank's shard, contiguous; the gathered buffer ``[size * batch, seq/size, ...]``, gloo's
    shape: the ranks' shards stacked on dim 0) for ``all_gather_into_tensor``, the tensor form
    Megatron-LM calls (``_gather_along_first_dim``)."""
    x = x.contiguous()
    return x, torch.empty((size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)


def _gathered(buf: torch.Tensor, size: int) -> torch.Tensor:
    """``[size * batch, seq/size, ...]`` -> ``[batch, seq, ...]``, the shards in rank order (one
    copy, as ``torch.cat`` of the parts)."""
    return buf.unflatten(0, (size, -1)).movedim(0, SEQ_DIM).flatten(SEQ_DIM, SEQ_DIM + 1)


def _scatter_buffers(x: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(``x`` as ``[size * batch, seq/size, ...]``, contiguous: rank r's chunk of the sequence is
    block r of dim 0; the output shard) for ``reduce_scatter_tensor``, the tensor form Megatron-LM calls
    (``_reduce_scatter_along_first_dim``). Megatron's activations are sequence-first, so its
    blocks need no copy; ours are batch-first and take one, as the list form's chunks did."""
    blocks = x.unflatten(SEQ_DIM, (size, x.shape[SEQ_DIM] // size)).movedim(SEQ_DIM, 0).contiguous()
    out = torch.empty(blocks.shape[1:], dtype=x.dtype, device=x.device)
    return blocks.flatten(0, 1), out      # [size * batch, seq/size, ...]: gloo's shape


def all_gather_sequence(x: torch.Tensor, region: "TensorParallelRegion") -> torch.Tensor:
    x, buf = _gather_buffers(x, region.size)
    with region.recorder.comm("tp", "tp_allgather", _nbytes(x) * region.size, layer=region.layer,
                               tensors=(x, buf)):
        ALL_GATHER(buf, x, group=region.group)
    return _gathered(buf, region.size)


def reduce_scatter_sequence(x: torch.Tensor, region: "TensorParallelRegion") -> torch.Tensor:
    blocks, out = _scatter_buffers(x, region.size)
    with region.recorder.comm("tp", "tp_reducescatter", _nbytes(x), layer=region.layer, tensors=(blocks, out)):
        REDUCE_SCATTER(out, blocks, group=region.group)
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


class AsyncCollective:
    """One asynchronous TP mapping of one sub-pipelined half: ``enter`` ("f" / all-gather of the
    sequence) or ``exit`` ("g" / reduce-scatter of the sequence) of ``region``. Create one per
    use; ``start(x)`` then ``wait(token)``. The cell carries the in-flight work between the two
    autograd functions, in forward and again in backward."""

    def __init__(self, region: "TensorParallelRegion", where: str):
        if where not in ("enter", "exit"):
            raise ValueError(where)
        self.region, self.where = region, where
        sp = region.sequence_parallel
        # forward collective: exit ("g" all-reduce / reduce-scatter), SP enter (all-gather)
        self.forward_op = ("reduce_scatter" if sp else "all_reduce") if where == "exit" else \
            ("all_gather" if sp else None)
        # backward collective: enter ("f" all-reduce / reduce-scatter), SP exit (all-gather)
        self.backward_op = ("reduce_scatter" if sp else "all_reduce") if where == "enter" else \
            ("all_gather" if sp else None)
        self.pending = None    # (finish, AsyncOp, inputs) of the collective in flight, or None
        self.output = None     # forward output when there is no forward collective

    def start(self, x: torch.Tensor) -> torch.Tensor:
        return _StartCollective.apply(x, self)

    def wait(self, token: torch.Tensor) -> torch.Tensor:
        return _WaitCollective.apply(token, self)

    def output_shape(self, shape) -> tuple[int, ...]:
        """Shape after the forward collective (the backward one maps it back)."""
        shape = list(shape)
        if self.forward_op == "all_gather":
            shape[SEQ_DIM] *= self.region.size
        elif self.forward_op == "reduce_scatter":
            shape[SEQ_DIM] //= self.region.size
        return tuple(shape)

    def launch(self, op: str, x: torch.Tensor) -> None:
        """Start collective ``op`` on ``x`` (async_op=True); ``finish`` completes it."""
        region = self.region
        if op == "all_reduce":
            buf = x.contiguous()
            work = dist.all_reduce(buf, group=region.group, async_op=True)
            kind, nbytes, inputs = "tp_allreduce", _nbytes(buf), buf

            def finish():
                return buf
        elif op == "all_gather":
            x, buf = _gather_buffers(x, region.size)
            work = ALL_GATHER(buf, x, group=region.group, async_op=True)
            kind, nbytes, inputs = "tp_allgather", _nbytes(x) * region.size, x

            def finish():
                return _gathered(buf, region.size)
        else:
            blocks, out = _scatter_buffers(x, region.size)
            work = REDUCE_SCATTER(out, blocks, group=region.group, async_op=True)
            kind, nbytes, inputs = "tp_reducescatter", _nbytes(x), blocks

            def finish():
                return out
        handle = region.recorder.async_comm("tp", kind, nbytes, work, layer=region.layer)
        self.pending = (finish, handle, inputs)   # inputs: alive until the collective is done

    def complete(self) -> torch.Tensor:
        finish, handle, _ = self.pending
        self.pending = None
        handle.wait()
        return finish()


def _token(like: torch.Tensor, shape) -> torch.Tensor:
    """A stand-in of ``shape`` with one element of storage (every stride 0)."""
    return torch.empty_strided(tuple(shape), (0,) * len(shape), dtype=like.dtype, device=like.device)


class _StartCollective(Function):
    @staticmethod
    def forward(ctx, x, cell):
        ctx.cell = cell
        if cell.forward_op is None:
            cell.output = x.detach()     # "f": the identity in forward
        else:
            cell.launch(cell.forward_op, x if cell.forward_op != "all_reduce" else x.clone())
        return _token(x, cell.output_shape(x.shape))

    @staticmethod
    def backward(ctx, grad):
        cell = ctx.cell
        return (cell.complete() if cell.pending is not None else grad), None


class _WaitCollective(Function):
    @staticmethod
    def forward(ctx, token, cell):
        ctx.cell = cell
        if cell.forward_op is None:
            out, cell.output = cell.output, None
            return out
        return cell.complete()

    @staticmethod
    def backward(ctx, grad):
        cell = ctx.cell
        if cell.backward_op is None:
            return grad, None             # "g": the identity in backward
        cell.launch(cell.backward_op, grad)
        return _token(grad, grad.shape), None


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
        with region.recorder.comm("tp", "tp_allreduce", _nbytes(logits_max), layer=region.layer,
                                    tensors=(logits_max,)):
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=region.group)
        logits = logits - logits_max.unsqueeze(-1)
        outside = (target < vocab_start) | (target >= vocab_start + vocab_local)
        local_target = (target - vocab_start).masked_fill(outside, 0)
        target_logit = logits.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp_logits = logits.exp()
        sum_exp = exp_logits.sum(dim=-1)
        both = torch.stack([target_logit, sum_exp])
        with region.recorder.comm("tp", "tp_allreduce", _nbytes(both), layer=region.layer, tensors=(both,)):
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
