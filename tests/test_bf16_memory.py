"""The executor's bf16 runs against the memory model, on real gloo ranks (issue 16).

The executor runs bf16 as ``torch.autocast`` over fp32 parameters (``executor/optimizer.py``):
fp32 parameters, gradients and Adam states (16 bytes a parameter, not the 18 of a 16-bit model
with an fp32 master copy), an fp32 residual stream, a 16-bit cast of its input per GEMM and a
16-bit copy of every GEMM weight per microbatch in flight (``costs.saved.precision``; the
``torch`` stack's ``autocast``); under full recomputation those copies pile up in autocast's
cache to the forward's end, which then outweighs the backward (``activations.forward_working_bytes``).
Before the model knew it, the held-out models' bf16 plans (dp=2, pp=2 1F1B, tp=2 SP full recompute,
ZeRO-1/2/3, selective) were predicted up to 18 % low (heldout-gpt ZeRO-2), +0.1 % to +11.6 % high with full
recomputation; now all 62 ranks of 31 such plans within 1.0 % (the executor's vocabulary-parallel
loss with tp > 1, the FSDP2 post-backward and the forward's end included)."""
from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")

from parsim.costs import memory_by_stage  # noqa: E402
from parsim.specs import load_cluster, load_model, parse_plan  # noqa: E402

# a vocabulary wide enough that ZeRO-3's peak is the loss's backward (``memory.fsdp2_layer_only_bytes``) ...
SPEC = replace(load_model("tiny"), flash_attention=True, layers=4, hidden=128, ffn_hidden=512, vocab=4096,
               seq_len=32)
PLANS = ["dp=2 mbs=2 gbs=8", "pp=2 mbs=2 gbs=8 schedule=1f1b", "tp=2 mbs=2 gbs=4 sp=true recompute=full",
         "pp=2 mbs=2 gbs=8 schedule=1f1b recompute=full", "dp=2 mbs=2 gbs=8 zero=3",
         "pp=2 mbs=2 gbs=8 schedule=1f1b recompute=selective", "tp=2 mbs=2 gbs=4 recompute=selective"]


# ... and one narrow enough that ZeRO-2/3's peak is a layer's post-backward (``memory.fsdp2_post_backward``:
# the new gradient shard, the layer resharded); at s = 32 the tied embedding's two gradients and their sum
# top tp=2's full recomputation (``footprint.backward_working``), and without gradient accumulation FSDP2
# has no gradient shard before its first reduce-scatter (``fsdp2_absent_grads``, ``fsdp2_after_layers``,
# ``fsdp2_forward_gather``)
NARROW = replace(SPEC, vocab=1024)
CASES = [(SPEC, p) for p in PLANS] + [(NARROW, "dp=2 mbs=2 gbs=8 zero=2"), (NARROW, "dp=2 mbs=2 gbs=8 zero=3"),
                                      (NARROW, "dp=2 mbs=1 gbs=6 zero=2"), (NARROW, "dp=2 mbs=2 gbs=4 zero=3"),
                                      (NARROW, "dp=2 mbs=2 gbs=4 zero=2"),
                                      (SPEC, "dp=2 mbs=2 gbs=4 zero=2"), (SPEC, "dp=2 mbs=2 gbs=4 zero=3")]
IDS = [f"{'narrow ' if spec is NARROW else ''}{p}" for spec, p in CASES]


@pytest.fixture(scope="module")
def measured():
    from parsim.executor import ExecutorConfig, RunSpec, run_plans

    plans = [parse_plan(f"{p} dtype=bf16") for _, p in CASES]
    results = run_plans([RunSpec(spec, plan, ExecutorConfig(steps=2, warmup=2, track_memory=True))
                         for (spec, _), plan in zip(CASES, plans)])
    return dict(zip(IDS, zip(plans, results)))


@pytest.mark.parametrize("case", IDS)
def test_bf16_peak_per_rank_matches_the_model_on_two_gloo_ranks(measured, case):
    plan, result = measured[case]
    spec = NARROW if case.startswith("narrow") else SPEC
    predicted = memory_by_stage(spec, plan, load_cluster("cpu:2", profile="cpu-calibrated"))
    for rank, peak in enumerate(result.peak_memory_bytes_by_rank):
        # the breakdown at the measured peak names what a rare miss held (seen twice in CI-like
        # runs: narrow ZeRO-3 gbs=4 rank 0 at +0.45 MB over its usual 11,121,436 bytes)
        assert predicted[rank // (plan.dp * plan.tp)].total == pytest.approx(peak, rel=0.03), \
            f"rank {rank}: {result.memory_breakdown_by_rank[rank]}"


# the embedding's dense gradient under autocast: fp32, as the residual stream's gradient it is made of
PROBE = replace(load_model("tiny"), layers=4, hidden=384, heads=6, kv_heads=2, ffn_hidden=1024, vocab=12000,
                seq_len=48, activation="swiglu", norm="rmsnorm", position="rope", tied_embeddings=False,
                bias=False, flash_attention=True)


def test_the_first_ranks_embedding_backward_holds_an_fp32_gradient_under_autocast():
    from parsim.costs.activations import embedding_grad_bytes, vocab_grad_bytes
    from parsim.executor import ExecutorConfig, RunSpec, run_plans

    # two microbatches (m = pp): the same peak as four (153.5 MiB, no activation live at it), half the bf16 work
    plan = parse_plan("pp=2 vpp=2 mbs=1 gbs=2 schedule=interleaved dtype=bf16")
    assert embedding_grad_bytes(PROBE, plan) == 2 * vocab_grad_bytes(PROBE, plan)   # fp32 beside the bf16 head's
    result = run_plans([RunSpec(PROBE, plan, ExecutorConfig(steps=2, warmup=2, track_memory=True))])[0]
    first = memory_by_stage(PROBE, plan, load_cluster("cpu:2", profile="cpu-calibrated"))[0].total
    measured = result.peak_memory_bytes_by_rank[0]
    assert first == pytest.approx(measured, rel=0.01)
    # counted at 2 bytes an element, this rank's peak read 6 % low (144.7 against 153.5 MiB; s = 96: 147.9 / 156.8)
    assert first - (embedding_grad_bytes(PROBE, plan) - vocab_grad_bytes(PROBE, plan)) < 0.96 * measured
