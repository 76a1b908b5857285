"""What eager PyTorch layers keep, against the executor's own stages: unfused attention's (s, s)
terms, and the Llama-style layer's eager RMSNorm, SwiGLU and RoPE.

With explicit attention a layer keeps the softmax output, K and V repeated to every query head
(GQA) and, in eager PyTorch, the bool causal mask; its backward holds two (b, a, s, s) gradients
at once. Before these were modelled a long-sequence plan of the executor was predicted 32 % low
(issue 20). Measured with the allocator-level tracker in one process (``test_memory_model``'s
probe), for GQA (``tiny``: 4 heads, 2 KV heads) and MHA, at sequences where the s^2 terms are
small, even and dominant."""
from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")

from parsim.costs.activations import (attention_working_bytes, backward_working_bytes,  # noqa: E402
                                      embedding_activation_bytes, head_activation_bytes,
                                      layer_activation_bytes, stage_output_bytes)
from parsim.specs import load_model, parse_plan  # noqa: E402

from test_memory_model import POSITIONS, _measure  # noqa: E402

TINY = replace(load_model("tiny"), flash_attention=False)       # GQA: 4 heads, 2 KV heads
MHA = replace(TINY, kv_heads=TINY.heads)
LLAMA = replace(TINY, activation="swiglu", norm="rmsnorm", position="rope", bias=False)


def _predicted(spec, plan, first: bool, last: bool) -> tuple[float, float]:
    stash = (2 * layer_activation_bytes(spec, plan) + (embedding_activation_bytes(spec, plan) if first else 0.0)
             + (head_activation_bytes(spec, plan) if last else 0.0))
    return stash + (0.0 if last else stage_output_bytes(spec, plan)), backward_working_bytes(spec, plan, first, last,
                                                                                            stash)


@pytest.mark.parametrize("seq", [32, 128, 512])
@pytest.mark.parametrize("spec", [TINY, MHA], ids=["gqa", "mha"])
def test_explicit_attention_stores_what_the_model_counts(spec, seq):
    spec = replace(spec, seq_len=seq)
    plan = parse_plan("mbs=1 gbs=1 dtype=fp32")
    stored, working = _measure(spec, 1, False, False)
    predicted_stored, predicted_working = _predicted(spec, plan, False, False)
    assert predicted_stored == pytest.approx(stored, rel=0.01)
    if seq >= 128:      # where the attention phase is the backward's peak
        assert attention_working_bytes(spec, plan) > 0
        assert predicted_working == pytest.approx(working, rel=0.01)


@pytest.mark.parametrize("recompute", [False, True], ids=["stored", "recomputed"])
def test_with_dropout_the_backward_frees_the_dropouts_output_before_its_second_gradient(recompute):
    """Attention dropout as a CPU runs it (its noise kept in fp32): the PV product's backward ends
    by freeing the dropout's output, so the next score gradient nets one u, not two; recomputed,
    the layer's whole stash comes back on top (``footprint.recompute_transient``)."""
    spec = replace(MHA, seq_len=128, dropout=True)
    plan = parse_plan(f"mbs=1 gbs=1 dtype=fp32 recompute={'full' if recompute else 'none'}")
    import test_memory_model as probe
    made = probe.StageModule

    def stage(*args, **kwargs):
        module = made(*args, **kwargs)
        for block in module.layers.values():
            block.recompute_full = recompute
        return module
    probe.StageModule = stage
    try:
        stored, working = _measure(spec, 1, False, False)
    finally:
        probe.StageModule = made
    predicted_stored, predicted_working = _predicted(spec, plan, False, False)
    transient = layer_activation_bytes(spec, plan, "none") - layer_activation_bytes(spec, plan, "full")
    assert predicted_stored == pytest.approx(stored, rel=0.01)
    assert predicted_working + (transient if recompute else 0.0) == pytest.approx(working, rel=0.01)


@pytest.mark.parametrize("position", ["last", "single"])
def test_a_long_sequences_backward_peak_is_the_attention_phase(position):
    """s = 512: the two score gradients (2 x 4 MiB) dwarf the MLP's; the last stage's is one
    e*s*b*h (the received gradient a middle stage holds) below the model's, 2 % of it."""
    first, last = POSITIONS[position]
    spec = replace(MHA, seq_len=512)
    plan = parse_plan("mbs=1 gbs=1 dtype=fp32")
    stored, working = _measure(spec, 1, first, last)
    predicted_stored, predicted_working = _predicted(spec, plan, first, last)
    assert predicted_stored == pytest.approx(stored, rel=0.01)
    assert predicted_working == pytest.approx(working, rel=0.03)


def test_megatrons_fused_softmax_keeps_no_mask_and_one_score_gradient():
    spec = replace(MHA, seq_len=512)
    # fp32: the executor's fp16 is autocast over fp32 parameters, which differs in more than this
    eager, fused = parse_plan("mbs=2 gbs=2 dtype=fp32"), parse_plan("mbs=2 gbs=2 dtype=fp32 stack=megatron-lm")
    score = 4 * 2 * spec.heads * 512 * 512          # e b a s^2
    assert attention_working_bytes(spec, eager) - attention_working_bytes(spec, fused) == score
    assert layer_activation_bytes(spec, eager) - layer_activation_bytes(spec, fused) == 512 * 512   # the bool mask
    # with dropout Megatron's dropout backward allocates (two); eager PyTorch's frees the dropout's
    # output first (one net, measured below)
    dropout = replace(spec, dropout=True)
    assert attention_working_bytes(dropout, fused) - attention_working_bytes(dropout, eager) == score
    assert attention_working_bytes(dropout, eager) == attention_working_bytes(spec, eager) - score
    assert attention_working_bytes(replace(spec, flash_attention=True), eager) == 0.0


@pytest.mark.parametrize("flash", [True, False], ids=["sdpa", "explicit"])
def test_a_llama_layer_keeps_its_eager_norms_silu_output_and_rope_copy(flash):
    """The fp32 x and x*rstd of both RMSNorms, silu(gate) beside gate and up, RoPE's cos / sin and
    (SDPA) the attention output's re-laid-out copy: 28 % of the layer was uncounted before."""
    spec = replace(LLAMA, flash_attention=flash, seq_len=64)
    plan = parse_plan("mbs=2 gbs=2 dtype=fp32")
    stored, working = _measure(spec, 2, False, False)
    predicted_stored, predicted_working = _predicted(spec, plan, False, False)
    assert predicted_stored == pytest.approx(stored, rel=0.01)
    assert predicted_working == pytest.approx(working, rel=0.01)
    fused = parse_plan("mbs=2 gbs=2 dtype=fp32 stack=megatron-lm")     # Megatron's fused kernels keep less
    assert layer_activation_bytes(spec, fused) < layer_activation_bytes(spec, plan)
