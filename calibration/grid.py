"""The machine grid: what ``parsim calibrate`` measures when it measures the machine, not a model.

* GEMMs: a Latin hypercube (McKay, Beckman & Conover 1979) over log m, log n, log k per form
  (``F.linear`` forward, the input-gradient and weight-gradient products, batched products),
  inside the device's range of transformer shapes and under a time cap (from a first GEMM's
  rate), so the grid spans launch-bound to saturated shapes on a GPU and stays seconds on a CPU.
* Fused attention: a hypercube over (batch x heads, seq, head dim), MHA and GQA.
* Memory-bound ops: the ops of synthetic layers whose sizes span the range (every op's bytes
  counted as ``costs.ops`` counts them, via ``shapes.membound_points``).
* Synthetic stages (``STAGES``): a few small models of different shapes -- widths, heads, GQA,
  SwiGLU / RMSNorm / RoPE, explicit or fused attention, vocabularies -- run by the executor's
  own modules, for the composition terms; ``reference_layer`` is the real-layer probe's layer.

Everything is seeded: the same machine kind gets the same grid. Pure: no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from parsim.costs.ops import executed_gemm
from parsim.costs.timing import adamw_bytes_per_param
from parsim.specs import ModelSpec

from .shapes import AttentionPoint, GemmPoint, MemboundPoint, membound_points


@dataclass(frozen=True)
class Ranges:
    """Shape ranges of one device kind (elements), and the time cap per measured call (s)."""
    tokens: tuple[int, int]          # GEMM m (batch x seq)
    width: tuple[int, int]           # GEMM n and k
    batch: tuple[int, int]           # batched GEMM / attention batch x heads
    seq: tuple[int, int]
    head_dim: tuple[int, ...]
    hidden: tuple[int, int]          # synthetic layers of the memory-bound grid
    vocab: tuple[int, int]
    max_elements: int                # largest tensor of a memory-bound point
    call_s: float                    # largest GEMM / attention call, seconds at the estimated rate
    multiple: int                    # shapes rounded to multiples of this


# a CPU's GEMM widths reach a small model's vocabulary (the LM head's n, and its gradient's k):
# there the rate falls with the output's width (``RooflineFit.wide``), which points up to 8192
# could not show and the fit extrapolated past
CPU = Ranges(tokens=(32, 4096), width=(32, 32768), batch=(1, 64), seq=(32, 1024), head_dim=(32, 64, 128),
             hidden=(128, 2048), vocab=(1024, 32768), max_elements=2**23, call_s=0.025, multiple=8)
GPU = Ranges(tokens=(128, 16384), width=(128, 32768), batch=(1, 256), seq=(128, 8192), head_dim=(64, 128),
             hidden=(512, 8192), vocab=(8192, 131072), max_elements=2**28, call_s=0.004, multiple=64)


def ranges_for(device_type: str) -> Ranges:
    return GPU if device_type == "cuda" else CPU


def latin_hypercube(count: int, dims: int, seed: int) -> np.ndarray:
    """``count`` points in [0, 1)^dims, one per stratum of every dimension (McKay et al. 1979)."""
    rng = np.random.default_rng(seed)
    strata = np.stack([rng.permutation(count) for _ in range(dims)], axis=1)
    return (strata + rng.random((count, dims))) / count


def _log_value(u: float, lo: float, hi: float, multiple: int) -> int:
    x = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
    return max(multiple, int(round(x / multiple)) * multiple)


# decades of work below the cap that a grid spans: from launch- / overhead-bound calls to saturated ones
WORK_DECADES = 5.0


def spread_by_work(points: list, flops, cap: float, count: int) -> list:
    """``count`` of ``points`` (candidates in draw order) spread evenly over log work between
    cap / 10^WORK_DECADES and ``cap``: one per log-spaced bin (the first candidate drawn into
    it), empty bins filled with the next unused candidates under the cap. Sampling shapes
    uniformly would put most points where one of three dimensions is small; a GPU's grid then
    barely reaches the compute-bound calls a large model makes."""
    lo = math.log(cap) - WORK_DECADES * math.log(10)
    under = [p for p in points if flops(p) <= cap]
    chosen: dict[int, object] = {}
    for p in under:
        b = min(count - 1, max(0, int((math.log(max(flops(p), 1.0)) - lo) / (math.log(cap) - lo) * count)))
        chosen.setdefault(b, p)
    picked = list(chosen.values())
    picked += [p for p in under if all(p is not q for q in picked)][:count - len(picked)]
    return picked[:count]


FORM_SEEDS = {"linear": 11, "grad_input": 12, "grad_weight": 13, "bmm": 14}


# One GEMM in HEAD_SHARE of an unbatched CPU form's grid is an LM head's: a few hundred tokens
# over a small model's vocabulary, where the rate falls with the output's width
# (``RooflineFit.wide``); the hypercube over all widths draws few of them under the time cap, and
# a fit on those few pinned the width weakly (2026-11-30, Zen 3 VM: 63-95 thousand against 24 on a
# sub-grid of head shapes, ``studies/validation_cpu/heldout/wide_gemm.py``)
HEAD_SHARE = 8
HEAD_TOKENS, HEAD_HIDDEN, HEAD_VOCAB = (32, 1024), (128, 1024), (4096, 32768)


def head_points(form: str, count: int, flop_cap: float, seed: int = 0) -> list[GemmPoint]:
    """``count`` LM-head GEMMs of ``form`` under ``flop_cap``: (tokens x hidden) @ (hidden x
    vocab) forward, as executed: linear (tokens, vocab, hidden), grad_input (tokens, hidden,
    vocab), grad_weight (hidden, vocab, tokens), from a hypercube over the three sizes."""
    out: list[GemmPoint] = []
    for a, b, c in latin_hypercube(40 * max(count, 1), 3, FORM_SEEDS[form] + 50 + 100 * seed):
        if len(out) == count:
            break
        tokens, hidden = _log_value(a, *HEAD_TOKENS, CPU.multiple), _log_value(b, *HEAD_HIDDEN, CPU.multiple)
        point = GemmPoint(executed_gemm((tokens, _log_value(c, *HEAD_VOCAB, CPU.multiple), hidden), form), 1, form,
                          f"grid {form} head")
        if point.flops <= flop_cap:
            out.append(point)
    return out


def gemm_grid(device_type: str, form: str, count: int, flop_cap: float, seed: int = 0) -> list[GemmPoint]:
    """``count`` GEMM shapes of ``form`` (``shapes.GemmPoint``: key = the executed GEMM's
    (m, n, k)), each under ``flop_cap`` FLOP. A hypercube of 40x the points is drawn and
    points spread over the work range kept (``spread_by_work``); on a CPU one in ``HEAD_SHARE``
    of the unbatched forms' points is an LM head's instead (``head_points``)."""
    r = ranges_for(device_type)
    heads = head_points(form, count // HEAD_SHARE, flop_cap, seed) if device_type != "cuda" and form != "bmm" else []
    u = latin_hypercube(40 * count, 4, FORM_SEEDS[form] + 100 * seed)
    out = []
    for a, b, c, d in u:
        if form == "bmm":
            batch = _log_value(a, *r.batch, 1)
            seq = _log_value(b, *r.seq, r.multiple)
            head = r.head_dim[min(int(c * len(r.head_dim)), len(r.head_dim) - 1)]
            # scores (s x s x d) and values (s x d x s), as attention runs them
            key = (seq, seq, head) if d < 0.5 else (seq, head, seq)
            out.append(GemmPoint(key, batch, "bmm", f"grid {form}"))
        else:
            key = (_log_value(a, *r.tokens, r.multiple), _log_value(b, *r.width, r.multiple),
                   _log_value(c, *r.width, r.multiple))
            out.append(GemmPoint(key, 1, form, f"grid {form}"))
    return spread_by_work(out, lambda p: p.flops, flop_cap, count - len(heads)) + heads


def attention_grid(device_type: str, count: int, flop_cap: float, seed: int = 0) -> list[AttentionPoint]:
    """Causal attention points over (batch x heads, seq, head dim); every third with grouped
    query attention (4 query heads per KV head) where the heads allow."""
    r = ranges_for(device_type)
    out = []
    for i, (a, b, c) in enumerate(latin_hypercube(40 * count, 3, 21 + 100 * seed)):
        heads = _log_value(a, *r.batch, 1)
        gqa = i % 3 == 2 and heads % 4 == 0
        out.append(AttentionPoint(mbs=1, heads=heads, kv_heads=heads // 4 if gqa else heads,
                                  seq=_log_value(b, *r.seq, r.multiple),
                                  head_dim=r.head_dim[min(int(c * len(r.head_dim)), len(r.head_dim) - 1)]))
    return spread_by_work(out, lambda p: p.fwd_flops * 3.5, flop_cap, count)


def membound_grid(device_type: str, dtype: str, count: int, seed: int = 0) -> list[MemboundPoint]:
    """Every memory-bound op at ``count`` sizes: the ops of ``count`` synthetic layers (one
    or two layers each, so AdamW and gradient accumulation step over whole small models),
    drawn from a hypercube over (hidden, seq x mbs, vocab) and kept under the element cap."""
    r = ranges_for(device_type)
    out: list[MemboundPoint] = []
    kept = 0
    for a, b, c, d in latin_hypercube(6 * count, 4, 31 + 100 * seed):
        hidden = _log_value(a, *r.hidden, 64)
        heads = max(1, hidden // 64)
        seq = _log_value(b, *r.seq, r.multiple)
        spec = ModelSpec(name="grid", layers=1 + int(d * 2), hidden=hidden, heads=heads,
                         vocab=_log_value(c, *r.vocab, 128), seq_len=seq)
        largest = max(seq * spec.ffn_hidden, seq * spec.vocab, heads * seq * seq, spec.vocab * hidden)
        if largest > r.max_elements:
            continue
        out += [replace(p, source=f"h={hidden} s={seq} v={spec.vocab} L={spec.layers}")
                for p in membound_points(spec, [1], [1], dtype)]
        kept += 1
        if kept == count:
            break
    return out + adamw_grid(device_type, dtype, ADAMW_POINTS_PER_COUNT * count, seed)


# AdamW over 1 .. 2^8 tensors: the executor's optimizer loops over parameter tensors in Python
ADAMW_MAX_TENSORS_LOG2 = 8
# AdamW steps per memory-bound size of the grid: its fit has a per-tensor term and a rate per
# cache level (``optimizer_fit.fit_optimizer_levels``), so it needs a few points in each level
ADAMW_POINTS_PER_COUNT = 3
# a CPU step's parameters in all, in max_elements: a rank steps its whole model at once, several
# tensors of the largest sizes (a GPU's steps stay at max_elements); 2 x, not more: a quick
# calibration's larger steps cost seconds of a newcomer's first `make demo`
ADAMW_CPU_TOTAL = 2


def adamw_grid(device_type: str, dtype: str, count: int, seed: int = 0) -> list[MemboundPoint]:
    """``count`` AdamW steps over equal tensors of 256 .. max_elements elements each, 1 .. 256
    of them, at most max_elements in all (``ADAMW_CPU_TOTAL`` times that on a CPU; a Latin
    hypercube over log size x log tensors, the size drawn first, so tensor sizes spread evenly
    over the cache levels the optimizer's rate depends on): the synthetic layers alone tie the
    tensor count to the bytes; these separate the per-tensor cost of the optimizer's loop
    (``costs.optimizer_tensors``) from its bytes."""
    r = ranges_for(device_type)
    per_param = adamw_bytes_per_param(dtype)
    out = []
    for a, b in latin_hypercube(count, 2, 57 + 100 * seed):
        elements = _log_value(b, 256, r.max_elements, 64)
        total = r.max_elements * (ADAMW_CPU_TOTAL if device_type == "cpu" else 1)
        most = min(ADAMW_MAX_TENSORS_LOG2, math.log2(max(1, total // elements)))
        tensors = max(1, round(2 ** (a * most)))
        params = tensors * elements
        # matrices, as a model's weights are: the executor's AdamW decays every tensor of two or
        # more dimensions (``make_adamw``), one more pass over the parameter (+5-13 % a step
        # measured on the 2-vCPU AMD EPYC VM, 2026-11-30, 4 KiB to 16 MiB tensors)
        out.append(MemboundPoint("adamw", (params,), params * per_param, 0.0, f"tensors={tensors} n={elements}",
                                 ((elements // 64, 64),) * tensors))
    return out


# ----------------------------------------------------------------------------- synthetic stages

def _stage(name: str, layers: int, hidden: int, heads: int, ffn: int, seq: int, vocab: int, **kw) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, ffn_hidden=ffn, seq_len=seq, vocab=vocab,
                     dropout=False, **kw)


_LLAMA = dict(activation="swiglu", norm="rmsnorm", position="rope", tied_embeddings=False, bias=False)

# (spec, mbs) per device kind. Shapes differ in every respect a cost depends on; the last is the
# reference whose one layer is the real-layer probe (``reference_layer``). None is a validation
# model (studies/validation_cpu).
STAGES = {
    "cpu": [
        (_stage("stage-gelu", 2, 256, 4, 1024, 128, 4096, flash_attention=True), 2),
        (_stage("stage-llama", 2, 384, 6, 1024, 96, 3072, kv_heads=2, flash_attention=True, **_LLAMA), 2),
        (_stage("stage-explicit", 1, 640, 10, 2560, 64, 6144, flash_attention=False), 1),
        # many small ops and few large ones: composing ops costs host seconds per op (module
        # calls, autograd's nodes) besides a factor on their time, and the stages above, 18-26
        # ops of similar sizes each, cannot tell the two apart (``surface_fit.fit_composition``)
        (_stage("stage-many", 6, 128, 2, 512, 64, 1024, flash_attention=True), 1),
        # a second one, so that leaving either out of the fit still leaves a many-op stage in it
        (_stage("stage-many-llama", 4, 192, 3, 512, 48, 1536, **_LLAMA), 1),
        (_stage("stage-big", 1, 1024, 8, 3072, 128, 6144, flash_attention=True), 1),
        (_stage("stage-reference", 2, 512, 8, 2048, 128, 2048, flash_attention=True), 1),
    ],
    "cuda": [
        (_stage("stage-gelu", 2, 1024, 8, 4096, 1024, 32768, flash_attention=True), 2),
        (_stage("stage-llama", 2, 1536, 12, 4096, 768, 32000, kv_heads=4, flash_attention=True, **_LLAMA), 2),
        (_stage("stage-explicit", 1, 2560, 20, 10240, 512, 50304, flash_attention=False), 1),
        # one stage whose kernels outlast the host's issue time (~5 ms of GEMMs a forward on an
        # H200 against ~3 ms of issue): the stages above run at their host's pace there, so
        # the kernels' own composition factor would not be seen (``layer_terms``)
        (_stage("stage-wide", 1, 3072, 24, 12288, 2048, 32768, flash_attention=True), 4),
        (_stage("stage-reference", 2, 2048, 16, 8192, 1024, 16384, flash_attention=True), 1),
    ],
}


def stages(device_type: str, quick: bool = False) -> list[tuple[ModelSpec, int]]:
    """The synthetic stages to run (with ``quick``, the explicit-attention one left out)."""
    out = STAGES["cuda" if device_type == "cuda" else "cpu"]
    return [s for s in out if not (quick and s[0].name == "stage-explicit")]


def reference_layer(device_type: str) -> tuple[ModelSpec, int]:
    """The real-layer probe's model (its layer is what the executor re-times around a run to
    anchor the machine's drift) and micro-batch size: the reference stage's."""
    spec, mbs = STAGES["cuda" if device_type == "cuda" else "cpu"][-1]
    return replace(spec, name="probe-reference"), mbs
