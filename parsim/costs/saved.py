"""What one transformer layer saves for its backward, tensor by tensor: the one description of a
layer's stored activations. ``activations.layer_activation_bytes`` (the stash every engine
counts) is the sum of this list under the layer's recompute policy, and
``split_backward.layer_saved_tensors`` (what a zero-bubble W's re-runs keep) is the same list
without the layer input.

From what each op's autograd node saves (``tools/autograd/derivatives.yaml``), torch 2.13: a GEMM
(``mm``/``addmm``) its input and weight; SDPA (``_scaled_dot_product_flash_attention_for_cpu``,
FlashAttention on CUDA) q, k, v, its output and the fp32 log-sum-exp (Dao et al. 2022); in the
explicit core ``matmul`` both operands (GQA's K and V after ``repeat_interleave``), ``softmax`` its
result, ``masked_fill`` its s x s bool mask, dropout its mask (1 byte, Korthikanti et al. 2022
Sec. 4.1) and the dropped probabilities; ``gelu`` and ``silu`` their input; ``mul`` of two tensors
that need a gradient both operands (SwiGLU's silu(gate) * up), a tensor times a constant only the
constant (rope's cos and sin, fp32 s x d/2 each); ``native_layer_norm`` its input and fp32 mean
and rstd; the executor's RMSNorm (``xf = x.float(); y = xf * rsqrt(mean(xf^2) + eps); y * w``)
``pow``'s and the first ``mul``'s input xf, ``rsqrt``'s result (fp32, one per token) and the
weight ``mul``'s y, both fp32. Korthikanti et al. 2022 (Sec. 4, Table 2) count the same tensors
for a GeLU / LayerNorm / MHA layer in 16 bits, less the norms' statistics (8 bytes a token each).

What differs between software stacks is a stack fact (``specs.stack.Stack``): fused kernels keep
less (Megatron's softmax keeps no mask, TE's RMSNorm x and rstd only, ``bias_swiglu`` no
silu(gate), fused RoPE no copy); under sequence parallelism a column-parallel GEMM of eager torch
keeps the all-gathered input it multiplied (``sp_saves_gathered``: ``nn.Linear`` after the
executor's ``_GatherSequence``, as autograd saves what ``mm`` sees), Megatron's the local shard,
all-gathered again in backward (``LinearWithGradAccumulationAndAsyncCommunication``,
megatron/core/tensor_parallel/layers.py; Korthikanti et al. 2022 Sec. 4.2.2); and a 16-bit run
either holds 16-bit parameters (Megatron, DeepSpeed, FSDP's gathered copies) or runs
``torch.autocast`` over fp32 parameters (``autocast``, the executor): ``precision``.
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.specs import ModelSpec, Plan, plan_stack

from .ops import CORE_MATH_BYTES, DTYPE_BYTES, attention_path

MASK_BYTES = 1     # dropout masks stored as bytes (Korthikanti 2022 Sec. 4.1)
LSE_BYTES = 4      # FlashAttention keeps the fp32 log-sum-exp per row (Dao et al. 2022)
FP32_BYTES = 4


@dataclass(frozen=True)
class Precision:
    """Bytes per element of what a layer keeps under a plan's dtype and stack.

    ``act``: what GEMMs, attention and activation functions produce (the compute dtype);
    ``res``: the residual stream (layer input and output, the norms' inputs, pipeline stage
    outputs); ``casts``: each GEMM casts its fp32 input to ``act`` anew and keeps that copy, so
    GEMMs sharing an input keep one copy each (autocast caches only the casts of leaf tensors
    that require a gradient, the weights); ``weight_copy``: bytes per weight element each GEMM
    keeps per microbatch (autocast's cast of the fp32 weight, cached for the forward's autocast
    region and saved by the GEMM's node: one copy per microbatch in flight); ``softmax``: an
    unfused softmax's and its dropout's (fp32 under CUDA's autocast, ``Stack.fp32_softmax``:
    scores cast to fp32 before it, probabilities back to ``act`` for the PV product); ``rope``:
    the rotary embedding's (fp32 under autocast: the executor's cos / sin tables are fp32, so
    q x cos promotes and the chain runs in fp32 until its cast back, ``executor/model.py``
    ``apply_rope``)."""
    act: float
    res: float
    casts: bool
    weight_copy: float
    softmax: float
    rope: float


def precision(plan: Plan) -> Precision:
    """The ``Precision`` of ``plan``. With 16-bit parameters every tensor is in the plan's dtype
    (e bytes; Korthikanti et al. 2022 Table 2). Under ``torch.autocast`` (the executor,
    ``executor/optimizer.py``; torch's "Automatic Mixed Precision" docs: ``linear``, ``matmul``
    and ``scaled_dot_product_attention`` autocast to the 16-bit type, ops not listed run in their
    inputs' type, and an op of mixed inputs promotes to the wider) the parameters are fp32, so the
    embedding's output, every residual add (fp32 + 16-bit) and the norms stay fp32: the residual
    stream is fp32 and each GEMM reading it keeps its own 16-bit cast."""
    e = DTYPE_BYTES[plan.dtype]
    stack = plan_stack(plan)
    if stack.autocast and e < FP32_BYTES:
        return Precision(act=e, res=FP32_BYTES, casts=True, weight_copy=e,
                         softmax=FP32_BYTES if stack.fp32_softmax else e, rope=FP32_BYTES)
    return Precision(act=e, res=e, casts=False, weight_copy=0.0, softmax=e, rope=e)


def dropout_mask_bytes(plan: Plan, input_bytes: float) -> float:
    """Bytes a dropout keeps per element for backward: a 1-byte mask (Korthikanti 2022 Sec.
    4.1; CUDA's fused ``native_dropout``), or where the stack's dropout multiplies by a scaled
    noise tensor (``Stack.dropout_noise``: torch on a CPU) that noise, in its input's dtype."""
    return input_bytes if plan_stack(plan).dropout_noise else MASK_BYTES


def residual_dropout_input_bytes(model: ModelSpec, plan: Plan) -> float:
    """Bytes per element of what a residual dropout reads: the row-parallel GEMM's output,
    promoted to fp32 by an fp32 bias under autocast (``executor/model.py`` ``add_bias``)."""
    p = precision(plan)
    return FP32_BYTES if p.casts and model.bias else p.act


@dataclass(frozen=True)
class Saved:
    """One tensor a layer saves: bytes per microbatch on one device; ``last``: the last weight
    group whose node saves it (``split_backward.weight_groups``), None where a weightless op's
    node saves it too; ``part``: ``input`` (the layer input), ``core`` (saved only inside the
    attention core, softmax(q k^T) v, which selective recomputation checkpoints: its inputs q, k,
    v stay, what it saves beyond them goes) or ``layer``."""
    name: str
    nbytes: float
    last: str | None
    part: str = "layer"


@dataclass(frozen=True)
class LayerSaved:
    """``tensors`` in forward order; ``core_end``: how many of them the attention core has saved
    by its end; ``core_transient``: what the explicit core holds at its peak beyond them."""
    tensors: list[Saved]
    core_end: int
    core_transient: float


def norm_saved(model: ModelSpec, plan: Plan, name: str, rows: float, last: str | None,
               input_part: str = "layer") -> list[Saved]:
    """What a norm over ``rows`` tokens keeps (its output is saved by the GEMMs reading it): its
    input and statistics. LayerNorm (``native_layer_norm``, TE's too): the input and fp32 mean
    and rstd, all saved by its weight node. The executor's eager RMSNorm (``Stack.eager_rmsnorm``):
    xf and y in fp32 (a 16-bit input's fp32 copy; the input itself is not saved) and fp32 rstd,
    only y by the weight node; a fused one (TE): the input and rstd."""
    p, h = precision(plan), model.hidden
    if model.norm == "rmsnorm" and plan_stack(plan).eager_rmsnorm:
        return [Saved(f"{name} input (fp32)", FP32_BYTES * rows * h, None, input_part),
                Saved(f"{name} rstd", FP32_BYTES * rows, None),
                Saved(f"{name} x * rstd (fp32)", FP32_BYTES * rows * h, last)]
    stats = 1 if model.norm == "rmsnorm" else 2
    return [Saved(f"{name} input", p.res * rows * h, last, input_part),
            Saved(f"{name} {'rstd' if stats == 1 else 'mean, rstd'}", stats * FP32_BYTES * rows, last)]


def gemm_inputs(plan: Plan, name: str, rows: float, width: float, readers: tuple[str, ...]) -> list[Saved]:
    """The input the GEMMs ``readers`` (weight groups) save: one tensor, released with the last of
    them, or under autocast one 16-bit cast each (``Precision.casts``)."""
    p = precision(plan)
    if not p.casts:
        return [Saved(name, p.act * rows * width, readers[-1])]
    return [Saved(f"{name} ({g}'s cast)", p.act * rows * width, g) for g in readers]


def weight_copies(model: ModelSpec, plan: Plan, groups: tuple[str, ...]) -> list[Saved]:
    """Autocast's 16-bit copy of each of these GEMMs' weights (``Precision.weight_copy``), saved
    by its node; none with 16-bit parameters."""
    p, t = precision(plan), plan.tp
    h, kv, f = model.hidden, model.kv_hidden, model.ffn_hidden
    size = {"q": h * h, "k": h * kv, "v": h * kv, "o": h * h, "up": h * f, "gate": h * f, "down": f * h}
    return [Saved(f"{g} weight (16-bit copy)", p.weight_copy * size[g] / t, g) for g in groups] if p.weight_copy else []


def up_groups(model: ModelSpec) -> tuple[str, ...]:
    """The weight groups of the MLP's input GEMMs: up, and gate with SwiGLU."""
    return ("up", "gate") if model.activation == "swiglu" else ("up",)


def stream_readers(model: ModelSpec) -> tuple[str, ...]:
    """The GEMMs reading a norm's output (the residual stream's side): q, k, v, up(, gate)."""
    return ("q", "k", "v") + up_groups(model)


def gemm_input_rows(model: ModelSpec, plan: Plan) -> float:
    """Tokens of the input a column-parallel GEMM multiplies: all b*s, or under SP the local s/t
    where the stack's GEMMs keep the shard (``Stack.sp_saves_gathered`` false: Megatron)."""
    tokens = model.seq_len * plan.mbs
    return tokens if (not plan.sp or plan_stack(plan).sp_saves_gathered) else tokens / plan.tp


def layer_weight_copy_bytes(model: ModelSpec, plan: Plan) -> float:
    """Autocast's 16-bit copies of all of one layer's GEMM weights (0 with 16-bit parameters)."""
    groups = ("q", "k", "v", "o") + up_groups(model) + ("down",)
    return sum(x.nbytes for x in weight_copies(model, plan, groups))


def layer_saved(model: ModelSpec, plan: Plan) -> LayerSaved:
    """Every tensor one layer's forward saves for backward (the module docstring), per microbatch
    on one TP rank, the layer input first, in forward order."""
    p, stack = precision(plan), plan_stack(plan)
    e, t, a, s, sb = p.act, plan.tp, model.heads, model.seq_len, model.seq_len * plan.mbs
    h, kv, f = model.hidden, model.kv_hidden, model.ffn_hidden
    rows = sb / (t if plan.sp else 1)                 # tokens a norm, residual or dropout sees
    gemm_rows, ups = gemm_input_rows(model, plan), up_groups(model)
    out = norm_saved(model, plan, "attn_norm", rows, "attn_norm", input_part="input")
    out += gemm_inputs(plan, "attn_norm output", gemm_rows, h, ("q", "k", "v")) + weight_copies(model, plan, ("q", "k", "v"))
    path = attention_path(model, plan)
    explicit_gqa = path == "explicit" and model.kv_heads != model.heads
    out += [Saved("q", e * sb * h / t, None), Saved("k", e * sb * kv / t, None), Saved("v", e * sb * kv / t, None)]
    if explicit_gqa:                                   # the explicit core repeats K and V to every head
        out.append(Saved("K, V repeated (beyond k, v)", 2 * e * sb * (h - kv) / t, None, "core"))
    if model.position == "rope" and stack.rope_relayout:    # fp32 tables, s x d/2 each
        out.append(Saved("rope cos, sin", 2 * FP32_BYTES * s * model.head_dim / 2, None))
    scores = e * a * s * sb / t                       # one (b, a/t, s, s) tensor of the explicit core
    core_transient = 0.0
    relaid = model.position == "rope" and stack.rope_relayout
    if path == "flash":
        # the attention-out GEMM reads a view of SDPA's output, unless rope relaid q out (a copy)
        out += [Saved("attention output", e * sb * h / t, None, "core" if relaid else "layer"),
                Saved("log-sum-exp", LSE_BYTES * a * sb / t, None, "core")]
    elif path == "math":
        core_transient = _math_core(out, model, plan, sb)
    else:
        # the causal mask: one (s, s) per layer and microbatch on every TP rank
        # fp32 softmax under CUDA's autocast (``Stack.fp32_softmax``): it keeps its fp32 result,
        # and the PV product the 16-bit cast of what it multiplies (dropout's output, or the
        # probabilities themselves): 2 bytes a score more than in 16 bits (an H200's peaks,
        # studies/gpu_check/h200_overlap)
        out += [Saved("causal mask", stack.attention_mask_bytes * s * s, None, "core"),
                Saved("softmax output", scores * p.softmax / e, None, "core")]
        if model.dropout:
            out += [Saved("attention dropout mask", dropout_mask_bytes(plan, p.softmax) * a * s * sb / t, None, "core"),
                    Saved("attention dropout output", scores, None, "core")]
        elif p.softmax > e:
            out.append(Saved("probabilities' 16-bit copy", scores, None, "core"))
        # the scaled scores stay referenced (``Attention.core``'s ``scores``) to the core's end; the
        # masked ones live until ``softmax`` returns, which is the peak unless dropout follows it;
        # GQA's K and V before their repeat stay referenced by ``Attention.body``
        core_transient = (scores if model.dropout else 2 * scores) + (2 * e * sb * kv / t if explicit_gqa else 0.0)
    core_end = len(out) - 1                           # counted without the layer input
    # SDPA returns its output in q's layout: without rope (q a transposed view of the GEMM's
    # output) the attention-out GEMM reads a view of it; with rope (q rotated into a new
    # contiguous tensor) or the explicit core a copy
    if relaid or path != "flash":
        out.append(Saved("attention-out input", e * sb * h / t, "o"))
    out += weight_copies(model, plan, ("o",))
    resid_in = residual_dropout_input_bytes(model, plan)
    if model.dropout:
        out.append(Saved("attention residual dropout mask", dropout_mask_bytes(plan, resid_in) * rows * h, None))
    out += norm_saved(model, plan, "mlp_norm", rows, "mlp_norm")
    out += gemm_inputs(plan, "mlp_norm output", gemm_rows, h, ups) + weight_copies(model, plan, ups)
    if model.activation == "swiglu":
        out.append(Saved("gate output (SiLU input)", e * sb * f / t, None))
        if stack.eager_swiglu:                         # the eager product keeps silu(gate) too
            out.append(Saved("SiLU output", e * sb * f / t, None))
        out.append(Saved("up output", e * sb * f / t, None))
    else:
        out.append(Saved("up output (GeLU input)", e * sb * f / t, None))
    out.append(Saved("down input", e * sb * f / t, "down"))
    out += weight_copies(model, plan, ("down",))
    if model.dropout:
        out.append(Saved("MLP residual dropout mask", dropout_mask_bytes(plan, resid_in) * rows * h, None))
    return LayerSaved(out, core_end, core_transient)


def _math_core(out: list[Saved], model: ModelSpec, plan: Plan, sb: float) -> float:
    """SDPA's math path (``ops.attention_path``), appended to ``out``: its fp32 copies of q, k
    (both scaled) and v, every head's (GQA's k and v repeated), beyond the q, k, v already listed
    (which only a checkpoint of the core keeps); its softmax output, dropout noise and dropout
    output, all fp32; no causal mask (added in place). Returns what it holds at its peak beyond
    them (the scores before softmax). Read off the executor's saved tensors
    (tests/test_saved_tensors.py)."""
    e, t, c = precision(plan).act, plan.tp, CORE_MATH_BYTES
    h, kv, a, s = model.hidden, model.kv_hidden, model.heads, model.seq_len
    scores = c * a * s * sb / t
    out += [Saved("q, k, v fp32 copies (beyond q, k, v)", (3 * c * h - e * (h + 2 * kv)) * sb / t, None, "core"),
            Saved("softmax output (fp32)", scores, None, "core"),
            Saved("attention dropout noise", dropout_mask_bytes(plan, c) * a * s * sb / t, None, "core"),
            Saved("attention dropout output (fp32)", scores, None, "core")]
    return scores
