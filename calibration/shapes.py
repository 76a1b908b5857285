"""What to benchmark for a model: the GEMM, attention and memory-bound shapes its layers
really run on one rank, per tensor-parallel degree and micro-batch size.

GEMM shapes are read off the cost model (``parsim.costs.layer_ops`` / ``head_ops``), in the
convention ``parsim.costs.timing`` looks them up with: a key (m, n, k) is an m x n output
with inner dimension k, 2mnk FLOP; forward (m, n, k), input gradient (m, k, n), weight
gradient (k, n, m) (``timing.op_time``). So every table row the simulator asks for is one we
measured. Bytes of memory-bound ops use the cost model's counting (``parsim.costs.ops``:
forward reads + writes, backward 1.5x forward; AdamW 28 bytes per fp32 parameter,
``timing.optimizer_time``), so a measured bytes/s plugs straight back into it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from parsim.costs.ops import GEMM_FORMS, embedding_bwd_bytes, executed_gemm
from parsim.costs.timing import adamw_bytes_per_param
from parsim.costs import DTYPE_BYTES, head_ops, layer_ops, padded_vocab, state_bytes
from parsim.specs import ModelSpec, Plan

# ops.py: a memory-bound op's backward moves 1.5x its forward bytes.
BWD_BYTES_FACTOR = 1.5


@dataclass(frozen=True)
class GemmPoint:
    """One GEMM to time. ``form`` is how torch runs it:

    * ``linear``: ``F.linear(x[m,k], W[n,k])`` (a forward nn.Linear)
    * ``grad_input``: ``dY[m,k] @ W[k,n]`` (dX = dY W of a Linear)
    * ``grad_weight``: ``dY[k,n]^T @ X[k,m]`` (dW = dY^T X; output n x m, the key's transpose)
    * ``bmm``: ``A[b,m,k] @ B[b,n,k]^T`` (attention scores / values, batch b)
    """

    key: tuple[int, int, int]
    batch: int
    form: str
    source: str

    @property
    def flops(self) -> float:
        m, n, k = self.key
        return 2.0 * m * n * k * self.batch


@dataclass(frozen=True)
class AttentionPoint:
    mbs: int
    heads: int        # query heads on one rank
    kv_heads: int
    seq: int
    head_dim: int

    @property
    def batch_heads(self) -> int:
        return self.mbs * self.heads

    @property
    def fwd_flops(self) -> float:
        # QK^T and PV: 2 * 2 * b * heads * s^2 * d (Narayanan et al. 2021, Eq. 3 attention terms)
        return 4.0 * self.batch_heads * self.seq * self.seq * self.head_dim


@dataclass(frozen=True)
class MemboundPoint:
    """A memory-bound op on ``shape`` (elements), with the bytes the cost model counts.
    AdamW steps over ``tensors`` (the per-rank parameter shapes) instead."""

    name: str
    shape: tuple[int, ...]
    fwd_bytes: float
    bwd_bytes: float
    source: str
    tensors: tuple[tuple[int, ...], ...] = ()


def valid_tps(model: ModelSpec, tps: tuple[int, ...]) -> list[int]:
    """The TP degrees this model can be split by (heads, kv heads and ffn divisible)."""
    return [t for t in tps if model.heads % t == 0 and model.kv_heads % t == 0
            and model.ffn_hidden % t == 0 and model.hidden % t == 0]


def gemm_points(model: ModelSpec, tps: list[int], mbss: list[int], dtype: str) -> list[GemmPoint]:
    points: dict[tuple, GemmPoint] = {}
    for tp in tps:
        for mbs in mbss:
            plan = Plan(tp=tp, mbs=mbs, dtype=dtype)
            for op in layer_ops(model, plan) + head_ops(model, plan):
                if op.kind != "gemm":
                    continue
                tag = f"{op.name} tp={tp} mbs={mbs}"
                if op.batch == 1:
                    cand = [GemmPoint(executed_gemm(op.shape, form), 1, form, f"{tag} {pass_}")
                            for pass_, form in GEMM_FORMS.items()]
                else:   # no weight: only the input-gradient GEMM in backward (ops._gemm)
                    cand = [GemmPoint(executed_gemm(op.shape, GEMM_FORMS[pass_]), op.batch, "bmm", f"{tag} {pass_}")
                            for pass_ in ("fwd", "bwd_input")]
                for p in cand:
                    # one row per key: the table has no batch column, and a Linear wins a tie
                    if p.key not in points or (points[p.key].batch > 1 and p.batch == 1):
                        points[p.key] = p
    return sorted(points.values(), key=lambda p: (p.key, p.form))


def attention_points(model: ModelSpec, tps: list[int], mbss: list[int]) -> list[AttentionPoint]:
    pts = {AttentionPoint(mbs, model.heads // tp, model.kv_heads // tp, model.seq_len, model.head_dim)
           for tp in tps for mbs in mbss}
    return sorted(pts, key=lambda p: (p.batch_heads, p.heads))


def membound_points(model: ModelSpec, tps: list[int], mbss: list[int], dtype: str) -> list[MemboundPoint]:
    e = DTYPE_BYTES[dtype]
    h, s = model.hidden, model.seq_len
    out: list[MemboundPoint] = []

    def add(name: str, shape: tuple[int, ...], fwd: float, tag: str) -> None:
        out.append(MemboundPoint(name, shape, fwd, BWD_BYTES_FACTOR * fwd, tag))

    for tp in tps:
        plan = Plan(tp=tp, dtype=dtype)
        f, heads, vocab = model.ffn_hidden // tp, model.heads // tp, padded_vocab(model, plan) // tp
        for mbs in mbss:
            tok = mbs * s
            tag = f"tp={tp} mbs={mbs}"
            add("layernorm", (tok, h), 2 * tok * h * e, tag)          # ops: input_norm, 1 read + 1 write
            add("rmsnorm", (tok, h), 2 * tok * h * e, tag)
            add("residual_add", (tok, h), 3 * tok * h * e, tag)       # ops: attn_residual, reads=2
            add("gelu", (tok, f), 2 * tok * f * e, tag)
            add("swiglu", (tok, f), 3 * tok * f * e, tag)             # ops: swiglu, reads=2
            add("softmax", (mbs * heads, s, s), 2 * mbs * heads * s * s * e, tag)
            # unfused attention's causal masked_fill (ops: attn_mask; the gradient's bytes backward):
            # its own point, as eager masked_fill with a broadcast bool (s, s) mask took 3-12x a
            # residual add's time over the same bytes (2-vCPU Zen 3 EPYC, torch 2.13, 2026-11-30;
            # studies/validation_cpu/heldout/head_and_mask.py)
            scores = 2 * mbs * heads * s * s * e
            out.append(MemboundPoint("causal_mask", (mbs * heads, s, s), scores, scores, tag))
            # dropout as torch runs it on a CPU (ops: attn_dropout, the residual and embedding
            # dropouts; ``Stack.dropout_noise``): bernoulli noise, its scale, the product -- RNG
            # bound, 15-40x a residual add's time over the same elements (2-vCPU Zen 4, torch
            # 2.13, 2026-12-03): over the residual stream and over the scores
            add("dropout", (tok, h), 2 * tok * h * e, tag)
            add("dropout", (mbs * heads, s, s), scores, tag)
            add("cross_entropy", (tok, vocab), 2 * tok * vocab * 4, tag)   # ops: fp32 logits
            # ops.embedding_ops: backward also writes the local table's dense gradient
            out.append(MemboundPoint("embedding", (tok, vocab, h), 2 * tok * h * e,
                                     embedding_bwd_bytes(2 * tok * h * e, vocab * h, e), tag))
            out.append(rope_point(model, tp, mbs, dtype, tag))
        tensors = tuple(adamw_param_shapes(model, tp))
        params = sum(math.prod(shape) for shape in tensors)
        out.append(MemboundPoint("adamw", (params,), params * adamw_bytes_per_param(dtype), 0.0, f"tp={tp}", tensors))
        # autograd's AccumulateGrad: grad += new over every weight (costs.ops._grad_accumulation)
        grad_bytes = state_bytes(dtype).grad
        out.append(MemboundPoint("grad_accumulate", (params,), 3.0 * grad_bytes * params, 0.0, f"tp={tp}", tensors))
    return out


def rope_point(model: ModelSpec, tp: int, mbs: int, dtype: str, tag: str) -> MemboundPoint:
    """The rotary embedding of one layer's q and k heads on one TP rank, as one tensor of
    (mbs, heads + kv heads, seq, head dim) (``compute.membound_case``), whatever the model's own
    position encoding: a machine measurement, with the bytes ``costs.ops.layer_ops``' "rope" op
    counts for that shape (fp32 under autocast, ``saved.Precision.rope``). Timed alone it takes
    RoPE out of the composition terms, which held it as an average over the synthetic stages
    (``Op.in_composition``): on a GQA model the executor's eager RoPE took 0.7 ms of a 3.9 ms
    bf16 layer forward (2-vCPU AMD EPYC, 2026-11-30), priced 15 % fast with it composed."""
    rotary = replace(model, position="rope")
    op = next(o for o in layer_ops(rotary, Plan(tp=tp, mbs=mbs, dtype=dtype)) if o.name == "rope")
    shape = (mbs, (model.heads + model.kv_heads) // tp, model.seq_len, model.head_dim)
    return MemboundPoint("rope", shape, op.fwd_bytes, op.bwd_bytes, tag)


# Memory-bound op names of parsim.costs.ops -> the benchmark that stands for them
# (timing.membound_time looks the table up by op name).
OP_NAME_ALIASES = {
    "input_norm": "{norm}", "post_attn_norm": "{norm}", "final_norm": "{norm}",
    "attn_residual": "residual_add", "mlp_residual": "residual_add",
}


def adamw_param_shapes(model: ModelSpec, tp: int) -> list[tuple[int, ...]]:
    """Per-rank parameter tensors of the whole model at TP degree ``tp`` (weights + norms +
    the vocab-parallel embedding): what one rank's AdamW steps over."""
    h, kv, f = model.hidden, model.kv_hidden, model.ffn_hidden
    vocab = padded_vocab(model, Plan(tp=tp)) // tp
    layer = [((h + 2 * kv) // tp, h), (h, h // tp), (f // tp, h), (h, f // tp), (h,), (h,)]
    if model.activation == "swiglu":
        layer.append((f // tp, h))
    return layer * model.layers + [(vocab, h)]
