"""What the shared public-runs CSV does not say in its columns, per source (read from each
source's own text; ``../shared/validation/README.md`` lists the sources).

A user's own run log needs none of this: its rows name their ``stack`` (optional column)
and count TFLOP/s the parsim way (``flop_count`` column, optional). For the public sources:

* ``stack``: the software that ran (``parsim.specs.stack``).
* ``flops``: how the source counts FLOPs in its TFLOP/s and MFU columns, so a predicted step
  time is turned into the number the source printed:
  - ``eq3-recompute``: Narayanan et al. 2021 Eq. 3 with the recompute forward,
    96 B s L h^2 (1 + s/(6h) + V/(16 L h)); Megatron-DeepSpeed prints the same (BLOOM
    chronicles, "TFLOPs calculation improved", PR #251; checked here: TFLOP/s x time x GPUs
    of its rows gives V = 250,880 +- 0.3 %, the padded BLOOM vocabulary).
  - ``6n-attention``: llm-foundry's MFU, (6 N + 12 L h s) per token with N the parameter
    count of the row (``params_b``, embeddings included) and the full (non-causal) s^2
    attention term (llm-foundry ``scripts/train/benchmarking/README.md``; checked: its MFU
    x 312e12 / tokens/s matches to 0.1 %).
  - ``model``: parsim's model FLOPs (``costs.model_flops_per_step``: 3x the forward matmuls,
    full s^2 attention, no recompute), the PaLM MFU convention; Llama 3 does not spell its
    count out, this is the common reading (a causal-half count would read ~4 % higher).
* ``model``: architecture details the columns lack (bias, position encoding, dropout, tied
  embeddings, the padded vocabulary).
* ``plan``: plan keys the columns lack (precision word, recompute, sequence parallelism).
"""
from __future__ import annotations

from dataclasses import dataclass, field

GPT = dict(activation="gelu", norm="layernorm", position="learned", tied_embeddings=True, dropout=True, bias=True)
# MPT (llm-foundry mpt-*.yaml): no biases, ALiBi (a bias inside the attention kernel: no table,
# no pass of its own, parsim's "none"), tied
# embeddings, no dropout in the benchmark configs, LayerNorm, GELU MLP of 4h
MPT = dict(activation="gelu", norm="layernorm", position="none", tied_embeddings=True, dropout=False, bias=False)
# BLOOM (Le Scao et al. 2022 Table 3; tr11 configs): ALiBi, tied embeddings, GELU, biases,
# dropout 0 in pre-training, vocabulary 250,880 (padded)
BLOOM = dict(activation="gelu", norm="layernorm", position="none", tied_embeddings=True, dropout=False, bias=True,
             vocab=250880)
# Llama 3 (Dubey et al. 2024 Table 3): SwiGLU, RMSNorm, RoPE, untied, no bias, no dropout
LLAMA = dict(activation="swiglu", norm="rmsnorm", position="rope", tied_embeddings=False, dropout=False, bias=False)


# BLOOM's nodes (Jean Zay, IDRIS): 8 A100-80GB on NVLink/NVSwitch, like a DGX A100, but "4
# OmniPath links" between nodes (BigScience tr11-176B-ml README, "Hardware"; Le Scao et al.
# 2022, Sec. 3.4.1: Omni-Path Architecture), not 8 HDR InfiniBand NICs: 4 x 100 Gb/s = 12.5 GB/s
# per link, taken at the fraction of line rate HDR reaches in the profile (23 / 25 GB/s):
# 11.5 GB/s per link, 46 GB/s per node where a DGX A100 has 184.
JEAN_ZAY = dict(inter_node=dict(bandwidth=11.5e9, latency=5.0e-6), nics_per_node=4)


@dataclass(frozen=True)
class SourceFacts:
    stack: str
    flops: str = "model"
    model: dict = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    # plan keys the source leaves open that its authors tuned: searched, fastest that fits
    search: tuple[str, ...] = ()
    # the source's cluster where it is not the profile's reference node: keys of the profile's
    # ``network`` section replaced (``inter_node``, ``nics_per_node``)
    network: dict = field(default_factory=dict)


SOURCES: dict[str, SourceFacts] = {
    # Megatron-LM 2021 (SC'21): fp16, full recompute, DP all-reduce after the flush; Table 1
    # leaves the microbatch and the (interleaved) schedule open
    "Narayanan2021_Table1": SourceFacts("megatron-lm-2021", "eq3-recompute", GPT,
                                        dict(dtype="fp16", recompute="full", sp=False), ("mbs", "schedule")),
    # Table 2: PTD-P rows (t = 8 inside a node, the paper's rule) and ZeRO-3 rows (DeepSpeed)
    "Narayanan2021_Table2": SourceFacts("megatron-lm-2021", "eq3-recompute", GPT,
                                        dict(dtype="fp16", recompute="full", sp=False), ("schedule",)),
    # Korthikanti et al. 2022 Table 4: one layer of the 22B model (t = 8, microbatch 4, Table 3)
    "Korthikanti2022_Table4": SourceFacts("megatron-lm", "eq3-recompute", GPT, dict(dtype="fp16", mbs=4)),
    "BLOOM_tr11_chronicles_prequel": SourceFacts("megatron-deepspeed", "eq3-recompute", BLOOM,
                                                 dict(dtype="bf16", schedule="1f1b"), network=JEAN_ZAY),
    "MosaicML_llm-foundry_benchmarks": SourceFacts("fsdp1", "6n-attention", MPT, dict(dtype="bf16")),
    # Llama 3 405B: bf16, TP with sequence parallelism, interleaved pipeline (its vpp is not
    # given: searched), FSDP that keeps the gathered weights (ZeRO-2-like)
    "Llama3_2024_Table4": SourceFacts("megatron-core", "model", LLAMA, dict(dtype="bf16", sp=True), ("schedule",)),
}

# BLOOM's ZeRO-1 runs kept 16-bit gradients until 02-28, when DeepSpeed's BF16 optimizer with
# fp32 gradient accumulation came in ("more memory, slower"): parsim's fp16 state convention
# (2-byte params and grads, 12-byte optimizer) before, its bf16 one (4-byte grads) after;
# both run at the same 16-bit tensor-core rate.
SIXTEEN_BIT_GRADS = {"BLOOM_tr11_chronicles_prequel": "BF16 optimizer with fp32 grad accumulation"}

# the ZeRO-3 rows of Narayanan 2021 Table 2 ran DeepSpeed's ZeRO-3, not Megatron-LM
STACK_BY_ZERO_WORD = {"ZeRO-3 via DeepSpeed": "deepspeed"}

# GPU type words -> shipped profile (first match wins)
GPU_PROFILES = (("A100-SXM4-80GB", "a100-80g"), ("A100-80GB", "a100-80g"), ("A100-SXM4-40GB", "a100-40g"),
                ("H100", "h100-sxm"), ("H200", "h200"))


def source_facts(source: str) -> SourceFacts | None:
    return SOURCES.get(source)
