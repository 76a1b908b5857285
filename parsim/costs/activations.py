"""Activation memory per transformer layer and microbatches in flight per schedule.

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
touch. Result in bytes per layer per microbatch on one device.
"""
from __future__ import annotations

from parsim.specs import ModelSpec, Plan

from .ops import DTYPE_BYTES, padded_vocab

MASK_BYTES = 1     # dropout masks stored as bytes (Korthikanti 2022 Sec. 4.1)
LSE_BYTES = 4      # FlashAttention keeps the fp32 log-sum-exp per row (Dao et al. 2022)


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
    if model.activation == "swiglu":
        mlp = e * sb * (2 * f) + e * sb * f    # gate & up outputs (SwiGLU input) + down input
    else:
        mlp = e * sb * f + e * sb * f          # GeLU input + down input
    sharded = qkv + attn_out_in + mlp
    # Attention core (the part selective recomputation drops).
    if model.flash_attention:
        core = LSE_BYTES * a * sb              # only the log-sum-exp; no s^2 terms
    else:
        s = model.seq_len
        core = e * a * s * sb                  # softmax output
        if model.dropout:
            core += mask * a * s * sb + e * a * s * sb   # dropout mask + dropout output
    if recompute == "selective" and not model.flash_attention:
        core = 0.0
    return replicated / sp + (sharded + core) / t


def embedding_activation_bytes(model: ModelSpec, plan: Plan) -> float:
    """First stage: the embedding dropout mask (Korthikanti 2022 Sec. 4.3), per microbatch."""
    if not model.dropout:
        return 0.0
    sb = model.seq_len * plan.mbs
    return MASK_BYTES * sb * model.hidden / (plan.tp if plan.sp else 1)


def head_activation_bytes(model: ModelSpec, plan: Plan) -> float:
    """Last stage: final-norm input and logits input (e*sbh each) and the fp32 logits kept by
    the cross-entropy (4*s*b*V/t) (Korthikanti 2022 Sec. 4.3), per microbatch."""
    e = DTYPE_BYTES[plan.dtype]
    sb = model.seq_len * plan.mbs
    sp = plan.tp if plan.sp else 1
    return 2 * e * sb * model.hidden / sp + 4 * sb * padded_vocab(model, plan) / plan.tp


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
    cross entropy writes its gradient into the saved softmax in place (one copy, not modelled)."""
    return 2 * 4 * model.seq_len * plan.mbs * padded_vocab(model, plan) / plan.tp


def vocab_grad_bytes(model: ModelSpec, plan: Plan) -> float:
    """One dense gradient of the embedding table or the output layer on one device, V/t x h
    elements in the compute dtype (``embedding_dense_backward``; the head's weight gradient)."""
    return DTYPE_BYTES[plan.dtype] * padded_vocab(model, plan) * model.hidden / plan.tp


def backward_working_bytes(model: ModelSpec, plan: Plan, first: bool, last: bool, stash: float,
                           weight_grads: bool = True) -> float:
    """Bytes a stage's backward holds beyond its stored activations at the backward's peak
    (``other``), on one device; ``stash`` = the bytes one microbatch stores in the stage (freed as
    the backward goes). The largest of:

    * a layer: the gradient of its largest weight, max(f, h) x h / t elements (autograd builds each
      weight's gradient as a new tensor, then adds it into the existing ``.grad`` or gradient
      buffer), plus the activation gradients alive in the MLP backward, e*s*b*(f/t + h/sp) (GeLU:
      the gradients of the down projection's input and of the layer output);
    * the last stage starts with the head: the output weight's gradient (V/t x h) plus the
      gradient of the final norm's output (e*s*b*h/sp), or the cross-entropy's two fp32 logits
      gradients (``logits_grad_bytes``), while a layer's backward comes after the head's stored
      bytes are freed;
    * the first stage ends with the embedding, whose backward writes a dense V/t x h gradient
      (``embedding_dense_backward``) when the microbatch's stash is gone (beside the gradient
      received from the next stage and the embedding output's);
    * one stage holding both ends of tied embeddings (pp = 1): autograd keeps the head's weight
      gradient until the embedding's arrives to sum them (its input buffer), so the layers run
      their backward beside it, and at the end the two and their sum exist together.

    ``weight_grads=False``: weight gradients are counted elsewhere (FSDP2's unsharded layer
    gradients, ``memory.fsdp2_bytes``). Not modelled: Megatron-LM's fused weight-gradient
    accumulation (``gradient_accumulation_fusion`` writes them into the fp32 main grad; this then
    overstates by the weight-gradient term). SwiGLU measured equal to the GeLU terms with its f.
    Measured on the executor's stages (CPU fp32, tp = 1): within 0.01 MiB for cpu-small's middle,
    first, last and single stages at b = 1, 2; tests/test_memory_model.py holds them to 1%."""
    e = DTYPE_BYTES[plan.dtype]
    t = plan.tp
    sbh = stage_output_bytes(model, plan)
    wg = 1.0 if weight_grads else 0.0
    vocab_grad = wg * vocab_grad_bytes(model, plan)
    layer = (e * model.seq_len * plan.mbs * model.ffn_hidden / t + sbh
             + wg * e * max(model.ffn_hidden, model.hidden) * model.hidden / t)
    tied_here = first and last and model.tied_embeddings
    if last:
        out = [layer - head_activation_bytes(model, plan) + vocab_grad * tied_here, sbh + vocab_grad,
               logits_grad_bytes(model, plan)]
    else:
        out = [layer]
    if first:
        # + the gradient received from stage 1 and the embedding output's (none from a loss)
        out.append(vocab_grad * (3 if tied_here else 1) + (0.0 if last else 2 * sbh) - stash)
    return max(out)


def inflight_microbatches(schedule: str, pp: int, m: int, pp_rank: int, vpp: int = 1) -> float:
    """Microbatches whose activations a pipeline rank holds at its peak, in units of the
    rank's full set of layers (so interleaving counts chunks / vpp).

    naive: 1; GPipe: m (Huang et al. 2019); 1F1B: min(p - i, m) (Narayanan et al. 2021 Sec. 2.2.1);
    interleaved: Megatron-LM warm-up of (p - i - 1) * 2 + (v - 1) * p chunk-forwards, +1 in
    steady state, capped at m*v chunks (all m*v when m == p: Megatron-LM then runs every
    forward first); each chunk is 1/v of the rank's layers. Exact only for equal chunks:
    ``interleaved_peak_bytes`` counts chunk by chunk.
    """
    if schedule == "naive":
        return 1.0
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(pp - pp_rank, m))
    return min(interleaved_warmup(pp, m, pp_rank, vpp) + 1, m * vpp) / vpp


def interleaved_warmup(pp: int, m: int, pp_rank: int, vpp: int) -> int:
    """Chunk-forwards a rank runs before its first backward in Megatron-LM's interleaved 1F1B
    (``forward_backward_pipelining_with_interleaving``: all m*v when m == p, else
    (p - i - 1) * 2 + (v - 1) * p, capped at m*v)."""
    total = m * vpp
    if m == pp:
        return total
    return min((pp - pp_rank - 1) * 2 + (vpp - 1) * pp, total)


def interleaved_peak_bytes(pp: int, m: int, vpp: int, pp_rank: int, chunk_bytes: list[float],
                           chunk_transient: list[float]) -> tuple[float, float]:
    """(activation bytes, recompute transient bytes) at the memory peak of one rank under
    Megatron-LM's interleaved 1F1B, chunk by chunk.

    The rank's k-th forward runs chunk (k mod pv) div p and its k-th backward chunk
    v - 1 - (k mod pv) div p (Narayanan et al. 2021 Sec. 2.2.2; Megatron-LM
    ``get_model_chunk_id``): after f forwards and b backwards chunk c holds
        F_c(f) - B_c(b),  F_c(f) = p floor(f / pv) + clip(f mod pv - c p, 0, p),
                          B_c(b) = p floor(b / pv) + clip(b mod pv - (v - 1 - c) p, 0, p)
    microbatches. After W warm-up forwards the rank alternates forward, backward; the peak is
    at the start of a backward (it frees only at its end, and a full recompute adds
    ``chunk_transient`` of its chunk), with min(W + k + 1, m v) forwards and k backwards done."""
    period = pp * vpp
    total = m * vpp
    w = interleaved_warmup(pp, m, pp_rank, vpp)

    def done(n: int, offset: int) -> int:
        return pp * (n // period) + min(max(n % period - offset * pp, 0), pp)

    best = (-1.0, 0.0, 0.0)
    for k in range(total):
        f = min(w + k + 1, total)
        act = sum(chunk_bytes[c] * (done(f, c) - done(k, vpp - 1 - c)) for c in range(vpp))
        extra = chunk_transient[vpp - 1 - (k % period) // pp]
        if act + extra > best[0]:
            best = (act + extra, act, extra)
    return best[1], best[2]
