"""Activation memory per transformer layer, per embedding / head, and what a backward holds.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
Sec. 4, Table 2, with 2-byte activations, 1-byte dropout masks, GELU MLP (f = 4h), MHA:
    no parallelism                 s b h (34 + 5 a s / h)
    tensor parallel (t)            s b h (10 + 24/t + 5 a s / (h t))
    tensor + sequence parallel     s b h (34/t + 5 a s / (h t))
    tensor parallel + selective    s b h (10 + 24/t)
    tensor + sequence + selective  s b h (34/t)
    full recomputation             2 s b h  (2 s b h / t with sequence parallel)
A layer's bytes are the sum of what it saves, tensor by tensor (``costs.saved.layer_saved``: each
term of the table, plus the norms' fp32 statistics), so dtype, GQA (K, V of kv_hidden), SwiGLU
(f != 4h, two up projections), no dropout, FlashAttention, the stack's kernels (``Stack``: eager
PyTorch's unfused softmax, RMSNorm, SwiGLU and RoPE keep more than Megatron's fused ones),
sequence parallelism's saved GEMM inputs and autocast's fp32 residual stream and 16-bit copies
(``saved.precision``) change exactly the tensors they touch. Result in bytes per layer per
microbatch on one device.
"""
from __future__ import annotations

from parsim.specs import ModelSpec, Plan, plan_stack

from .footprint import backward_working
from .ops import CORE_MATH_BYTES, DTYPE_BYTES, attention_path, padded_vocab
from .saved import FP32_BYTES, dropout_mask_bytes, gemm_inputs, layer_saved, layer_weight_copy_bytes, norm_saved, precision


def layer_activation_bytes(model: ModelSpec, plan: Plan, recompute: str | None = None) -> float:
    """Bytes one layer keeps for backward, per microbatch, on one TP rank: the sum of
    ``saved.layer_saved`` -- under full recomputation only the layer input the checkpoint keeps
    (residual-stream bytes, s b h / t with SP; Chen et al. 2016), under selective recomputation
    without what the attention core saves beyond its inputs (Korthikanti et al. 2022 Sec. 5: the
    s^2 terms of unfused attention; FlashAttention's log-sum-exp)."""
    recompute = plan.recompute if recompute is None else recompute
    if recompute == "full":
        return precision(plan).res * model.seq_len * plan.mbs * model.hidden / (plan.tp if plan.sp else 1)
    drop = "core" if recompute == "selective" else None
    return sum(x.nbytes for x in layer_saved(model, plan).tensors if x.part != drop)


def embedding_activation_bytes(model: ModelSpec, plan: Plan) -> float:
    """First stage: the embedding dropout mask (Korthikanti 2022 Sec. 4.3), per microbatch."""
    if not model.dropout:
        return 0.0
    sb = model.seq_len * plan.mbs
    return dropout_mask_bytes(plan, precision(plan).res) * sb * model.hidden / (plan.tp if plan.sp else 1)


def head_activation_bytes(model: ModelSpec, plan: Plan) -> float:
    """Last stage, per microbatch: what the final norm keeps (``saved.norm_saved``), the output
    layer's input (``saved.gemm_inputs``; under autocast also its 16-bit weight copy) and the
    logits kept by the cross-entropy (Korthikanti 2022 Sec. 4.3: fp32, 4*s*b*V/t; the stack's
    loss says how many bytes per logit, ``Stack.loss_logits_bytes``)."""
    p, stack = precision(plan), plan_stack(plan)
    sb = model.seq_len * plan.mbs
    rows = sb / (plan.tp if plan.sp else 1)
    gemm_rows = sb if (not plan.sp or stack.sp_saves_gathered) else rows
    vocab = padded_vocab(model, plan) / plan.tp
    kept = sum(x.nbytes for x in norm_saved(model, plan, "final norm", rows, "head")
               + gemm_inputs(plan, "logits input", gemm_rows, model.hidden, ("head",)))
    return kept + p.weight_copy * vocab * model.hidden + loss_saved_bytes(model, plan)


def loss_saved_bytes(model: ModelSpec, plan: Plan) -> float:
    """Last stage, per microbatch: the logits' values the loss keeps for its backward (torch's
    ``F.cross_entropy`` saves its fp32 log-softmax, 4*s*b*V/t; ``Stack.loss_logits_bytes`` per
    logit). Part of ``head_activation_bytes``."""
    return plan_stack(plan).loss_logits_bytes * model.seq_len * plan.mbs * padded_vocab(model, plan) / plan.tp


def stage_output_bytes(model: ModelSpec, plan: Plan) -> float:
    """A non-last pipeline stage keeps the output it sent until that microbatch's backward
    (``autograd.backward(output, grad)`` needs it; torch.distributed.pipelining's
    ``fwd_cache``, the reference executor): s*b*h residual-stream elements per microbatch
(``saved.precision``: e bytes, fp32 under autocast), sequence-sharded with SP.
    Megatron-LM can free it right after the send (``deallocate_pipeline_outputs``); that
    option is not modelled, so this overstates a Megatron run by e*s*b*h per microbatch in flight
    (about 1/(34 L) of a stage of L layers without recomputation)."""
    sp = plan.tp if plan.sp else 1
    return precision(plan).res * model.seq_len * plan.mbs * model.hidden / sp


def logits_grad_bytes(model: ModelSpec, plan: Plan) -> float:
    """The cross-entropy backward's peak beside the stored logits: the gradient of the
    log-probabilities and of the logits exist together, fp32, 2 x 4*s*b*V/t bytes (torch's
    ``F.cross_entropy`` = log_softmax + nll_loss, the executor). Megatron-LM's vocab-parallel
    cross entropy writes its gradient into the saved softmax in place: the stack's loss says
    how many bytes per logit (``Stack.loss_grad_bytes``; with tp > 1 ``tp_loss_grad_bytes``
    where it differs, the executor's vocabulary-parallel loss, whose fp32 gradient autocast then
    casts to the 16-bit logits' type beside it)."""
    stack, p = plan_stack(plan), precision(plan)
    per_logit = stack.loss_grad_bytes
    if plan.tp > 1 and stack.tp_loss_grad_bytes is not None:
        per_logit = stack.tp_loss_grad_bytes + (p.act if p.casts else 0.0)
    return per_logit * model.seq_len * plan.mbs * padded_vocab(model, plan) / plan.tp


def vocab_grad_bytes(model: ModelSpec, plan: Plan) -> float:
    """One dense gradient of the embedding table or the output layer on one device, V/t x h
    elements in the compute dtype (``embedding_dense_backward``; the head's weight gradient)."""
    return DTYPE_BYTES[plan.dtype] * padded_vocab(model, plan) * model.hidden / plan.tp


def embedding_grad_bytes(model: ModelSpec, plan: Plan) -> float:
    """The embedding table's dense gradient on one device (``embedding_dense_backward``), V/t x h
    elements in the dtype of the gradient the embedding's output receives: the residual stream's
    (``saved.Precision.res``: fp32 under autocast, where the embedding's output stays fp32).
    Measured on 2 gloo ranks (probe-gqa, 12,000 x 384, bf16 interleaved pp 2 vpp 2): the first
    rank peaked at its embedding's backward 9.2 MiB above the 16-bit count, 8.79 MiB being the
    table at 2 bytes more an element."""
    return precision(plan).res * padded_vocab(model, plan) * model.hidden / plan.tp


def layer_working_bytes(model: ModelSpec, plan: Plan, weight_grads: bool = True) -> float:
    """What a transformer layer's backward holds beyond its stored activations, on one device: the
    larger of its MLP phase and, for unfused attention, its attention phase.

    MLP phase: the gradient of its largest weight, max(f, h) x h / t elements (autograd builds
    each weight's gradient as a new tensor, then adds it into the existing ``.grad`` or gradient
    buffer), plus the activation gradients alive in the MLP backward, e*s*b*(f/t + h/sp) (GeLU:
    the gradients of the down projection's input and of the layer output; under autocast the
    latter in fp32 and its 16-bit cast beside it: measured on the executor's layer, bf16, tp = 1,
    heldout-gpt, to the byte).
    ``weight_grads=False``: weight gradients are counted elsewhere (FSDP2's unsharded layer
    gradients, ``memory.fsdp2_bytes``). Attention phase: ``attention_working_bytes``."""
    p = precision(plan)
    t = plan.tp
    wg = 1.0 if weight_grads else 0.0
    sb = model.seq_len * plan.mbs
    sbf = p.act * sb * model.ffn_hidden / t
    # autocast: the MLP-down GEMM's node gets the fp32 residual gradient cast to 16 bits (a second
    # copy, e s b h) and makes a 16-bit weight gradient; its fp32 cast comes after the node has
    # freed its saved input and weight copy, so it never tops this moment
    cast = p.act * sb * model.hidden if p.casts else 0.0
    mlp_phase = sbf + stage_output_bytes(model, plan) + cast + wg * p.act * max(model.ffn_hidden, model.hidden) * model.hidden / t
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
    tiny with s = 128 and 512): 2u - 5 e*s*b*h (f = 2h), as this gives. SDPA's math path
    (``ops.attention_path``) holds its score gradients in fp32. With attention dropout eager
    PyTorch frees the dropout's output (saved for the PV product) when that product's backward
    ends, before its second gradient is allocated: one u net (measured on tiny, s = 128, fp32,
    with and without full recomputation)."""
    scores = score_gradient_bytes(model, plan)
    if not scores:
        return 0.0
    e = DTYPE_BYTES[plan.dtype]
    t, s, b, h, f = plan.tp, model.seq_len, plan.mbs, model.hidden, model.ffn_hidden
    sp = t if plan.sp else 1
    stack = plan_stack(plan)
    # what the MLP kept (``layer_activation_bytes``): GeLU 2f; SwiGLU 3f, 4f with the eager silu(gate)
    mlp_stash = e * s * b * f * ((4 if stack.eager_swiglu else 3) if model.activation == "swiglu" else 2)
    return scores - e * s * b * h / sp - mlp_stash / t


def score_gradient_bytes(model: ModelSpec, plan: Plan, retained: bool = False) -> float:
    """The score gradients unfused attention's backward holds at once, on one device
    (``attention_working_bytes``: copies x u; 0 for flash attention). ``retained``: in a split
    backward's I, which runs ``autograd.grad(..., retain_graph=True)`` and so frees no saved
    tensor as it goes; eager PyTorch's dropout output, saved for the PV product, then stays, and
    the two gradients of a pass without dropout are held with dropout too."""
    path = attention_path(model, plan)
    if path == "flash":
        return 0.0
    e = DTYPE_BYTES[plan.dtype]
    u = (CORE_MATH_BYTES if path == "math" else e) * plan.mbs * model.heads * model.seq_len ** 2 / plan.tp
    eager = not plan_stack(plan).softmax_grad_in_place
    copies = (1 if model.dropout and not retained else 2) if eager else (2 if model.dropout else 1)
    return copies * u


def forward_working_bytes(model: ModelSpec, plan: Plan, last: bool, recomputed_layers: float) -> float:
    """What a virtual stage's forward holds at its end beyond what it stores, on one device, where
    it can outweigh the backward after it. Under autocast (``saved.precision``; the executor's
    16-bit runs) ``torch.autocast`` caches its cast of every weight it meets until the forward's
    autocast region exits (``torch.clear_autocast_cache``): a fully recomputed layer saves none
    of them (``recomputed_layers``: how many of the stage's layers), so their 16-bit copies pile
    up to the forward's end (``saved.layer_weight_copy_bytes`` each). Measured on the executor (2
    gloo ranks, heldout-gpt, tp = 2, SP, 4 recomputed layers, bf16): the forward's end peaks 25 %
    above the backward's start. On the last stage an eager loss holds its logits (e bytes) and an
    fp32 copy (``Stack.loss_forward_bytes``) while it writes the kept ones: (e + 4) s b V/t bytes
    for the torch stack; 0 for the others (their fused losses: not modelled). With tp = 1 the copy
    is ``logits.float()``, which returns fp32 logits themselves: none in fp32 (a single-microbatch
    ZeRO-2 step of an untied 6,000-word model, which peaks at its forward's end, read 5.86 MiB
    high with it: one fp32 logits tensor, 2 gloo ranks, dp 2 and 4)."""
    p, stack = precision(plan), plan_stack(plan)
    loss = 0.0
    if last and stack.loss_forward_bytes:
        copy = stack.loss_forward_bytes if plan.tp > 1 or p.act < FP32_BYTES else 0.0
        loss = (p.act + copy) * model.seq_len * plan.mbs * padded_vocab(model, plan) / plan.tp
    return recomputed_layers * layer_weight_copy_bytes(model, plan) + loss


def backward_working_bytes(model: ModelSpec, plan: Plan, first: bool, last: bool, stash: float,
                           weight_grads: bool = True, layer_extra: float = 0.0,
                           recomputed_layers: float = 0.0, head_kept: float = 0.0,
                           root_post: float = 0.0, absent: float = 0.0, after_layers: float = 0.0,
                           root_grads: bool = False, forward_held: float = 0.0) -> float:
    """``footprint.backward_working`` of a virtual stage of ``model`` under ``plan`` (``first`` /
    ``last`` virtual stage; ``stash``: the bytes one microbatch stores there; ``layer_extra``: the
    bytes only a layer's backward adds, its recompute transient and FSDP2's layer gradients;
    ``recomputed_layers``: the stage's fully recomputed layers, ``forward_working_bytes``;
    ``head_kept``, ``root_post``: FSDP2's root unit, ``memory.fsdp2_root_post_backward``; ``absent``:
    gradient states not yet made, ``fsdp2.fsdp2_absent_grads``; ``after_layers``: what the first
    stage's embedding no longer holds, ``fsdp2.fsdp2_after_layers``; ``root_grads``: FSDP2's root
    unit makes the embedding's and head's weight gradients in this backward where ``weight_grads``
    is off for the layers', counted in ``fsdp2_bytes``; ``forward_held``: what the forward's end
    holds beside ``forward_working_bytes``, ``fsdp2.fsdp2_forward_gather``)."""
    wg = 1.0 if weight_grads else 0.0
    embedding_grad = embedding_grad_bytes(model, plan) if weight_grads or root_grads else 0.0
    return backward_working(layer_working_bytes(model, plan, weight_grads), stage_output_bytes(model, plan),
                            head_activation_bytes(model, plan), wg * vocab_grad_bytes(model, plan),
                            embedding_grad, logits_grad_bytes(model, plan), model.tied_embeddings, first, last, stash, layer_extra,
                            forward_working_bytes(model, plan, last, recomputed_layers) + forward_held, head_kept,
                            root_post, absent,
                            after_layers)
