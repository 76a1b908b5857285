"""The software stack that runs a plan: a small set of documented physical parameters.

The same plan on the same GPUs runs at different speeds under Megatron-LM 2021, Megatron-Core,
Megatron-DeepSpeed, DeepSpeed ZeRO, FSDP1 or FSDP2, and for nameable reasons: which attention
kernel runs, how close its GEMMs come to the GPU's ceiling (library generation, fusions), what
communication overlaps what, how its pipeline sends activations, how much host time each op
costs, how its loss holds the logits, and how much memory its allocator and libraries keep.
A ``Stack`` states exactly those, one preset per stack (``STACK_PRESETS``); the plan key
``stack`` picks one (``auto``: the profile's ``default_stack``, ``torch`` for a profile without
one). Every preset value below cites where it comes from.

Two kinds of numbers: the software's facts (what it keeps, sends and overlaps: the same on
every GPU, read from the preset by the rules that see only the plan, ``plan_stack``), and the
numbers a stack reaches on one GPU (``PER_GPU``), which a profile may refine
(``device.stacks: {name: {field: value}}``, read and written by ``stacks_from_dict`` /
``stacks_to_dict``; any other key is an error), fitted to run logs by ``parsim calibrate
--runs``. How the numbers act on the costs is ``parsim.costs.stack``. SI units.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import SpecError


@dataclass(frozen=True)
class Stack:
    """Software-stack physics. Efficiencies are factors on the GPU profile's numbers."""

    name: str
    summary: str
    # --- kernels
    flash_attention: bool | None = None      # fused (flash) attention; None: as the model says
    gemm_efficiency: float = 1.0             # x the profile's GEMM ceiling (gemm.max_efficiency)
    attention_efficiency: float = 1.0        # x the profile's flash-attention efficiency
    attention_half_seq: float = 0.0          # flash kernel: sequence length of half its efficiency
    cudnn_attention: bool = False            # runs cuDNN's fused attention where the profile rates it (TE_ATTENTION)
    op_overhead_s: float = 0.0               # framework time per op beyond the profile's launch gap, s
    # --- communication
    grad_reduce_overlap: bool = True         # DP gradient reduction overlaps the last backward
    p2p_scatter_gather: bool = True          # pipeline sends 1/t of the activation per TP rank
    p2p_blocking: bool = False               # a pipeline send holds its sender until it is through (no p2p overlap)
    tp_bwd_overlap: bool = False             # backward TP collectives overlap the weight-gradient GEMM
    uneven_stages: bool = False              # its pipeline takes (virtual) stages of unequal layer counts
    zero_comm_efficiency: float = 1.0        # fraction of NCCL bandwidth its ZeRO collectives reach
    comm_compute_slowdown: float = 0.0       # compute s lost per s of collective it overlaps (NCCL on SMs)
    fsdp2_copies: bool = False               # ZeRO-2/3 copies each unit into / out of flat buffers (FSDP2)
    # --- memory
    zero3_gathered_layers: float = 2.0       # ZeRO-3: layers' full parameters alive at once (current + prefetched)
    zero3_max_live_params: float = 1e30      # ZeRO-3: cap on gathered parameters alive at once
    fp32_shards: bool = False                # ZeRO-3 shard kept in fp32 as the master weight (FSDP mixed precision)
    attention_mask_bytes: float = 1.0        # unfused attention: per (s x s) element of the causal mask a layer keeps
    attention_eager_passes: int = 2          # unfused attention: passes over the scores beside softmax (scale, mask)
    softmax_grad_in_place: bool = False      # unfused attention: softmax backward overwrites its incoming gradient
    eager_rmsnorm: bool = True               # RMSNorm in eager fp32 ops: keeps x and x*rstd in fp32 (fused: x)
    eager_swiglu: bool = True                # SwiGLU in eager ops: keeps silu(gate) too (fused: gate and up)
    rope_relayout: bool = True               # eager RoPE leaves q as (b, a, s, d): the attention output is copied
    eager_rope: bool = True                  # RoPE as a chain of eager ops (fused: one kernel; ops.EAGER_TRAFFIC)
    checkpoint_early_stop: bool = True       # full recompute stops at the layer's last saved tensor (non-reentrant)
    sp_saves_gathered: bool = False          # SP: a column-parallel GEMM keeps its all-gathered input (not the shard)
    autocast: bool = False                   # 16-bit runs: torch.autocast over fp32 parameters (not 16-bit ones)
    fp32_softmax: bool = False               # under autocast the unfused softmax and its dropout run in fp32 (CUDA)
    dropout_noise: bool = False              # dropout keeps its scaled noise in its input's dtype, not a 1-byte mask (CPU)
    flash_dropout: bool = True               # its fused attention applies dropout (False: SDPA's math path does, CPU)
    vocab_multiple: int = 128                # the vocabulary is padded to a multiple of this x tp
    loss_logits_bytes: float = 4.0           # per logit kept for the loss backward (torch: fp32 log-softmax)
    loss_grad_bytes: float = 8.0             # per logit alive beyond those in the loss backward (torch: 2 fp32 grads)
    tp_loss_grad_bytes: float | None = None  # ... with tp > 1 (None: loss_grad_bytes)
    loss_forward_bytes: float = 0.0          # fp32 per logit the loss forward holds beside the logits and those kept
    bf16_grad_copy_bytes: float = 0.0        # bf16 .grad kept beside the fp32 gradient buffer (ZeRO 0-1), per parameter
    autograd_grad_accumulation: bool = False  # ZeRO 0-1: microbatch gradients add into .grad in their own kernels
    optimizer_temporaries: float = 2.0       # optimizer step: fp32 copies of the tensor (shard) being stepped ...
    optimizer_carry: float = 1.0             # ... beside these of the one stepped before it (costs.footprint.step_window)
    zero1_whole_tensors: bool = True         # ZeRO-1 gives each tensor whole to one replica (not 1/dp of each)
    zero1_all_reduce: bool = False           # ZeRO-1 beside DDP: gradients all-reduced, not reduce-scattered
    memory_reserve_bytes: float | None = None  # outside the caching allocator (context, NCCL, cuBLAS), bytes
    fragmentation: float | None = None       # allocator reserved / allocated - 1 at the peak
    # (None, None: the profile's usable_memory_fraction stands)

    def with_values(self, values: dict[str, Any], where: str = "stack") -> "Stack":
        """This stack with some of its per-GPU numbers (``PER_GPU``) replaced: non-negative
        numbers; any other key is a SpecError naming it."""
        out = {}
        for key, v in values.items():
            if key not in PER_GPU:
                raise SpecError(f"{where}.{key}", v, f"unknown key; a stack's per-GPU numbers are {', '.join(PER_GPU)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise SpecError(f"{where}.{key}", v, "a non-negative number")
            out[key] = float(v)
        return replace(self, **out)

    def grad_copy_bytes(self, dtype: str) -> float:
        """Bytes per parameter of 16-bit gradients kept beside the gradients parsim's ``dtype``
        convention counts (``costs.footprint.stack_state_bytes``)."""
        return self.bf16_grad_copy_bytes if dtype == "bf16" else 0.0

    def per_gpu(self) -> dict[str, float]:
        """The per-GPU numbers that differ from this stack's preset, by name (a profile's
        ``device.stacks.<name>`` mapping)."""
        preset = get_stack(self.name)
        return {k: getattr(self, k) for k in sorted(PER_GPU) if getattr(self, k) != getattr(preset, k)}


# Numbers a stack reaches on one GPU: a profile may refine them, a run log fits them.
PER_GPU = ("gemm_efficiency", "attention_efficiency", "attention_half_seq", "op_overhead_s", "zero_comm_efficiency",
           "comm_compute_slowdown", "memory_reserve_bytes", "fragmentation")
assert set(PER_GPU) <= {f.name for f in fields(Stack)}

# Megatron's vocab-parallel cross entropy runs on ``output.float()``: it keeps the fp32
# softmax (4 bytes per logit) and writes the gradient into it in place; the half-precision
# copy of that gradient for the output GEMM is the only extra (2 bytes)
# (megatron/core/tensor_parallel/cross_entropy.py).
MEGATRON_LOSS = dict(loss_logits_bytes=4.0, loss_grad_bytes=2.0)
# Unfused attention as eager PyTorch runs it (the executor, ``executor/model.py``:
# ``masked_fill`` with a bool (s, s) causal mask, then ``torch.softmax``) keeps the mask per layer
# (1 byte per element) and allocates a new gradient at each of softmax's and masked_fill's
# backwards. Megatron's fused scale-mask-softmax kernel (``scaled_upper_triang_masked_softmax``,
# megatron/core/fusions/fused_softmax.py) builds the causal mask inside the kernel (nothing kept)
# and its backward writes the input gradient over the incoming one (the CUDA extension returns
# ``output_grads`` modified in place). Eager PyTorch also runs the 1/sqrt(d) scale and the
# masked_fill as kernels of their own, each a pass over the (b, a, s, s) scores forward and one
# over their gradient backward (``costs.ops``: ``attn_scale``, ``attn_mask``); the fused kernel
# does both inside the softmax's pass.
FUSED_SOFTMAX = dict(attention_mask_bytes=0.0, softmax_grad_in_place=True, attention_eager_passes=0)
# Llama-style layers in eager PyTorch (the executor, ``executor/model.py``; torchtitan's
# ``FeedForward``: ``w2(F.silu(w1(x)) * w3(x))``) keep more than fused kernels do: the product's
# backward needs silu(gate) beside gate (for silu's backward) and up; an RMSNorm written as
# ``xf = x.float(); y = xf * rsqrt(mean(xf^2) + eps); (y * w).to(x.dtype)`` keeps xf and y in
# fp32; RoPE by ``torch.stack`` of the rotated halves returns q contiguous as (b, a, s, d), so
# the (b, s, a*d) input of the output projection is a copy, and each layer keeps its fp32 cos
# and sin tables. Megatron-Core / Transformer Engine fuse all three (``bias_swiglu_impl``
# recomputes silu in backward; TE's RMSNorm keeps x and rstd; fused RoPE in (s, b, a, d)). The
# eager chains also move more bytes, each op a kernel over whole tensors (``costs.ops.EAGER_TRAFFIC``).
FUSED_LLAMA = dict(eager_rmsnorm=False, eager_swiglu=False, rope_relayout=False, eager_rope=False)
# Full recomputation: torch's non-reentrant ``torch.utils.checkpoint`` (the executor; torch's
# ``checkpoint_wrapper``, which FSDP1 / llm-foundry and torchtitan wrap blocks in) stops
# re-running the forward once the last tensor the region saved is back
# (``set_checkpoint_early_stop``, on by default since torch 2.1): the MLP-down GEMM and what
# follows it are not re-run. Megatron's ``tensor_parallel.checkpoint`` and DeepSpeed's
# activation checkpointing are reentrant (``torch.autograd.Function``): the whole forward again.
REENTRANT_CHECKPOINT = dict(checkpoint_early_stop=False)
# FlashAttention-2 fwd+bwd (causal, head dim 128, A100) reaches about half its 16k rate near
# s = 1k: 512 -> 16k rises ~100 -> ~190 TFLOP/s (Dao 2023, arXiv:2307.08691, Fig. 4); flash
# kernels after it (FA3, cuDNN) keep the shape.
FLASH = dict(flash_attention=True, attention_half_seq=1024.0)
# Transformer Engine picks its attention kernel by GPU: on Hopper and later it prefers cuDNN's
# fused attention (FusedAttention, backend F16_arbitrary_seqlen) to FlashAttention-2, "for
# performance reasons" (transformer_engine/pytorch/attention.py, ``get_attention_backend``, TE
# 1.x; read from its code, not run here); on Ampere it runs FlashAttention-2. A profile states
# the cuDNN kernel's rate where TE prefers it (``device.cudnn_attention_efficiency``: the Hopper
# profiles); elsewhere the flash rate stands. torch's SDPA (torchtitan, the executor) tries its
# flash kernel first and cuDNN's last (``torch._C._get_sdp_priority_order()``, torch 2.13).
TE_ATTENTION = dict(cudnn_attention=True)
# Pipeline sends that hold the sender: Megatron-LM's non-interleaved and (before
# --overlap-p2p-communication) interleaved 1F1B exchange activations and gradients with
# ``torch.distributed.batch_isend_irecv`` and wait for the requests before the next pass
# (megatron/core/pipeline_parallel/p2p_communication.py, ``_communicate``: ``req.wait()``), and
# DeepSpeed's pipeline engine runs each SendActivation / SendGrad instruction as a blocking
# ``dist.send`` / broadcast (deepspeed/runtime/pipe/engine.py, p2p.py): the stage computes
# nothing while its send is on the wire. Priced for the GPipe, 1F1B and interleaved schedules
# (a naive pipeline waits for every transfer anyway); the zero-bubble schedules' sends overlap.
BLOCKING_P2P = dict(p2p_blocking=True)
# Host time per op a training framework adds where the GPU waits for it: ~20 us per eager
# PyTorch op (dispatcher + Python module call + launch; PyTorch "Performance Tuning Guide",
# CPU overhead): the prior of every GPU stack, refined per GPU by the run logs.
HOST = dict(op_overhead_s=2e-5)

# The optimizer step's temporaries, per parameter tensor it steps (fp32: the master copy).
# torch 2.13 AdamW, torch/optim/adam.py: the single-tensor loop (``_single_tensor_adam``, the
# default off CUDA) computes ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)``
# per parameter: sqrt's result and the quotient exist together, 2 tensors of that parameter's
# size, while the previous parameter's ``denom`` is still bound to the name (freed by the
# assignment), so a tensor and the one stepped before it set the peak (``costs.footprint.
# step_window``; measured on the executor's memory tracker, 2026-11-30); the foreach path
# (``_multi_tensor_adam``, the default on CUDA) allocates ``exp_avg_sq_sqrt = _foreach_sqrt(...)``
# for a whole param group at once (the group's sum, not its largest: no preset here runs it); the
# fused kernel (``_fused_adamw_``) none. The executor (``executor/optimizer.py``) writes the
# single-tensor update out (the defaults) and, under ZeRO-1, gives whole tensors to their owner
# replica (``executor/zero.py``, as torch's ZeroRedundancyOptimizer): each replica steps its own
# whole tensors, in the model's order. Apex / Transformer Engine FusedAdam (Megatron-LM and Megatron-Core,
# megatron/core/optimizer/__init__.py) and DeepSpeed's FusedAdam (deepspeed/ops/adam/fused_adam.py)
# update in one multi-tensor kernel, and their ZeRO-1 (Megatron's distributed optimizer,
# DeepSpeed stage 1) partitions a flat buffer 1/dp per rank; torchtitan builds AdamW(fused=True)
# (its default ``optimizer.implementation``).
FUSED_ADAM = dict(optimizer_temporaries=0.0, optimizer_carry=0.0, zero1_whole_tensors=False)

# The executor's eager PyTorch (``executor/model.py``, ``tp_communications.py``, ``optimizer.py``):
# * sequence parallelism by an autograd function that returns the all-gathered sequence, which
#   ``nn.Linear``'s ``mm`` then saves whole (s b h); Megatron's column-parallel layer
#   (``LinearWithGradAccumulationAndAsyncCommunication``, megatron/core/tensor_parallel/layers.py)
#   saves the local shard and all-gathers it again in backward (Korthikanti et al. 2022 Sec.
#   4.2.2: the s b h / t of Table 2), as the other presets do;
# * bf16 / fp16 by ``torch.autocast`` over fp32 parameters (torch "Automatic Mixed Precision"
#   docs): fp32 parameters, gradients and Adam states (4 + 4 + 8 bytes, no separate master
#   copy), an fp32 residual stream, and each GEMM's 16-bit casts of its input and weight kept for
#   backward (``costs.saved.precision``). Megatron, DeepSpeed and FSDP keep 16-bit parameters
#   (FSDP: 16-bit gathered copies of fp32 shards, ``fp32_shards``) and 16-bit activations;
# * the vocabulary padded only to a multiple of tp (``tp_parallel.padded_rows``), where Megatron
#   pads to 128 x tp (``--make-vocab-size-divisible-by 128``), as the other presets are read.
# * the loss: ``F.cross_entropy`` on ``logits.float()`` (tp = 1), or with tp > 1 the executor's
#   vocabulary-parallel cross-entropy (``tp_communications._VocabParallelCrossEntropy``, Megatron's
#   algorithm in eager ops), whose backward clones the saved fp32 softmax (4 bytes a logit, where
#   F.cross_entropy's holds 8); both forwards hold an fp32 copy beside the logits while they
#   write the kept ones (the 16-bit logits' fp32 cast; the max-shifted logits). Measured on 2
#   gloo ranks (heldout-deep head, tp = 2): forward 8 / 6, backward 4 / 6 bytes a logit beyond the
#   kept softmax in fp32 / bf16 (``activations.logits_grad_bytes``, ``forward_working_bytes``).
#   Its ZeRO-1 is torch's ZeroRedundancyOptimizer beside DDP (``executor/zero.py`` ZeroOneAdamW):
#   the gradients are all-reduced as in plain DP, each owner steps its whole tensors and sends them
#   to the others (``zero1_all_reduce``, ``zero1_whole_tensors``); measured on 2 gloo ranks
#   (probe-gqa dp 2 mbs 2, 2026-11-30) the executor's traces hold 3 all-reduce buckets, no
#   reduce-scatter.
EAGER_TORCH = dict(sp_saves_gathered=True, autocast=True, vocab_multiple=1, tp_loss_grad_bytes=4.0,
                   loss_forward_bytes=4.0, zero1_all_reduce=True)

STACK_PRESETS: dict[str, Stack] = {s.name: s for s in (
    # parsim's reference executor (eager PyTorch, DDP-style bucketed all-reduce, FSDP2 for
    # ZeRO): the profile's numbers as they are: the stack of every calibrated CPU profile.
    # On a CPU (torch 2.13 ATen) dropout is no fused kernel: ``at::dropout`` runs ``_dropout_impl``,
    # noise = empty_like(x).bernoulli_(1 - p).div_(1 - p) and x * noise, whose node keeps the noise
    # in x's dtype (``native_dropout``'s 1-byte mask is taken only where ``is_fused_kernel_acceptable``:
    # CUDA, XPU, lazy); and SDPA's CPU flash kernel takes no dropout, so with dropout_p > 0 SDPA runs
    # its math path (``_scaled_dot_product_attention_math``), in fp32 for 16-bit inputs on a CPU.
    # Both read off the executor's saved tensors (tests/test_saved_tensors.py, dropout variants).
    Stack("torch", "plain PyTorch as parsim's executor runs it on a CPU (torch-cuda: on a GPU): the profile's "
          "numbers unchanged", **EAGER_TORCH,
          dropout_noise=True, flash_dropout=False),
    # Megatron-Core (Megatron-LM >= 0.5 with Transformer Engine): cuDNN / flash attention, the
    # distributed optimizer overlapping gradient reduce-scatter and parameter all-gather with
    # compute (--overlap-grad-reduce, --overlap-param-gather), Megatron's loss. Its interleaved
    # schedule overlaps the pipeline sends (--overlap-p2p-communication, on by default), which
    # is what the runs in the data ran (Llama 3); its non-interleaved 1F1B still waits for
    # them (``BLOCKING_P2P``), which parsim does not price for this stack (no run checks it).
    # Its pipeline splits layers unevenly (--decoder-first-pipeline-num-layers /
    # --decoder-last-pipeline-num-layers; Llama 3 ran 126 layers on 16 stages, one fewer on the
    # first and the last, interleaved: Dubey et al. 2024 Sec. 3.3.2), where Megatron-LM 2021-22
    # asserts num_layers % (pp x vpp) == 0 (megatron/arguments.py).
    Stack("megatron-core", "Megatron-Core + Transformer Engine: flash attention (cuDNN on Hopper), overlapped DP communication",
          tp_bwd_overlap=True, uneven_stages=True, **FLASH, **TE_ATTENTION, **MEGATRON_LOSS, **HOST,
          **FUSED_SOFTMAX, **FUSED_LLAMA, **REENTRANT_CHECKPOINT, **FUSED_ADAM),
    # Megatron-LM 2021-22 (Narayanan et al. 2021; Korthikanti et al. 2022): unfused attention
    # (batched GEMMs around a fused scale-mask-softmax kernel), the DP all-reduce after the
    # pipeline flush (--DDP-impl local), scatter/gather pipeline sends (Sec. 4.1).
    Stack("megatron-lm", "Megatron-LM 2022 (v3): unfused attention, DP all-reduce after the flush, async TP backward",
          flash_attention=False, grad_reduce_overlap=False, tp_bwd_overlap=True, **BLOCKING_P2P, **MEGATRON_LOSS,
          **HOST, **FUSED_SOFTMAX, **FUSED_LLAMA, **REENTRANT_CHECKPOINT, **FUSED_ADAM),
    # Megatron-LM as the SC'21 paper ran it (v2, spring 2021): the same kernels, but every TP
    # collective synchronous (the asynchronous input-gradient all-reduce came with v2.6 / v3).
    Stack("megatron-lm-2021", "Megatron-LM 2021 (v2, Narayanan et al.): as megatron-lm with synchronous TP collectives",
          flash_attention=False, grad_reduce_overlap=False, **BLOCKING_P2P, **MEGATRON_LOSS, **HOST,
          **FUSED_SOFTMAX, **FUSED_LLAMA, **REENTRANT_CHECKPOINT, **FUSED_ADAM),
    # Megatron-DeepSpeed (BigScience fork, 2022): Megatron's layers under DeepSpeed's pipeline
    # engine, which sends the whole activation from every TP rank (no scatter/gather,
    # deepspeed/runtime/pipe/engine.py) and reduces gradients after the flush. In bf16 (ZeRO
    # 0-1) DeepSpeed's BF16 optimizer accumulates gradients in a flat fp32 buffer and keeps the
    # model's bf16 .grad beside it (deepspeed/runtime/bf16_optimizer.py; the BLOOM chronicles,
    # 02-28: "BF16 optimizer with fp32 grad accumulation (more memory, slower)"): 2 bytes more.
    # Under DeepSpeed's engine the parameters have no Megatron ``main_grad``, so Megatron's
    # fused weight-gradient accumulation cannot run: gradients add up in separate kernels
    # (``costs.ops.grad_accumulation_bytes``).
    Stack("megatron-deepspeed", "Megatron-DeepSpeed (BigScience): Megatron layers, DeepSpeed pipeline engine",
          flash_attention=False, grad_reduce_overlap=False, p2p_scatter_gather=False, bf16_grad_copy_bytes=2.0,
          autograd_grad_accumulation=True, **BLOCKING_P2P, **MEGATRON_LOSS, **HOST, **FUSED_SOFTMAX, **FUSED_LLAMA,
          **REENTRANT_CHECKPOINT, **FUSED_ADAM),
    # DeepSpeed ZeRO on Megatron's GPT layers (the ZeRO-3 comparison of Narayanan et al. 2021
    # Table 2): unfused attention; the parameter coordinator prefetches the next layer.
    # Its ZeRO-3 gathers tensor by tensor, prefetching up to stage3_prefetch_bucket_size (5e7)
    # parameters and keeping at most stage3_max_live_parameters (1e9) alive (DeepSpeed config
    # docs): about one layer of a 100B+ model at a time.
    Stack("deepspeed", "DeepSpeed ZeRO (stage 1-3) on Megatron GPT layers: unfused attention",
          flash_attention=False, zero3_gathered_layers=1.0, zero3_max_live_params=1e9, autograd_grad_accumulation=True,
          **BLOCKING_P2P, **MEGATRON_LOSS, **HOST, **FUSED_SOFTMAX, **FUSED_LLAMA, **REENTRANT_CHECKPOINT,
          **FUSED_ADAM),
    # FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel) as MosaicML llm-foundry /
    # Composer run it: flash attention, FULL_SHARD with backward prefetch, bf16 compute with
    # fp32 reduce-scatter, flash-attn's fused cross entropy (bf16 logits kept, gradient in place).
    # llm-foundry's MPT configs run the Triton flash-attention kernel (attn_impl: triton), which
    # FlashAttention-2 outruns 1.3-2.5x on A100 (Dao 2023, Sec. 4.1, Fig. 4): ~0.55 of its rate.
    # Its configs step Composer's DecoupledAdamW (``optimizer: decoupled_adamw``), a per-parameter
    # loop with torch's single-tensor denominator (composer/optim/decoupled_weight_decay.py; read
    # from its code, not measured here): the default temporaries, on FSDP's 1/dp flat shards.
    Stack("fsdp1", "PyTorch FSDP1 (llm-foundry / Composer): flash attention, prefetched all-gathers",
          attention_efficiency=0.55, loss_logits_bytes=2.0, loss_grad_bytes=0.0, fp32_shards=True, rope_relayout=False,
          zero1_whole_tensors=False, **FLASH, **HOST),
    # Both run Llama-style layers as eager modules (HF's LlamaMLP / LlamaRMSNorm under
    # llm-foundry; torchtitan's FeedForward, whose RMSNorm is torch's nn.RMSNorm): silu(gate) is
    # kept; their RoPE rotates in the (b, s, a, d) layout, so no copy (read from their code, not
    # measured here). Their RoPE (HF rotate_half, torchtitan's complex product) and SwiGLU run as
    # eager chains; HF's RMSNorm too, while ``nn.RMSNorm`` calls ``F.rms_norm``, which on CUDA
    # dispatches to one fused kernel (``aten::_fused_rms_norm``, torch 2.13) -- its bytes as a fused
    # norm's (studies/public_record/eager_kernels.py counts each chain).
    # FSDP2 (torchtitan): per-parameter sharding (DTensor), SDPA flash attention, torch's
    # cross entropy on fp32 logits. FSDP1 and FSDP2 with a bf16 MixedPrecisionPolicy keep the
    # shard in fp32 (it is the optimizer's master weight) and gather bf16 copies (PyTorch FSDP
    # docs, "Mixed precision"): 4 + 4 + 8 bytes per parameter / dp, not 2 + 4 + 12.
    # Around every unit's collective FSDP2 copies the unit into and out of one flat buffer
    # (``costs.fsdp2.fsdp_unit_time``: torch 2.13 _fully_shard/_fsdp_collectives.py), which
    # FSDP1's FlatParameter, allocated flat once, does not.
    Stack("fsdp2", "PyTorch FSDP2 (torchtitan): flash attention (SDPA), prefetched all-gathers",
          fp32_shards=True, fsdp2_copies=True, eager_rmsnorm=False, rope_relayout=False, **FLASH, **HOST, **FUSED_ADAM),
    # The same executor on a CUDA device: CUDA's autocast runs softmax in fp32 (torch's "Automatic
    # Mixed Precision" docs, "CUDA Ops that can autocast to float32": softmax; the CPU's list has
    # no softmax), so an unfused attention's scores are cast to fp32, softmax and its dropout run
    # and keep fp32, and the probabilities are cast back to 16 bits for the PV product (kernels
    # of an H200 gpt3-350m layer, studies/gpu_check/h200_overlap/layer_host.json: the two casts
    # and the fp32 softmax / dropout; peak memory +2 bytes per score element, as measured).
    # The stack of every CUDA calibration (``calibration.profile``).
    Stack("torch-cuda", "parsim's executor on a CUDA device: as torch, with softmax in fp32 under autocast",
          **EAGER_TORCH, fp32_softmax=True),
)}
STACKS = tuple(STACK_PRESETS)
# The plan's default: the profile's ``default_stack`` (the shipped GPU profiles: megatron-core;
# a profile without one: torch, so calibrated CPU profiles keep their meaning).
AUTO = "auto"
PROFILE_DEFAULT_STACK = "torch"


def plan_stacks() -> tuple[str, ...]:
    """Values the plan key ``stack`` accepts."""
    return (AUTO, *STACKS)


def get_stack(name: str, where: str = "stack") -> Stack:
    """The preset of a stack (SpecError naming ``where`` for an unknown name)."""
    try:
        return STACK_PRESETS[name]
    except (KeyError, TypeError):
        raise SpecError(where, name, f"one of {', '.join(STACKS)}") from None


def plan_stack(plan) -> Stack:
    """The software facts of the stack that runs ``plan`` (its preset): what the rules that see
    only the plan read (loss bytes, pipeline sends, ZeRO-3 shards and gathered layers). A plan
    whose stack is still ``auto`` has not met an engine, which names it (``costs.stack``):
    read as ``torch``, the reference executor's."""
    return get_stack(PROFILE_DEFAULT_STACK if plan.stack == AUTO else plan.stack)


def stacks_from_dict(raw: Any, where: str = "profile.device.stacks") -> dict[str, Stack]:
    """A profile's per-GPU stack numbers, ``{stack name: {field: value}}``, over the presets."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SpecError(where, raw, "a mapping of stack name -> {per-GPU number: value}")
    out = {}
    for name, values in raw.items():
        preset = get_stack(name, f"{where}.{name}")
        if not isinstance(values, dict):
            raise SpecError(f"{where}.{name}", values, "a mapping of per-GPU number -> value")
        out[preset.name] = preset.with_values(values, f"{where}.{name}")
    return out


def stacks_to_dict(stacks: dict[str, Stack]) -> dict[str, dict[str, float]]:
    """The ``device.stacks`` mapping a profile YAML holds (``stacks_from_dict``'s inverse for
    numbers that differ from the presets)."""
    return {name: stack.per_gpu() for name, stack in stacks.items()}
