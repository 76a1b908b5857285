"""The ops of one transformer layer (and the embedding / output head) on one device.

Shapes follow Megatron-LM tensor parallelism (Shoeybi et al. 2019): QKV and MLP-up are
column-parallel (output split t ways), attention-out and MLP-down are row-parallel (input
split t ways); attention heads split t ways. With sequence parallelism (Korthikanti et al.
2022, Sec. 4.2.2) norms, dropouts and residuals run on s/t tokens.

FLOPs are floating-point operations (a multiply-add = 2 FLOP); bytes are memory traffic of
memory-bound ops (read + write), both per device per microbatch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from parsim.specs import ModelSpec, Plan, plan_stack
from parsim.specs.stack import Stack

from .states import plan_state_bytes
from .zero import zero_shard

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Op:
    """One op of a layer. ``shape`` is the forward GEMM (m, n, k): an (m x k) @ (k x n)."""

    name: str
    kind: str                      # "gemm" | "attention" | "membound"
    fwd_flops: float               # FLOP
    bwd_input_flops: float         # FLOP, gradient w.r.t. inputs
    bwd_weight_flops: float        # FLOP, gradient w.r.t. weights
    fwd_bytes: float = 0.0         # bytes moved (membound ops)
    bwd_bytes: float = 0.0
    shape: tuple[int, int, int] | None = None
    batch: int = 1                 # batched GEMMs (attention): number of (m, n, k) products
    attention_core: bool = False   # re-run by selective recompute (Korthikanti 2022 Sec. 5)
    grad_accumulation: bool = False  # adds this microbatch's weight gradients into .grad (bwd_weight)
    own_kernels: bool = False      # grad_accumulation the stack runs as separate kernels on any device
    impl: str = ""                 # the kernel that runs it where the name does not say (norms: layernorm / rmsnorm)
    traffic: tuple[float, float] = (1.0, 1.0)  # bytes the stack's kernels move, x fwd / bwd bytes (``EAGER_TRAFFIC``)
    in_composition: bool = False   # no calibration times it alone: its fitted composition terms hold it
    dtype: str = ""                # the dtype it runs in where not the plan's (SDPA's math path on a CPU: fp32)

    @property
    def bwd_flops(self) -> float:
        return self.bwd_input_flops + self.bwd_weight_flops


def _gemm(name: str, m: int, n: int, k: int, batch: int = 1, has_weight: bool = True, core: bool = False) -> Op:
    # Forward (m x k)(k x n): 2mnk FLOP. Backward: dX = dY W^T (2mnk) and dW = X^T dY (2mnk)
    # (Narayanan et al. 2021 Sec. 5.1: backward = 2x forward). A product of two activations
    # (Q K^T, P V) has no weight, but both operands need their gradient: still 2x forward,
    # all of it input-gradient work.
    f = 2.0 * m * n * k * batch
    if has_weight:
        return Op(name, "gemm", f, f, f, shape=(m, n, k), batch=batch, attention_core=core)
    return Op(name, "gemm", f, 2.0 * f, 0.0, shape=(m, n, k), batch=batch, attention_core=core)


# The GEMM each pass of a (m x k)(k x n) product executes: its form and its (m, n, k) as run.
# dX = dY W^T is (m x n)(n x k); dW = X^T dY is (k x m)(m x n). Priced by ``timing._op_time``,
# measured under these keys by ``calibration`` (shapes.gemm_points, grid.head_points).
GEMM_FORMS = {"fwd": "linear", "bwd_input": "grad_input", "bwd_weight": "grad_weight"}


def executed_gemm(shape: tuple[int, int, int], form: str) -> tuple[int, int, int]:
    """(m, n, k) of the GEMM ``form`` (linear, grad_input, grad_weight) runs for the forward
    product ``shape`` = (m, n, k)."""
    m, n, k = shape
    return {"linear": (m, n, k), "grad_input": (m, k, n), "grad_weight": (k, n, m)}[form]


# Memory-bound ops a stack runs as chains of eager PyTorch ops instead of one fused kernel
# (``Stack.eager_rmsnorm`` / ``eager_swiglu`` / ``eager_rope``): the bytes the chain's kernels
# read and write, forward and backward, as multiples of the fused kernel's (``_membound``'s
# bytes), 16-bit activations, counted aten op by aten op under a TorchDispatchMode
# (studies/public_record/eager_kernels.py and .txt): HF's LlamaRMSNorm (fp32 upcast, pow, mean,
# rsqrt, two multiplies, the cast back) 36 / 96 B per element against 4 / 6; silu(gate) * up
# 10 / 18 against 6 / 9; RoPE as torchtitan's complex product and HF's rotate_half, 21 B per
# element of q and k forward, 24 and 29 backward, against 4 / 4. Dimensionless. The op keeps one
# launch gap: the chain's other launches queue while its streaming kernels run.
EAGER_TRAFFIC = {"rmsnorm": (9.0, 16.0), "swiglu": (1.67, 2.0), "rope": (5.33, 6.67)}


def _membound(name: str, elements: float, act_bytes: int, reads: float = 1.0, writes: float = 1.0,
              core: bool = False, impl: str = "", bwd_factor: float = 1.5, eager: str = "") -> Op:
    # Elementwise: read `reads` tensors and write `writes` tensors of `elements` each;
    # backward reads the output grad and the saved input and writes the input grad (~1.5x;
    # ``bwd_factor`` 1 where it only reads and writes the gradient). ``eager``: the stack runs
    # it as the eager chain of that name (``EAGER_TRAFFIC``).
    fwd = elements * act_bytes * (reads + writes)
    return Op(name, "membound", 0.0, 0.0, 0.0, fwd_bytes=fwd, bwd_bytes=bwd_factor * fwd, attention_core=core,
              impl=impl, traffic=EAGER_TRAFFIC.get(eager, (1.0, 1.0)))


def _norm(name: str, elements: float, act_bytes: int, model: ModelSpec, stack: Stack) -> Op:
    eager = model.norm == "rmsnorm" and stack.eager_rmsnorm
    return _membound(name, elements, act_bytes, impl=model.norm, eager="rmsnorm" if eager else "")


def layer_ops(model: ModelSpec, plan: Plan) -> list[Op]:
    """Ops of one transformer layer for one microbatch on one device (TP/SP applied)."""
    t = plan.tp
    e = DTYPE_BYTES[plan.dtype]
    b, s, h = plan.mbs, model.seq_len, model.hidden
    tokens = b * s
    tok_sp = tokens // t if plan.sp else tokens          # tokens seen by norms/residuals
    heads = model.heads // t
    d = model.head_dim
    kv = model.kv_hidden // t
    f = model.ffn_hidden // t
    stack = plan_stack(plan)
    prec = _precision(plan)
    r = prec.res                                         # the residual stream's (fp32 under autocast)
    ops = [_norm("input_norm", tok_sp * h, r, model, stack), _gemm("qkv", tokens, h // t + 2 * kv, h)]
    if model.position == "rope":
        # rotary embedding of q and k (Su et al. 2021): read and written once by a fused kernel
        # (Megatron-Core / TE ``apply_rotary_pos_emb`` fused), forward and backward (the
        # backward rotates the gradient back); eager chains move ``EAGER_TRAFFIC`` x that; in
        # fp32 under autocast (``saved.Precision.rope``)
        ops.append(replace(_membound("rope", tokens * (h // t + kv), prec.rope, bwd_factor=1.0,
                                     eager="rope" if stack.eager_rope else ""), in_composition=True))
    path = attention_path(model, plan)
    if path == "flash":
        # FlashAttention (Dao et al. 2022): scores + softmax + PV fused; forward 4*b*s^2*h/t FLOP,
        # backward 2.5x forward (it recomputes the scores: Dao 2022 Sec. 3.1).
        fwd = 4.0 * b * heads * s * s * d
        ops.append(Op("flash_attention", "attention", fwd, 2.5 * fwd, 0.0, shape=(s, s, d),
                      batch=b * heads, attention_core=True))
    else:
        # SDPA's math path on a CPU runs 16-bit inputs in fp32 throughout, its products too
        core_dtype = "fp32" if path == "math" else ""
        ops.append(replace(_gemm("attn_scores", s, s, d, batch=b * heads, has_weight=False, core=True),
                           dtype=core_dtype))
        # eager PyTorch scales and masks the scores in kernels of their own (``Stack``'s
        # attention_eager_passes; Megatron's fused scale-mask-softmax: none): each reads and writes
        # the scores forward, and its backward reads and writes their gradient (the same bytes)
        # (SDPA's math path scales q and k instead and adds its causal mask in place: one pass)
        passes = ("attn_mask",) if path == "math" else ("attn_scale", "attn_mask")[:stack.attention_eager_passes]
        for name in passes:
            ops.append(_membound(name, b * heads * s * s, e, core=True, bwd_factor=1.0))
        # under CUDA's autocast (``Stack.fp32_softmax``) softmax and its dropout run in fp32 between
        # two casts of the scores: 16 bits to fp32 before softmax, fp32 to 16 bits for the PV
        # product; backward the gradient's two, back and forth. SDPA's math path casts q, k, v to
        # fp32 and its output back (k and v after GQA's repeat), and their gradients back and forth
        sm = prec.softmax if path == "explicit" else CORE_MATH_BYTES
        if path == "math":
            up_down = b * s * (3 * h // t + h // t)
            ops += [replace(c, attention_core=True) for c in _cast_op("attention_math_casts", up_down, up_down, plan)]
        ops.append(_membound("softmax", b * heads * s * s, sm, core=True))
        if model.dropout:
            ops.append(_membound("attn_dropout", b * heads * s * s, sm, core=True))
        if sm > e and path == "explicit":
            ops += [replace(c, attention_core=True)
                    for c in _cast_op("softmax_casts", 2 * b * heads * s * s, 2 * b * heads * s * s, plan)]
        ops.append(replace(_gemm("attn_values", s, d, s, batch=b * heads, has_weight=False, core=True),
                           dtype=core_dtype))
    ops.append(_gemm("attn_out", tokens, h, h // t))
    from .saved import residual_dropout_input_bytes   # saved imports this module
    resid_in = residual_dropout_input_bytes(model, plan)
    ops += _own_dropout("attn_residual_dropout", model, plan, tok_sp * h, resid_in)
    ops.append(_membound("attn_residual", tok_sp * h, r, reads=2.0))
    ops.append(_norm("post_attn_norm", tok_sp * h, r, model, stack))
    if model.activation == "swiglu":
        ops.append(_gemm("mlp_up_gate", tokens, 2 * f, h))
        ops.append(_membound("swiglu", tokens * f, e, reads=2.0, eager="swiglu" if stack.eager_swiglu else ""))
    else:
        ops.append(_gemm("mlp_up", tokens, f, h))
        ops.append(_membound("gelu", tokens * f, e))
    ops.append(_gemm("mlp_down", tokens, h, f))
    ops += _own_dropout("mlp_residual_dropout", model, plan, tok_sp * h, resid_in)
    ops.append(_membound("mlp_residual", tok_sp * h, r, reads=2.0))
    ops += _layer_casts(model, plan)
    from .params import layer_params   # params imports this module
    ops.append(_grad_accumulation("layer_grad_accumulate", layer_params(model, t), plan))
    return ops


def _own_dropout(name: str, model: ModelSpec, plan: Plan, elements: float, input_bytes: float) -> list[Op]:
    """A residual or embedding dropout over ``elements`` of ``input_bytes``, where the stack runs
    it as kernels of its own (``Stack.dropout_noise``: torch on a CPU draws Bernoulli noise,
    scales it and multiplies, ``calibration.shapes``' "dropout"); none without dropout, and none
    where it is fused into the add (Megatron's bias-dropout-add) or the embedding."""
    if not (model.dropout and plan_stack(plan).dropout_noise):
        return []
    return [_membound(name, elements, input_bytes)]


# SDPA's math path on a CPU computes 16-bit q, k, v in fp32 (torch 2.13,
# ``_scaled_dot_product_attention_math``): bytes per element of what it keeps
CORE_MATH_BYTES = 4


def attention_path(model: ModelSpec, plan: Plan) -> str:
    """How a layer's attention core runs: ``flash`` (one fused kernel keeping the log-sum-exp),
    ``explicit`` (the model's unfused products: scores, scale, mask, softmax, dropout, PV), or
    ``math``: a flash model with dropout under a stack whose fused kernel takes none
    (``Stack.flash_dropout``; torch on a CPU), where SDPA runs its math path: the unfused
    products on scaled copies of q and k (and a copy of v), in fp32 (``CORE_MATH_BYTES``), the
    causal mask added in place and not kept."""
    if not model.flash_attention:
        return "explicit"
    return "math" if model.dropout and not plan_stack(plan).flash_dropout else "flash"


def _precision(plan: Plan):
    """``saved.precision(plan)``: bytes per element of the residual stream (``res``), the rotary
    embedding (``rope``) and an unfused softmax (``softmax``), fp32 under ``torch.autocast``."""
    from .saved import precision      # saved imports this module
    return precision(plan)


def _cast_op(name: str, fwd_elements: float, bwd_elements: float, plan: Plan) -> list[Op]:
    """Autocast's dtype conversions as one memory-bound op (none without autocast): each element
    read in one dtype and written in the other, fp32 (4 bytes) and the plan's 16-bit type (e),
    forward and backward, priced at the device's streaming rate (``timing.membound_time``:
    no calibration times a cast alone)."""
    from .saved import FP32_BYTES, precision
    p = precision(plan)
    if not p.casts:
        return []
    per = FP32_BYTES + p.act
    return [Op(name, "membound", 0.0, 0.0, 0.0, fwd_bytes=per * fwd_elements, bwd_bytes=per * bwd_elements)]


def _layer_casts(model: ModelSpec, plan: Plan) -> list[Op]:
    """The conversions ``torch.autocast`` adds to one layer (counted with a TorchDispatchMode over
    the executor's layer, heldout-gpt / -llama / -deep, torch 2.13; aten ``_to_copy``):

    * forward: every GEMM weight to 16 bits (its cached copy, ``saved.weight_copies``) and the
      fp32 norm output to 16 bits once per GEMM reading it (q, k, v, up(, gate):
      ``saved.gemm_inputs``); attention-out and MLP-down read 16-bit outputs, no cast;
    * backward: each of those gradients back to fp32 (the weight's into ``.grad``, the input's
      into the residual stream), and the fp32 residual gradient to 16 bits for the two GEMMs
      whose outputs join the stream (attention-out, MLP-down), on the tokens a residual sees."""
    from .saved import gemm_input_rows, layer_weight_copy_bytes, precision, stream_readers
    p = precision(plan)
    if not p.casts:
        return []
    tokens = plan.mbs * model.seq_len
    tok_sp = tokens // plan.tp if plan.sp else tokens
    weights = layer_weight_copy_bytes(model, plan) / p.weight_copy
    inputs = len(stream_readers(model)) * gemm_input_rows(model, plan) * model.hidden
    return _cast_op("autocast_casts", weights + inputs, weights + inputs + 2 * tok_sp * model.hidden, plan)


def grad_accumulation_bytes(plan: Plan) -> tuple[float, bool]:
    """(bytes moved per parameter when one microbatch's weight gradients are accumulated,
    whether the software stack runs that as kernels of its own on every device).

    * Default: ``grad += new`` reads two and writes one gradient-sized tensor, 3 x
      gradient bytes (``states.plan_state_bytes``: fp32, fp16 training's fp16, fp32 again under
      autocast); Megatron-LM fuses it into the weight-gradient GEMM
      (``--gradient-accumulation-fusion``: the wgrad GEMM writes into ``main_grad`` with beta =
      1), so only devices whose profile says ``extra.grad_accumulation: unfused`` (the
      calibrated CPU profiles: autograd's AccumulateGrad) pay it.
    * DeepSpeed's engine (``Stack.autograd_grad_accumulation``, ZeRO 0-1): its parameters have
      no ``main_grad``, so autograd adds each microbatch's gradient into ``.grad`` (3 x
      gradient bytes). Under its BF16 optimizer (``Stack.bf16_grad_copy_bytes``, bf16) the
      16-bit ``.grad`` is cleared before every backward and ``update_hp_grads`` runs after it:
      ``hp_grad.add_(lp.grad.to(fp32))`` per tensor (deepspeed/runtime/bf16_optimizer.py,
      DeepSpeed 0.6; the pipeline engine calls it after every microbatch's backward,
      deepspeed/runtime/pipe/engine.py ``_exec_backward_pass``): the cast reads 2 and writes
      4 bytes, the add reads 4 + 4 and writes 4, so 18 bytes per parameter. ZeRO-2/3 reduce
      every microbatch's gradient as it is made and accumulate only their 1/dp shard: not
      counted (as on GPUs for every other stack)."""
    stack = plan_stack(plan)
    grad = plan_state_bytes(plan).grad
    if not stack.autograd_grad_accumulation or plan.zero >= 2:
        return 3.0 * grad, False
    if stack.grad_copy_bytes(plan.dtype) > 0:
        return 2.0 + 4.0 + 3.0 * 4.0, True
    return 3.0 * grad, True


def _grad_accumulation(name: str, params: float, plan: Plan) -> Op:
    """Accumulating a microbatch's weight gradients into the step's gradient buffer, bytes per
    parameter as ``grad_accumulation_bytes`` states them (ZeRO-2/3 accumulate the 1/dp
    reduce-scattered shard). ``timing.op_time`` charges it as a memory-bound op where the
    stack runs it in kernels of its own (``own_kernels``) or the device's profile says
    ``extra.grad_accumulation: unfused``."""
    shard = zero_shard(params, plan.dp, plan.zero, 2)
    per_param, own = grad_accumulation_bytes(plan)
    return Op(name, "membound", 0.0, 0.0, 0.0, bwd_bytes=per_param * shard, grad_accumulation=True, own_kernels=own)


def embedding_ops(model: ModelSpec, plan: Plan) -> list[Op]:
    """First stage: vocab-parallel embedding lookup (+ learned positions): memory bound.
    Forward reads and writes b*s*h rows; backward reads the output gradient (1.5x forward,
    as every elementwise op) and also writes the whole local table's gradient: the dense
    embedding backward (PyTorch ``embedding_dense_backward``, which Megatron-LM's
    VocabParallelEmbedding runs on its shard through ``F.embedding``) zero-fills a (V/t) x h
    gradient and adds the looked-up rows into it, so (V/t) * h * bytes more per microbatch,
    however few tokens there are."""
    e = _precision(plan).res                  # the table's dtype: fp32 under autocast
    tokens = plan.mbs * model.seq_len
    from .params import embedding_params
    table = padded_vocab(model, plan) // plan.tp * model.hidden
    lookup = _membound("embedding", tokens * model.hidden, e)
    # its dropout (Korthikanti 2022 Sec. 4.3)
    dropout = _own_dropout("embedding_dropout", model, plan, tokens * model.hidden / (plan.tp if plan.sp else 1), e)
    return [replace(lookup, bwd_bytes=embedding_bwd_bytes(lookup.fwd_bytes, table, e)), *dropout,
            _grad_accumulation("embedding_grad_accumulate", embedding_params(model, plan), plan),
            *_tied_gradient_sum(model, plan, table)]


def _tied_gradient_sum(model: ModelSpec, plan: Plan, table: float) -> list[Op]:
    """A tied word embedding on one stage (pp = 1) is one parameter that two ops use, the output
    GEMM and the lookup: one backward hands autograd two (V/t) x h gradients for it, which its
    input buffer adds out of place (``torch/csrc/autograd/input_buffer.cpp``) before the one
    ``AccumulateGrad``: 2 reads and 1 write of the table's gradient, 3 x its bytes. Charged as
    autograd's own gradient kernels are (``timing.op_time``: where the profile says
    ``grad_accumulation: unfused``; Megatron's fused wgrad writes the output GEMM's share into
    ``main_grad`` and hands autograd none). The whole table's, as FSDP2 sums the gathered
    parameter's gradients before it reduce-scatters them. Seen under torch.profiler in the
    executor's 12-layer h = 256 model with a 16,384-word tied table (2-vCPU Zen 3 VM, fp32,
    2026-12-02): one ``aten::add`` of [16384, 256] + [16384, 256] a backward (0.9 ms in a bare
    loop; ``studies/validation_cpu/heldout/README.md``, "A tied embedding's two gradients")."""
    if not (model.tied_embeddings and plan.pp == 1):
        return []
    return [Op("tied_gradient_sum", "membound", 0.0, 0.0, 0.0, bwd_bytes=3.0 * plan_state_bytes(plan).grad * table,
               grad_accumulation=True)]


def embedding_bwd_bytes(fwd_bytes: float, table_elements: float, act_bytes: int) -> float:
    """Backward bytes of the embedding lookup: 1.5x the forward's (``_membound``) plus the
    dense gradient of the local table written once (``embedding_ops``)."""
    return 1.5 * fwd_bytes + table_elements * act_bytes


def head_ops(model: ModelSpec, plan: Plan) -> list[Op]:
    """Last stage: final norm, vocab-parallel logits GEMM (2*b*s*h*V/t FLOP, Narayanan 2021
    Eq. 3's last term), and softmax cross-entropy over the local vocab shard, on as many bytes
    per logit as the stack's loss keeps (fp32: 4; a fused bf16 loss: 2; ``Stack.loss_logits_bytes``).
    Under autocast (``_cast_op``) the output weight and the fp32 norm output go to 16 bits and the
    16-bit logits to fp32 for the loss, and each gradient back (counted as ``_layer_casts``)."""
    e = _precision(plan).res                  # the final norm's input: the residual stream
    t = plan.tp
    tokens = plan.mbs * model.seq_len
    tok_sp = tokens // t if plan.sp else tokens
    vocab_shard = padded_vocab(model, plan) // t
    stack = plan_stack(plan)
    casts = (vocab_shard + tokens) * model.hidden + tokens * vocab_shard     # weight, input, logits
    return [
        _norm("final_norm", tok_sp * model.hidden, e, model, stack),
        _gemm("logits", tokens, vocab_shard, model.hidden),
        _membound("cross_entropy", tokens * vocab_shard, stack.loss_logits_bytes),
        *_cast_op("head_casts", casts, casts, plan),
        _grad_accumulation("head_grad_accumulate", _head_params(model, plan), plan),
    ]


def _head_params(model: ModelSpec, plan: Plan) -> float:
    from .params import head_params
    return head_params(model, plan)


def padded_vocab(model: ModelSpec, plan: Plan) -> int:
    """Vocab padded to a multiple of 128 * tp (Megatron-LM ``--make-vocab-size-divisible-by``;
    the stack's ``vocab_multiple``: the executor pads to a multiple of tp only)."""
    unit = plan_stack(plan).vocab_multiple * plan.tp
    return -(-model.vocab // unit) * unit
