"""Activation memory per transformer layer, per embedding / head, and what a backward holds.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
Sec. 4, Table 2, with 2-byte activations, 1-byte dropout masks, GELU MLP (f = 4h), MHA:
    no parallelism                 s b h (34 + 5 a s / h)
    tensor parallel (t)            s b h (10 + 24/t + 5 a s / (h t))
    tensor + sequence parallel     s b h (34/t + 5 a s / (h t))
    tensor parallel + selective    s b h (10 + 24/t)
    tensor + sequence + selective  s b h (34/t)
    full recomputation             2 s b h  (2 s b h / t with sequence parallel)
Here each term is rebuilt from its parts so dtype (e bytes), GQA (K, V of kv_hidden), SwiGLU
(f != 4h, two up projections), no dropout and FlashAttention change exactly the parts they
touch, and so do the stack's kernels (``Stack``: eager PyTorch's unfused softmax, RMSNorm,
SwiGLU and RoPE keep more than Megatron's fused ones). Result in bytes per layer per microbatch
on one device.
"""
from __future__ import annotations

from parsim.specs import ModelSpec, Plan, plan_stack

from .footprint import backward_working
from .ops import DTYPE_BYTES, padded_vocab

MASK_BYTES = 1     # dropout masks stored as bytes (Korthikanti 2022 Sec. 4.1)
LSE_BYTES = 4      # FlashAttention keeps the fp32 log-sum-exp per row (Dao et al. 2022)
FP32_BYTES = 4


def layer_activation_bytes(model: ModelSpec, plan: Plan, recompute: str | None = None) -> float:
    """Bytes one layer keeps for backward, per microbatch, on one TP rank."""
    recompute = plan.recompute if recompute is None else recompute
    t = plan.tp
    e = DTYPE_BYTES[plan.dtype]
    sb = model.seq_len * plan.mbs
    h, kv, f = model.hidden, model.kv_hidden, model.ffn_hidden
    a = model.heads
    sp = t if plan.sp else 1                   # divisor of the "replicated" parts under SP
    if recompute == "full":
        return e * sb * h / sp                 # only the layer input is kept
    mask = MASK_BYTES if model.dropout else 0
    # Parts replicated across TP ranks unless sequence parallel:
    #   2 norm inputs, QKV input, MLP-up input (e*sbh each) + 2 residual dropout masks.
    replicated = (4 * e + 2 * mask) * sb * h
    # Parts split t ways: Q, K, V, attention-out input, MLP activations.
    qkv = e * sb * (h + 2 * kv)
    attn_out_in = e * sb * h
    stack = plan_stack(plan)
    if model.activation == "swiglu":
        mlp = e * sb * (2 * f) + e * sb * f    # gate & up outputs (SwiGLU input) + down input
        mlp += e * sb * f if stack.eager_swiglu else 0.0   # + silu(gate), kept by the eager product
    else:
        mlp = e * sb * f + e * sb * f          # GeLU input + down input
    if model.norm == "rmsnorm" and stack.eager_rmsnorm:
        # each of the 2 norms keeps its input and normalized output in fp32, not its e-byte input
        replicated += 2 * (2 * FP32_BYTES - e) * sb * h
    rope = 0.0
    if model.position == "rope" and stack.rope_relayout:
        if model.flash_attention:              # SDPA keeps its output; the projection reads a copy
            attn_out_in += e * sb * h          # (the explicit core keeps no output: one copy either way)
        rope = FP32_BYTES * model.seq_len * model.head_dim  # the fp32 cos and sin tables, s x d/2 each
    sharded = qkv + attn_out_in + mlp
    # Attention core (the part selective recomputation drops).
    causal = 0.0
    if model.flash_attention:
        core = LSE_BYTES * a * sb              # only the log-sum-exp; no s^2 terms
    else:
        s = model.seq_len
        core = e * a * s * sb                  # softmax output
        if model.dropout:
            core += mask * a * s * sb + e * a * s * sb   # dropout mask + dropout output
        # GQA: the unfused products multiply K and V repeated to every query head (Megatron's
        # DotProductAttention and the executor ``repeat_interleave`` them), so those, not the
        # kv_hidden-wide K and V, are kept: e*s*b*2(h - kv) more than ``qkv`` counts
        core += e * sb * 2 * (h - kv)
        # the causal mask the stack keeps per layer and microbatch (one per TP rank): s^2 elements
        causal = stack.attention_mask_bytes * s * s
    if recompute == "selective" and not model.flash_attention:
        core, causal = 0.0, 0.0
    return replicated / sp + (sharded + core) / t + causal + rope


def embedding_activation_bytes(model: ModelSpec, plan: Plan) -> float:
    """First stage: the embedding dropout mask (Korthikanti 2022 Sec. 4.3), per microbatch."""
    if not model.dropout:
        return 0.0
    sb = model.seq_len * plan.mbs
    return MASK_BYTES * sb * model.hidden / (plan.tp if plan.sp else 1)


def head_activation_bytes(model: ModelSpec, plan: Plan) -> float:
    """Last stage: final-norm input and logits input (e*sbh each) and the logits kept by the
    cross-entropy (Korthikanti 2022 Sec. 4.3: fp32, 4*s*b*V/t; the stack's loss says how many
    bytes per logit, ``Stack.loss_logits_bytes``), per microbatch."""
    e = DTYPE_BYTES[plan.dtype]
    sb = model.seq_len * plan.mbs
    sp = plan.tp if plan.sp else 1
    kept = plan_stack(plan).loss_logits_bytes
    return 2 * e * sb * model.hidden / sp + kept * sb * padded_vocab(model, plan) / plan.tp


def stage_output_bytes(model: ModelSpec, plan: Plan) -> float:
    """A non-last pipeline stage keeps the output it sent until that microbatch's backward
    (``autograd.backward(output, grad)`` needs it; torch.distributed.pipelining's
    ``fwd_cache``, the reference executor): e*s*b*h per microbatch, sequence-sharded with SP.
    Megatron-LM can free it right after the send (``deallocate_pipeline_outputs``); that
    option is not modelled, so this overstates a Megatron run by e*s*b*h per microbatch in flight
    (about 1/(34 L) of a stage of L layers without recomputation)."""
    sp = plan.tp if plan.sp else 1
    return DTYPE_BYTES[plan.dtype] * model.seq_len * plan.mbs * model.hidden / sp


def logits_grad_bytes(model: ModelSpec, plan: Plan) -> float:
    """The cross-entropy backward's peak beside the stored logits: the gradient of the
    log-probabilities and of the logits exist together, fp32, 2 x 4*s*b*V/t bytes (torch's
    ``F.cross_entropy`` = log_softmax + nll_loss, the executor). Megatron-LM's vocab-parallel
    cross entropy writes its gradient into the saved softmax in place: the stack's loss says
    how many bytes per logit (``Stack.loss_grad_bytes``)."""
    return plan_stack(plan).loss_grad_bytes * model.seq_len * plan.mbs * padded_vocab(model, plan) / plan.tp


def vocab_grad_bytes(model: ModelSpec, plan: Plan) -> float:
    """One dense gradient of the embedding table or the output layer on one device, V/t x h
    elements in the compute dtype (``embedding_dense_backward``; the head's weight gradient)."""
    return DTYPE_BYTES[plan.dtype] * padded_vocab(model, plan) * model.hidden / plan.tp


def layer_working_bytes(model: ModelSpec, plan: Plan, weight_grads: bool = True) -> float:
    """What a transformer layer's backward holds beyond its stored activations, on one device: the
    larger of its MLP phase and, for unfused attention, its attention phase.

    MLP phase: the gradient of its largest weight, max(f, h) x h / t elements (autograd builds
    each weight's gradient as a new tensor, then adds it into the existing ``.grad`` or gradient
    buffer), plus the activation gradients alive in the MLP backward, e*s*b*(f/t + h/sp) (GeLU:
    the gradients of the down projection's input and of the layer output).
    ``weight_grads=False``: weight gradients are counted elsewhere (FSDP2's unsharded layer
    gradients, ``memory.fsdp2_bytes``). Attention phase: ``attention_working_bytes``."""
    e = DTYPE_BYTES[plan.dtype]
    t = plan.tp
    wg = 1.0 if weight_grads else 0.0
    sbf = e * model.seq_len * plan.mbs * model.ffn_hidden / t
    mlp_phase = sbf + stage_output_bytes(model, plan) + wg * e * max(model.ffn_hidden, model.hidden) * model.hidden / t
    if model.activation == "swiglu" and plan_stack(plan).eager_swiglu:
        # the product's backward: the incoming gradient and the two it makes (silu(gate)'s and
        # up's, e*s*b*f/t each) with the down projection's input freed, beside the residual's
        mlp_phase = max(mlp_phase, 2 * sbf + stage_output_bytes(model, plan))
    return max(mlp_phase, attention_working_bytes(model, plan))


def attention_working_bytes(model: ModelSpec, plan: Plan) -> float:
    """Unfused attention's backward peak beyond the stored activations, on one device (0 for
    flash attention, whose backward works in tiles): the gradients of the (b, a/t, s, s) scores,
    u = e*b*a*s^2/t each. Eager PyTorch (the executor) holds two at once -- the probabilities'
    gradient while softmax's backward writes a new one, then that one while masked_fill's does;
    a fused softmax that works in place (``Stack.softmax_grad_in_place``, Megatron) holds one,
    two with attention dropout (its backward allocates). Beside them the residual stream's
    gradient (e*s*b*h/sp) and V's (e*s*b*h/t) are alive, while the layer's MLP stash, second-norm
    and MLP-up inputs (e*s*b*h/sp each) and the attention-out input (e*s*b*h/t) are freed by
    then: copies*u - e*s*b*h/sp - (MLP stash)/t. Measured on the executor's layer (fp32, tp = 1,
    tiny with s = 128 and 512): 2u - 5 e*s*b*h (f = 2h), as this gives."""
    if model.flash_attention:
        return 0.0
    e = DTYPE_BYTES[plan.dtype]
    t, s, b, h, f = plan.tp, model.seq_len, plan.mbs, model.hidden, model.ffn_hidden
    sp = t if plan.sp else 1
    stack = plan_stack(plan)
    copies = 2 if not stack.softmax_grad_in_place or model.dropout else 1
    # what the MLP kept (``layer_activation_bytes``): GeLU 2f; SwiGLU 3f, 4f with the eager silu(gate)
    mlp_stash = e * s * b * f * ((4 if stack.eager_swiglu else 3) if model.activation == "swiglu" else 2)
    return copies * e * b * model.heads * s * s / t - e * s * b * h / sp - mlp_stash / t


def backward_working_bytes(model: ModelSpec, plan: Plan, first: bool, last: bool, stash: float,
                           weight_grads: bool = True, layer_extra: float = 0.0) -> float:
    """``footprint.backward_working`` of a virtual stage of ``model`` under ``plan`` (``first`` /
    ``last`` virtual stage; ``stash``: the bytes one microbatch stores there; ``layer_extra``: the
    bytes only a layer's backward adds, its recompute transient and FSDP2's layer gradients)."""
    wg = 1.0 if weight_grads else 0.0
    return backward_working(layer_working_bytes(model, plan, weight_grads), stage_output_bytes(model, plan),
                            head_activation_bytes(model, plan), wg * vocab_grad_bytes(model, plan),
                            logits_grad_bytes(model, plan), model.tied_embeddings, first, last, stash, layer_extra)
