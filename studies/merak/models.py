"""Models for ``parsim partition --model studies.merak.models:<factory>``.

``mixed_width``: a decoder whose blocks change width along the depth (256 -> 1024 -> 256, with
a projection wherever the width changes), so its layers differ in cost by up to 16x and an
equal-layer pipeline split is badly unbalanced. Its padding mask and position ids are graph
inputs that every block uses (Merak's "common nodes"). Each factory returns
``(module, example_inputs)`` for one microbatch of ``batch_size`` sequences; the partitioner
calls it under ``torch.device("meta")``, so no weights are allocated.
"""
from __future__ import annotations

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

WIDTHS = (256, 256, 512, 512, 1024, 1024, 512, 256)   # hidden size of each block
HEAD_DIM = 64
VOCAB = 8192
SEQ = 256


def causal_padding_bias(attention_mask: torch.Tensor) -> torch.Tensor:
    """Additive attention bias [b, 1, s, s]: -inf above the diagonal and on padded keys."""
    s = attention_mask.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=attention_mask.device).tril()
    keep = causal[None, None] & attention_mask[:, None, None, :].bool()
    return torch.zeros(keep.shape, device=attention_mask.device).masked_fill(~keep, float("-inf"))


# one opaque node for torch.fx (its shape arithmetic is not symbolically traceable); it depends
# on the inputs alone, so the partitioner makes it a common node every stage has
torch.fx.wrap("causal_padding_bias")


class Block(nn.Module):
    """Pre-norm attention + GELU MLP (4x) at width ``d``; padding mask added to the scores."""

    def __init__(self, d: int):
        super().__init__()
        self.heads = d // HEAD_DIM
        self.attn_norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.mlp_norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x, mask_bias):
        b, s, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, s, 3, self.heads, HEAD_DIM).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_bias)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class MixedWidthDecoder(nn.Module):
    def __init__(self, widths=WIDTHS, vocab: int = VOCAB, seq: int = SEQ):
        super().__init__()
        self.embed = nn.Embedding(vocab, widths[0])
        self.pos = nn.Embedding(seq, widths[0])
        self.blocks = nn.ModuleList(Block(d) for d in widths)
        self.resize = nn.ModuleList(nn.Linear(a, b) if a != b else nn.Identity()
                                    for a, b in zip(widths, widths[1:] + widths[-1:]))
        self.norm = nn.LayerNorm(widths[-1])
        self.head = nn.Linear(widths[-1], vocab, bias=False)

    def forward(self, tokens, attention_mask):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        mask_bias = causal_padding_bias(attention_mask)
        x = self.embed(tokens) + self.pos(positions)
        for block, resize in zip(self.blocks, self.resize):
            x = resize(block(x, mask_bias))
        return self.head(self.norm(x))


def mixed_width(batch_size: int = 1):
    """(MixedWidthDecoder, (tokens, attention_mask)) for one microbatch."""
    model = MixedWidthDecoder()
    tokens = torch.zeros(batch_size, SEQ, dtype=torch.long)
    mask = torch.ones(batch_size, SEQ, dtype=torch.long)
    return model, (tokens, mask)


def uniform_width(batch_size: int = 1):
    """The same decoder with every block at width 512 (a control: cuts come out even)."""
    model = MixedWidthDecoder(widths=(512,) * 8)
    tokens = torch.zeros(batch_size, SEQ, dtype=torch.long)
    return model, (tokens, torch.ones(batch_size, SEQ, dtype=torch.long))
