"""A GPT / Llama-style decoder built from a ModelSpec, cut into pipeline stages.

One ``StageModule`` holds a contiguous run of transformer layers, plus the embedding if it is
the first virtual stage and the final norm + output layer + loss if it is the last. The whole
model (one stage holding everything) is the single-device reference.

Parameter names are canonical (``embed.token_weight``, ``layers.7.attn.q.weight``,
``head.weight``): the same name on every plan, which is what initialisation, checkpoints and
parity tests key on. Layers are addressed by their global index.

Parallelism is added from outside (``tp_parallel.apply_tp``, ``recompute.apply_ac``); the
modules only call their region's ``enter``/``exit`` around the tensor-parallel blocks, which
is the identity on one device. With sub-pipelined TP a ``Block`` issues the same collectives
asynchronously for two halves of its microbatch (``Block._subpipe``).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from parsim.specs import ModelSpec

from .tp_communications import AsyncCollective
from .tp_parallel import NoParallelRegion

# GPT-2 / GPT-3 residual and attention dropout probability (Radford et al. 2019).
DROPOUT_P = 0.1
# RoPE base frequency (Su et al. 2021; Llama).
ROPE_THETA = 10000.0


class RMSNorm(nn.Module):
    """Zhang & Sennrich 2019; computed in fp32."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight).to(x.dtype)


def make_norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return RMSNorm(spec.hidden, spec.norm_eps)
    return nn.LayerNorm(spec.hidden, eps=spec.norm_eps, bias=spec.bias)


def rope_tables(seq_len: int, head_dim: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of ``x`` = [batch, heads, seq, head_dim]."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, hd = spec.hidden, spec.head_dim
        self.q = nn.Linear(h, spec.heads * hd, bias=spec.bias)
        self.k = nn.Linear(h, spec.kv_heads * hd, bias=spec.bias)
        self.v = nn.Linear(h, spec.kv_heads * hd, bias=spec.bias)
        self.o = nn.Linear(spec.heads * hd, h, bias=spec.bias)
        self.heads, self.kv_heads, self.head_dim = spec.heads, spec.kv_heads, hd
        self.rope = spec.position == "rope"
        self.dropout_p = DROPOUT_P if spec.dropout else 0.0
        self.tp = NoParallelRegion()
        self.recompute_core = False   # selective recomputation (Korthikanti et al. 2022, Sec. 5)
        self.flash = spec.flash_attention

    def set_parallel(self, region) -> None:
        self.tp = region
        self.heads //= region.size
        self.kv_heads //= region.size

    def core(self, q, k, v):
        """softmax(q k^T / sqrt(d)) v, causal: the part selective recomputation drops.

        ``flash_attention`` models run the fused kernel (``F.scaled_dot_product_attention``:
        it keeps only the log-sum-exp for backward); the others the explicit products, which
        keep the (b, heads, s, s) softmax output (and dropout mask) as the cost model counts
        them (``parsim.costs.activations.layer_activation_bytes``)."""
        p = self.dropout_p if self.training else 0.0
        if self.flash:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p,
                                                  enable_gqa=self.heads != self.kv_heads)
        if self.heads != self.kv_heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        causal = torch.ones_like(scores[0, 0], dtype=torch.bool).triu(1)     # (s, s): traceable by torch.fx
        probs = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        return (F.dropout(probs, p, self.training) if p > 0 else probs) @ v

    def forward(self, x):
        return self.add_bias(self.tp.exit(self.body(self.tp.enter(x))))

    def body(self, x):
        """The block between its entry and exit collectives: ``x`` has entered, the result is
        this rank's partial sum before the exit (the row-parallel bias not yet added)."""
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rope:
            cos, sin = rope_tables(s, self.head_dim, x.device)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.recompute_core:
            out = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            out = self.core(q, k, v)
        out = out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)
        return F.linear(out, self.o.weight)

    def add_bias(self, y):
        return y if self.o.bias is None else y + self.o.bias


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.swiglu = spec.activation == "swiglu"
        self.up = nn.Linear(spec.hidden, spec.ffn_hidden, bias=spec.bias)
        if self.swiglu:   # Shazeer 2020: silu(x W_gate) * (x W_up)
            self.gate = nn.Linear(spec.hidden, spec.ffn_hidden, bias=spec.bias)
        self.down = nn.Linear(spec.ffn_hidden, spec.hidden, bias=spec.bias)
        self.tp = NoParallelRegion()

    def set_parallel(self, region) -> None:
        self.tp = region

    def forward(self, x):
        return self.add_bias(self.tp.exit(self.body(self.tp.enter(x))))

    def body(self, x):
        """Between the entry and exit collectives (see ``Attention.body``)."""
        h = F.silu(self.gate(x)) * self.up(x) if self.swiglu else F.gelu(self.up(x))
        return F.linear(h, self.down.weight)

    def add_bias(self, y):
        return y if self.down.bias is None else y + self.down.bias


class Block(nn.Module):
    """Pre-norm transformer layer.

    Sub-pipelined TP (``subpipe``; Merak, Lai et al. 2023): the layer splits its input along
    the batch into two halves (``b - b // 2`` and ``b // 2`` rows) and runs them interleaved,
    each half a generator that yields its TP collectives (``_half``). ``_subpipe`` issues a
    half's collective asynchronously and runs the other half until it is needed, so in
    forward -- and, by autograd's order (highest sequence number first), in backward -- one
    half's collective overlaps the other half's compute. The halves meet again at the end of
    the layer. With full recomputation the checkpoint wraps the whole two-half layer and is
    replayed without early stop, so every collective it launches is also waited for."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attn_norm = make_norm(spec)
        self.attn = Attention(spec)
        self.mlp_norm = make_norm(spec)
        self.mlp = MLP(spec)
        self.dropout_p = DROPOUT_P if spec.dropout else 0.0
        self.recompute_full = False   # full recomputation: keep only the layer input
        self.subpipe = False          # sub-pipelined TP (set by tp_parallel.apply_tp)

    def _forward(self, x):
        x = x + F.dropout(self.attn(self.attn_norm(x)), self.dropout_p, self.training)
        return x + F.dropout(self.mlp(self.mlp_norm(x)), self.dropout_p, self.training)

    def _half(self, x):
        """One half of the layer; yields (region, "enter"|"exit", tensor) and is sent the
        collective's result."""
        a = yield self.attn.tp, "enter", self.attn_norm(x)
        y = yield self.attn.tp, "exit", self.attn.body(a)
        x = x + F.dropout(self.attn.add_bias(y), self.dropout_p, self.training)
        m = yield self.mlp.tp, "enter", self.mlp_norm(x)
        y = yield self.mlp.tp, "exit", self.mlp.body(m)
        return x + F.dropout(self.mlp.add_bias(y), self.dropout_p, self.training)

    def _subpipe(self, x):
        first = x.shape[0] - x.shape[0] // 2
        halves = [self._half(part) for part in x.split([first, x.shape[0] - first])]
        pending: list = [None, None]   # (cell, token) of each half's collective in flight
        outputs: list = [None, None]

        def advance(h: int, value) -> None:
            """Run half ``h`` to its next collective and start it (or to its end)."""
            try:
                region, where, t = halves[h].send(value)
            except StopIteration as done:
                outputs[h], pending[h] = done.value, None
                return
            cell = AsyncCollective(region, where)
            pending[h] = (cell, cell.start(t))

        advance(0, None)
        advance(1, None)
        while pending[0] is not None or pending[1] is not None:
            for h in (0, 1):
                if pending[h] is not None:
                    cell, token = pending[h]
                    advance(h, cell.wait(token))
        return torch.cat(outputs, dim=0)

    def forward(self, x):
        body = self._subpipe if self.subpipe else self._forward
        if self.recompute_full:
            return checkpoint(body, x, use_reentrant=False, early_stop=not self.subpipe)
        return body(x)


class Embedding(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.token_weight = nn.Parameter(torch.empty(spec.vocab, spec.hidden))
        self.position_weight = (nn.Parameter(torch.empty(spec.seq_len, spec.hidden))
                                if spec.position == "learned" else None)
        self.vocab = spec.vocab
        self.dropout_p = DROPOUT_P if spec.dropout else 0.0
        self.tp = NoParallelRegion()

    def set_parallel(self, region) -> None:
        self.tp = region

    def vocab_start(self) -> int:
        return self.tp.rank * self.token_weight.shape[0]

    def forward(self, tokens):
        if self.tp.size == 1:
            x = F.embedding(tokens, self.token_weight)
        else:   # vocabulary-parallel lookup: rows outside this rank's slice contribute zeros
            start, rows = self.vocab_start(), self.token_weight.shape[0]
            outside = (tokens < start) | (tokens >= start + rows)
            local = F.embedding((tokens - start).masked_fill(outside, 0), self.token_weight)
            x = self.tp.exit(local.masked_fill(outside.unsqueeze(-1), 0.0))
        if self.position_weight is not None:
            x = x + self.position_weight[self.tp.local_positions(tokens.shape[1])]
        return F.dropout(x, self.dropout_p, self.training)


class Head(nn.Module):
    """Final norm, output layer (own weight, or the tied word embedding) and per-token loss."""

    def __init__(self, spec: ModelSpec, own_weight: bool):
        super().__init__()
        self.norm = make_norm(spec)
        self.weight = nn.Parameter(torch.empty(spec.vocab, spec.hidden)) if own_weight else None
        self.vocab = spec.vocab
        self.tp = NoParallelRegion()

    def set_parallel(self, region) -> None:
        self.tp = region

    def forward(self, x, targets, weight):
        x = self.tp.enter(self.norm(x))
        logits = F.linear(x, weight)
        start = self.tp.rank * weight.shape[0]
        if start + weight.shape[0] > self.vocab:   # padded vocabulary rows never win the softmax
            logits = logits.masked_fill(torch.arange(start, start + weight.shape[0], device=x.device) >= self.vocab,
                                        float("-inf"))
        return self.tp.cross_entropy(logits, targets, start).mean()


class StageModule(nn.Module):
    """Layers ``[first_layer, first_layer + num_layers)`` of the model, plus the embedding on
    the first stage and the head on the last. ``forward`` returns the next stage's input, or
    the mean token loss of the microbatch on the last stage."""

    def __init__(self, spec: ModelSpec, first_layer: int, num_layers: int, is_first: bool, is_last: bool):
        super().__init__()
        self.spec = spec
        self.embed = Embedding(spec) if is_first else None
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in range(first_layer, first_layer + num_layers)})
        # Tied embeddings: the single-stage model reuses the embedding; a separate last stage keeps
        # its own copy, kept equal by summing the two gradients (Megatron-LM's embedding group).
        self.tied_locally = spec.tied_embeddings and is_first and is_last
        self.head = Head(spec, own_weight=not self.tied_locally) if is_last else None

    def forward(self, x, targets=None):
        if self.embed is not None:
            x = self.embed(x)
        for block in self.layers.values():
            x = block(x)
        if self.head is None:
            return x
        weight = self.embed.token_weight if self.tied_locally else self.head.weight
        return self.head(x, targets, weight)


def canonical_name(name: str, spec: ModelSpec) -> str:
    """The model-wide name of a stage parameter (a separate tied output layer *is* the embedding)."""
    if name == "head.weight" and spec.tied_embeddings:
        return "embed.token_weight"
    return name


def reference_model(spec: ModelSpec, batch_size: int = 1) -> tuple[StageModule, tuple[torch.Tensor, torch.Tensor]]:
    """The whole model as one stage, uninitialised, and one microbatch of example inputs
    (tokens, labels): what ``parsim partition`` traces a ModelSpec as (its caller passes this
    to ``parsim.partition.partition``; layer i is the submodule ``layers.<i>``)."""
    module = StageModule(spec, 0, spec.layers, is_first=True, is_last=True)
    tokens = torch.zeros(batch_size, spec.seq_len, dtype=torch.long)
    return module, (tokens, tokens.clone())
