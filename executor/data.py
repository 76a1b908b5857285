"""Training data: a seeded synthetic token stream, or byte-level tokens of a text file.

Global batch of step ``k``: ``gbs`` sequences of ``seq_len + 1`` tokens, a pure function of
(seed, k) -- so every plan, every rank and a resumed run see the same batch. Sequence ``i``
of the global batch belongs to data-parallel rank ``i // (gbs / dp)``; within a rank, the
sequences are cut into microbatches of ``mbs`` in order. Inputs are tokens ``[:-1]``, targets
tokens ``[1:]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from parsim.specs import ModelSpec, Plan, SpecError


@dataclass(frozen=True)
class Microbatch:
    tokens: torch.Tensor    # [mbs, seq_len] int64
    targets: torch.Tensor   # [mbs, seq_len] int64


class SyntheticTokens:
    """Uniform random tokens from a generator seeded per step."""

    def __init__(self, vocab: int, seq_len: int, seed: int):
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed

    def global_batch(self, step: int, gbs: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 7_919 + step)
        return torch.randint(self.vocab, (gbs, self.seq_len + 1), generator=gen)


class ByteTextTokens:
    """Bytes of a text file as tokens (0..255); sequences start at seeded random offsets."""

    def __init__(self, path: str | Path, vocab: int, seq_len: int, seed: int):
        data = Path(path).read_bytes() if Path(path).is_file() else None
        if data is None:
            raise SpecError("data", str(path), "an existing text file")
        if vocab < 256:
            raise SpecError("data", str(path), f"byte-level text needs a model vocab >= 256 (model vocab is {vocab})")
        if len(data) < seq_len + 2:
            raise SpecError("data", str(path), f"a file of at least seq_len+2={seq_len + 2} bytes")
        self.bytes = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        self.seq_len, self.seed = seq_len, seed

    def global_batch(self, step: int, gbs: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 7_919 + step)
        starts = torch.randint(len(self.bytes) - self.seq_len - 1, (gbs,), generator=gen)
        idx = starts.unsqueeze(1) + torch.arange(self.seq_len + 1)
        return self.bytes[idx]


def make_source(model: ModelSpec, seed: int, data_file: str | None):
    if data_file:
        return ByteTextTokens(data_file, model.vocab, model.seq_len, seed)
    return SyntheticTokens(model.vocab, model.seq_len, seed)


def rank_microbatches(source, step: int, plan: Plan, dp_rank: int, device: torch.device) -> list[Microbatch]:
    """The microbatches data-parallel rank ``dp_rank`` trains on at ``step``."""
    batch = source.global_batch(step, plan.gbs)
    per_rank = plan.gbs // plan.dp
    mine = batch[dp_rank * per_rank:(dp_rank + 1) * per_rank].to(device)
    return [Microbatch(tokens=mb[:, :-1].contiguous(), targets=mb[:, 1:].contiguous())
            for mb in mine.split(plan.mbs)]
