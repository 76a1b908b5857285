"""Held-out plans' memory rules (issue 20) against the executor: a fully recomputed layer's
transient and FSDP2's layer gradients are held by a layer's backward only, not beside the loss
gradients of the head nor the embedding's; ZeRO-3 as FSDP2 keeps each stage's root unit
(embedding, final norm + head) gathered through its actions."""
from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from parsim.costs import footprint  # noqa: E402
from parsim.costs.activations import (backward_working_bytes, embedding_activation_bytes,  # noqa: E402
                                      head_activation_bytes, layer_activation_bytes, stage_output_bytes)
from parsim.specs import load_model, parse_plan  # noqa: E402

from test_memory_model import recomputed_stage, tracked  # noqa: E402


def _recomputed_backward_peak(spec, first: bool, last: bool, layers: int = 2) -> tuple[float, float]:
    """(bytes stored per microbatch, peak of one backward beyond them) of a stage whose layers
    are fully recomputed (non-reentrant ``torch.utils.checkpoint``), gradients allocated."""
    stage = recomputed_stage(spec, layers, first, last)
    s, h = spec.seq_len, spec.hidden
    targets = torch.randint(0, spec.vocab, (1, s))
    with tracked(stage) as tracker:
        before = sum(tracker.live.values())
        with tracker.phase("activations"):
            x = torch.randint(0, spec.vocab, (1, s)) if first else torch.randn(1, s, h, requires_grad=True)
            out = stage(x, targets) if last else stage(x)
            stored = sum(tracker.live.values())
            tracker.peak_total = 0
            if last:
                out.backward()
            else:
                out.backward(torch.randn(1, s, h))
            del x, out
            peak = tracker.peak_total
    return stored - before, peak - stored


@pytest.mark.parametrize("first, last, vocab", [(True, False, 1024), (False, True, 1024), (False, False, 512)])
def test_recompute_transient_sits_on_the_layer_phase_only(first, last, vocab):
    """A wide vocabulary makes the embedding's (first) and the loss's (last) phase the peak: the
    recomputed layer's activations are gone by then (or not yet made); a middle stage's peak is
    the recomputed layer plus its working set."""
    spec = replace(load_model("tiny"), flash_attention=True, vocab=vocab)
    plan = parse_plan("mbs=1 gbs=1 dtype=fp32 recompute=full")
    stored, peak = _recomputed_backward_peak(spec, first, last)
    stash = (2 * layer_activation_bytes(spec, plan) + (embedding_activation_bytes(spec, plan) if first else 0.0)
             + (head_activation_bytes(spec, plan) if last else 0.0))
    # ~256 B of small tensors per stage uncounted (tests/test_memory_model.py)
    assert stash + (0.0 if last else stage_output_bytes(spec, plan)) == pytest.approx(stored, abs=1024)
    transient = footprint.recompute_transient(True, layer_activation_bytes(spec, plan, "none"),
                                              layer_activation_bytes(spec, plan, "full"))
    model = backward_working_bytes(spec, plan, first, last, stash, layer_extra=transient)
    assert model == pytest.approx(peak, rel=0.02)
    if first or last:      # the rule this replaced added the transient on top of every phase: +31 %
        assert model + transient > 1.2 * peak


@pytest.mark.parametrize("zero", [2, 3])
def test_fsdp2_peak_per_rank_matches_the_model_on_two_gloo_ranks(zero):
    """dp=2 ZeRO-2/3 run as FSDP2 on gloo ranks: the measured peak (at the loss's backward, a
    wide vocabulary) equals ``memory_by_stage`` under the executor's profile: no layer gradients
    beside the loss gradients (ZeRO-2; the model once added them: +7.8 % on the held-out GPT),
    the root unit's embedding gathered (ZeRO-3; once left out: -4.0 % on the held-out deep model)."""
    from parsim.costs import memory_by_stage
    from parsim.executor import ExecutorConfig, RunSpec, run_plans
    from parsim.specs import load_cluster

    spec = replace(load_model("tiny"), flash_attention=True, layers=2, vocab=4096)
    plan = parse_plan(f"dp=2 mbs=2 gbs=8 zero={zero} dtype=fp32")
    result = run_plans([RunSpec(spec, plan, ExecutorConfig(steps=2, warmup=2, track_memory=True))])[0]
    predicted = memory_by_stage(spec, plan, load_cluster("cpu:2", profile="cpu-calibrated"))[0].total
    for measured in result.peak_memory_bytes_by_rank:
        assert predicted == pytest.approx(measured, rel=0.02)


@pytest.mark.parametrize("ffn", [128, 4096])
def test_optimizer_step_peak_per_rank_matches_the_model_on_two_gloo_ranks(ffn):
    """pp=2 with full recomputation and a wide tied vocabulary: both ranks peak in the optimizer
    step, not in a backward, where the executor's AdamW holds sqrt(v) and its quotient (two fp32
    copies of the 2 MiB word embedding, ``footprint.optimizer_temporaries``) beside the model
    states; ``memory_by_stage`` finds that moment (the backwards alone: -16 % and -8 %, the
    held-out deep model's -9.5 % and -4.9 %). The last rank steps its output weight right after
    the last layer's MLP-down weight, whose denominator is still alive (``footprint.step_window``):
    with a 4096-wide MLP, counting the output weight alone read -4.7 % there."""
    from parsim.costs import memory_by_stage, step_windows
    from parsim.executor import ExecutorConfig, RunSpec, run_plans
    from parsim.specs import load_cluster

    spec = replace(load_model("tiny"), flash_attention=True, layers=2, vocab=8192, ffn_hidden=ffn)
    plan = parse_plan("pp=2 mbs=1 gbs=4 recompute=full dtype=fp32")
    result = run_plans([RunSpec(spec, plan, ExecutorConfig(steps=2, warmup=2, track_memory=True))])[0]
    predicted = memory_by_stage(spec, plan, load_cluster("cpu:2", profile="cpu-calibrated"))
    for stage, measured, breakdown, window in zip(predicted, result.peak_memory_bytes_by_rank,
                                                  result.memory_breakdown_by_rank, step_windows(spec, plan)):
        assert stage.activations == 0.0 and stage.other == 4 * window
        assert stage.total == pytest.approx(measured, rel=0.005)
        assert breakdown["other"] == pytest.approx(stage.other, rel=0.02)   # the temporaries
