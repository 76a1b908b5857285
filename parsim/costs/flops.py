"""Model FLOPs per step (for MFU) and hardware FLOPs (for HFU).

Narayanan et al. 2021 (arXiv:2104.04473) Eq. 3 for GPT shapes:
    F = 72 B s L h^2 (1 + s/(6h) + V/(12 h L))         without recomputation
    F = 96 B s L h^2 (1 + s/(6h) + V/(16 h L))         with full recomputation
(B = global batch in sequences). We count the same thing op by op, so GQA and SwiGLU
models get their own exact counts: forward matmul FLOPs x 3 (forward + 2x backward),
+1 forward of the layers for full recompute (the logits GEMM is not recomputed).
"""
from __future__ import annotations

from functools import lru_cache

from parsim.specs import ModelSpec, Plan

from .ops import head_ops, layer_ops
from .recompute import recomputed_ops


def _fwd_matmul_flops_per_sequence(model: ModelSpec) -> tuple[float, float, float]:
    """(layer matmul FLOP, of which attention-core FLOP, logits FLOP) per sequence, tp=1.

    Uses the unpadded vocabulary, as Eq. 3 does."""
    plan = Plan(mbs=1, dtype="bf16")
    layer = sum(op.fwd_flops for op in layer_ops(model, plan) if op.kind in ("gemm", "attention"))
    core = sum(op.fwd_flops for op in recomputed_ops(layer_ops(model, plan), "selective") if op.kind != "membound")
    logits = 2.0 * model.seq_len * model.hidden * model.vocab
    return layer, core, logits


def model_flops_per_step(model: ModelSpec, gbs: int) -> float:
    """Model FLOPs of one training step (no recompute counted): the MFU numerator (PaLM, App. B)."""
    layer, _, logits = _fwd_matmul_flops_per_sequence(model)
    return 3.0 * gbs * (model.layers * layer + logits)


def hardware_flops_per_step(model: ModelSpec, plan: Plan) -> float:
    """FLOPs actually executed, including recomputation: the HFU numerator."""
    layer, core, logits = _fwd_matmul_flops_per_sequence(model)
    recompute = {"none": 0.0, "full": layer, "selective": core}.get(plan.recompute, layer)
    if plan.recompute == "stage-aware" and plan.recompute_layers is not None:
        frac = sum(plan.recompute_layers) / model.layers
        recompute = frac * layer
    return plan.gbs * (model.layers * (3.0 * layer + recompute) + 3.0 * logits)


def eq3_flops(model: ModelSpec, gbs: int, full_recompute: bool = False) -> float:
    """Narayanan et al. 2021 Eq. 3 literally (GPT shapes), in FLOP per step."""
    B, s, L, h, V = gbs, model.seq_len, model.layers, model.hidden, model.vocab
    if full_recompute:
        return 96.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * h * L))
    return 72.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))


# torch's CPU flash attention (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp, torch 2.1-2.13,
# forward and backward alike): query blocks of 32 rows below a sequence of 192, 64 below 768, 256
# from there on; key blocks of 512.
CPU_FLASH_KEY_BLOCK = 512


def cpu_flash_query_block(seq: int) -> int:
    """Rows of a query block of torch's CPU flash attention at sequence length ``seq``."""
    return 32 if seq < 192 else 64 if seq < 768 else 256


def cpu_flash_query_blocks(seq: float) -> int:
    """Query blocks per (batch, head) of torch's CPU flash attention at sequence length ``seq``
    (``cpu_flash_query_block`` rows each, the last one short): the kernel's loop count per head,
    which a CPU calibration's attention surface may price a fixed time each
    (``RooflineFit.per_block``)."""
    s = max(int(round(seq)), 1)
    return -(-s // cpu_flash_query_block(s))


@lru_cache(maxsize=1024)
def cpu_flash_causal_fraction(seq: float) -> float:
    """Score entries torch's CPU flash kernel computes for causal attention over the s^2 counted
    (dimensionless, in (1/2, 1]). A query block [m, m + q) walks the key blocks up to its last row,
    min(s, m + q) keys, and each key block whole (masked where it crosses the diagonal, not
    skipped): min(s, ceil((m + q) / 512) x 512) keys. So nothing is skipped up to s = 512 and
    about a quarter at s = 1024. Measured (2-core AMD EPYC VM, 8 heads x 64, fp32, 2026-11-29),
    causal over non-causal time, forward: 1.01-1.03 from s = 32 to 512, 0.83 / 0.79 / 0.76 at
    640 / 768 / 1024 (this count: 0.84 / 0.78 / 0.75); backward 1.04-1.08 up to 512, 0.84 /
    0.79 / 0.75 past it."""
    s = max(int(round(seq)), 1)
    q, kv = cpu_flash_query_block(s), CPU_FLASH_KEY_BLOCK
    keys = sum(min(q, s - m) * min(s, -(-(m + min(q, s - m)) // kv) * kv) for m in range(0, s, q))
    return keys / (s * s)
