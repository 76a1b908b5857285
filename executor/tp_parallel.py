"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) with optional sequence parallelism
(Korthikanti et al. 2022), applied to an already-initialised full-size stage module.

``apply_tp`` keeps this rank's slice of every parallel weight:

* column-parallel (output features split, dim 0): attention q/k/v, MLP up/gate, the word
  embedding and the output layer (both split along the vocabulary);
* row-parallel (input features split, dim 1): attention out, MLP down;
* everything else (norms, biases of row-parallel layers, learned positions) is replicated.

A *region* object sits at the entry and exit of each tensor-parallel block and issues the
collectives: copy/all-reduce without SP, all-gather/reduce-scatter along the sequence with SP.
With SP the replicated parameters that act on sequence shards (norms, row-parallel biases,
positions) see only their shard's gradient; ``SEQUENCE_PARALLEL_SUFFIXES`` names them so the
trainer can all-reduce their gradients over the TP group (Megatron-LM does the same).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from .tp_communications import (copy_to_tp, gather_sequence, reduce_from_tp, scatter_sequence,
                                vocab_parallel_cross_entropy)

# canonical parameter name suffix -> dimension split across TP ranks
COLUMN_PARALLEL = ("attn.q.weight", "attn.q.bias", "attn.k.weight", "attn.k.bias", "attn.v.weight", "attn.v.bias",
                   "mlp.up.weight", "mlp.up.bias", "mlp.gate.weight", "mlp.gate.bias",
                   "embed.token_weight", "head.weight")
ROW_PARALLEL = ("attn.o.weight", "mlp.down.weight")
VOCAB_PARALLEL = ("embed.token_weight", "head.weight")
SEQUENCE_PARALLEL_SUFFIXES = ("norm.weight", "norm.bias", "attn.o.bias", "mlp.down.bias", "embed.position_weight")


def tp_shard_dim(name: str) -> int | None:
    """Dimension along which the parameter ``name`` is split over TP ranks (None: replicated)."""
    if name.endswith(COLUMN_PARALLEL):
        return 0
    if name.endswith(ROW_PARALLEL):
        return 1
    return None


def is_sequence_parallel_param(name: str) -> bool:
    return name.endswith(SEQUENCE_PARALLEL_SUFFIXES)


def padded_rows(rows: int, name: str, tp: int) -> int:
    """Vocabulary-parallel tensors are padded to a multiple of ``tp`` rows (Megatron-LM pads
    the vocabulary; the padded logits are masked out of the softmax)."""
    if tp > 1 and name.endswith(VOCAB_PARALLEL):
        return -(-rows // tp) * tp
    return rows


def shard_tensor(full: torch.Tensor, name: str, tp: int, tp_rank: int) -> torch.Tensor:
    """This TP rank's slice of the canonical full tensor ``name``."""
    dim = tp_shard_dim(name)
    if tp == 1 or dim is None:
        return full
    rows = padded_rows(full.shape[0], name, tp)
    if rows != full.shape[0]:
        full = torch.cat([full, full.new_zeros(rows - full.shape[0], *full.shape[1:])])
    # clone: a dim-0 chunk is already contiguous, and .contiguous() would keep the whole
    # full-size storage alive behind the shard
    return full.chunk(tp, dim=dim)[tp_rank].clone(memory_format=torch.contiguous_format)


def unshard_tensor(parts: list[torch.Tensor], name: str, full_rows: int) -> torch.Tensor:
    """Inverse of ``shard_tensor`` given every TP rank's slice in rank order."""
    dim = tp_shard_dim(name)
    if len(parts) == 1 or dim is None:
        return parts[0]
    return torch.cat(parts, dim=dim)[:full_rows] if dim == 0 else torch.cat(parts, dim=dim)


class NoParallelRegion:
    """The identity region of the single-device model."""

    size = 1
    rank = 0
    sequence_parallel = False

    def enter(self, x):
        return x

    def exit(self, y):
        return y

    def local_positions(self, seq_len: int) -> slice:
        return slice(0, seq_len)

    def cross_entropy(self, logits, target, vocab_start):
        return nn.functional.cross_entropy(logits.float().flatten(0, -2), target.flatten(), reduction="none").view_as(target)


@dataclass(eq=False)
class TensorParallelRegion:
    """Entry/exit collectives of one tensor-parallel block (a layer's attention or MLP, the
    embedding, or the output layer)."""

    group: dist.ProcessGroup
    size: int
    rank: int
    sequence_parallel: bool
    recorder: object   # timeline.StepRecorder
    layer: int = -1

    def enter(self, x):
        """Before a column-parallel layer: ``f`` (copy) or all-gather of the sequence."""
        return gather_sequence(x, self) if self.sequence_parallel else copy_to_tp(x, self)

    def exit(self, y):
        """After a row-parallel layer: ``g`` (all-reduce) or reduce-scatter of the sequence."""
        return scatter_sequence(y, self) if self.sequence_parallel else reduce_from_tp(y, self)

    def local_positions(self, seq_len: int) -> slice:
        if not self.sequence_parallel:
            return slice(0, seq_len)
        n = seq_len // self.size
        return slice(self.rank * n, (self.rank + 1) * n)

    def cross_entropy(self, logits, target, vocab_start):
        return vocab_parallel_cross_entropy(logits, target, vocab_start, self)


def apply_tp(stage: nn.Module, group: dist.ProcessGroup, tp: int, tp_rank: int, sequence_parallel: bool,
             recorder, subpipe: bool = False) -> None:
    """Shard ``stage`` (a ``model.StageModule`` holding full-size, initialised weights) in place.
    ``subpipe``: sub-pipelined TP in every transformer layer (``model.Block``; Merak)."""
    with torch.no_grad():
        for name, module in list(stage.named_modules()):
            for pname, param in list(module.named_parameters(recurse=False)):
                full_name = f"{name}.{pname}" if name else pname
                if tp_shard_dim(full_name) is None:
                    continue
                local = shard_tensor(param.data, full_name, tp, tp_rank)
                setattr(module, pname, nn.Parameter(local, requires_grad=param.requires_grad))

    def region(layer: int) -> TensorParallelRegion:
        return TensorParallelRegion(group, tp, tp_rank, sequence_parallel, recorder, layer)

    for index, block in stage.layers.items():
        block.attn.set_parallel(region(int(index)))
        block.mlp.set_parallel(region(int(index)))
        block.subpipe = subpipe
    if stage.embed is not None:
        stage.embed.set_parallel(region(-1))
    if stage.head is not None:
        stage.head.set_parallel(region(-1))


def local_grad(p: torch.nn.Parameter) -> torch.Tensor | None:
    """The gradient tensor this rank holds (the local shard of a ZeRO-2/3 DTensor gradient)."""
    if p.grad is None:
        return None
    return p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad


def allreduce_sequence_parallel_grads(chunks, group, recorder) -> None:
    """Sum, over the TP group, the gradients of replicated parameters that acted on sequence
    shards (Megatron-LM ``_allreduce_layernorm_grads``), as one flat buffer."""
    grads = [local_grad(p) for chunk in chunks for name, p in chunk.named_parameters()
             if is_sequence_parallel_param(name) and p.grad is not None]
    if not grads:
        return
    with recorder.memory.phase("other"):
        flat = torch.cat([g.reshape(-1) for g in grads])
    with recorder.comm("tp", "tp_allreduce", flat.numel() * flat.element_size(), name="sequence-parallel grads",
                       tensors=(flat,)):
        dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
