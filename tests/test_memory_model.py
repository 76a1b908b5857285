"""The memory model's per-microbatch terms against the executor's own stages, measured with its
allocator-level ``MemoryTracker`` in one process (no ranks needed): what a microbatch stores
(layers, head, the output a non-last stage keeps) and what a backward holds beyond that
(``costs.activations.backward_working_bytes``), for a middle, first, last and single stage."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from parsim.costs.activations import (backward_working_bytes, embedding_activation_bytes,  # noqa: E402
                                      head_activation_bytes, layer_activation_bytes, stage_output_bytes)
from parsim.executor.memory import MemoryTracker  # noqa: E402
from parsim.executor.model import StageModule  # noqa: E402
from parsim.specs import load_model, parse_plan  # noqa: E402

POSITIONS = {"middle": (False, False), "first": (True, False), "last": (False, True), "single": (True, True)}


def _measure(spec, mbs: int, first: bool, last: bool, layers: int = 2) -> tuple[float, float]:
    """(bytes stored per microbatch, peak during one backward beyond everything stored), with
    gradients already allocated as in every step after the first."""
    torch.manual_seed(0)
    stage = StageModule(spec, 0, layers, first, last)
    for p in stage.parameters():
        p.grad = torch.zeros_like(p)
    s, h, vocab = spec.seq_len, spec.hidden, spec.vocab
    targets = torch.randint(0, vocab, (mbs, s))

    def new_input():
        return torch.randint(0, vocab, (mbs, s)) if first else torch.randn(mbs, s, h, requires_grad=True)

    tracker = MemoryTracker()
    with tracker:
        tracker.classify(list(stage.parameters()), "params")
        tracker.classify([p.grad for p in stage.parameters()], "grads")
        before = sum(tracker.live.values())
        with tracker.phase("activations"):
            held = []
            for _ in range(2):
                x = new_input()
                held.append((x, stage(x, targets) if last else stage(x)))
            stored = sum(tracker.live.values())
            tracker.peak_total = 0
            x, out = held.pop()
            if last:
                out.backward()
            else:
                out.backward(torch.randn(mbs, s, h))
            del x, out
            peak = tracker.peak_total
    return (stored - before) / 2, peak - stored


@pytest.mark.parametrize("position", list(POSITIONS))
@pytest.mark.parametrize("mbs", [1, 2])
def test_stored_bytes_and_backward_working_set_match_the_executor(position, mbs):
    first, last = POSITIONS[position]
    spec = replace(load_model("tiny"), flash_attention=True)
    plan = parse_plan(f"mbs={mbs} gbs={mbs} dtype=fp32")
    stored, working = _measure(spec, mbs, first, last)
    stash = (2 * layer_activation_bytes(spec, plan) + (embedding_activation_bytes(spec, plan) if first else 0.0)
             + (head_activation_bytes(spec, plan) if last else 0.0))
    predicted_stored = stash + (0.0 if last else stage_output_bytes(spec, plan))
    # the flash path's stored bytes leave ~1 KiB per layer of small tensors uncounted
    assert predicted_stored == pytest.approx(stored, rel=0.01)
    assert backward_working_bytes(spec, plan, first, last, stash) == pytest.approx(working, rel=0.01)


@pytest.mark.parametrize("position", ["last", "middle"])
def test_working_set_follows_the_largest_term(position):
    """A long sequence over a wide vocabulary: the cross-entropy's logits gradients, not the
    weight gradients, set the last stage's peak; a middle stage's is the MLP's (s b f terms)."""
    first, last = POSITIONS[position]
    spec = replace(load_model("tiny"), flash_attention=True, seq_len=256, vocab=512, ffn_hidden=256)
    plan = parse_plan("mbs=1 gbs=1 dtype=fp32")
    stash = 2 * layer_activation_bytes(spec, plan) + (head_activation_bytes(spec, plan) if last else 0.0)
    _, working = _measure(spec, 1, first, last)
    assert backward_working_bytes(spec, plan, first, last, stash) == pytest.approx(working, rel=0.01)


# the zero-bubble family within the 3 % (#21): on this 4-layer model the split backward's
# peaks (kept output gradients, W's working set) were off by 0.1-2.1 % per rank
@pytest.mark.parametrize("schedule, rel", [("gpipe", 0.01), ("1f1b", 0.01), ("zb-h1", 0.03), ("zbv", 0.03),
                                           ("dualpipev", 0.03)])
def test_pipeline_peak_per_rank_matches_the_model_on_two_gloo_ranks(schedule, rel):
    """pp=2 on real gloo ranks: each rank's measured peak (its memory-tracked step, gradients
    kept from the step before as Megatron-LM's buffer keeps them) equals ``memory_by_stage``.
    GPipe holds every microbatch when its first backward starts; freeing the gradients between
    steps (``set_to_none``) made that moment gradient-free and the measured peak one
    microbatch lower than the model's."""
    from parsim.costs import memory_by_stage
    from parsim.executor import ExecutorConfig, RunSpec, run_plans
    from parsim.specs import load_cluster

    spec = replace(load_model("tiny"), flash_attention=True, layers=4)
    plan = parse_plan(f"pp=2 mbs=1 gbs=4 schedule={schedule} dtype=fp32")
    result = run_plans([RunSpec(spec, plan, ExecutorConfig(steps=2, warmup=2, track_memory=True))])[0]
    predicted = [s.total for s in memory_by_stage(spec, plan, load_cluster("cpu:2"))]
    for measured, model in zip(result.peak_memory_bytes_by_rank, predicted):
        assert model == pytest.approx(measured, rel=rel)


# A vocabulary 64 x the hidden size, as LLMs have (Llama 3: 128,256 over 4,096): the last stage's
# logits then outweigh its layers. The split backward's I frees the loss's saved log-softmax when it
# detaches the loss, and W makes the output layer's V x h gradient after the layers' groups have
# deleted their output gradients; counting neither, the model read the last rank 14-20 % high
# (zb-h1 +15.2 %, zb-h2 +19.6 %, interleaved-zb +14.4 %).
@pytest.mark.parametrize("schedule, vpp, rel", [("zb-h1", 1, 0.01), ("zb-h2", 1, 0.01), ("interleaved-zb", 2, 0.01),
                                                ("zbv", 2, 0.03), ("dualpipev", 2, 0.03)])
def test_split_backward_peak_per_rank_matches_the_model_with_a_wide_vocabulary(schedule, vpp, rel):
    from parsim.costs import memory_by_stage
    from parsim.executor import ExecutorConfig, RunSpec, run_plans
    from parsim.specs import load_cluster

    spec = replace(load_model("tiny"), flash_attention=True, layers=4, vocab=4096)
    plan = parse_plan(f"pp=2 vpp={vpp} mbs=1 gbs=4 schedule={schedule} dtype=fp32")
    result = run_plans([RunSpec(spec, plan, ExecutorConfig(steps=2, warmup=2, track_memory=True))])[0]
    predicted = [s.total for s in memory_by_stage(spec, plan, load_cluster("cpu:2"))]
    for rank, (measured, model) in enumerate(zip(result.peak_memory_bytes_by_rank, predicted)):
        assert model == pytest.approx(measured, rel=rel), f"rank {rank}"


def test_interleaved_zb_first_rank_counts_no_embedding_gradient_in_its_other_chunks_w():
    """Rank 0 of interleaved-zb holds the first stage, whose W is its whole backward, and a middle
    chunk: a W of that chunk makes no embedding gradient (``memory._rank_weight_working``). With
    it the rank read +1.8 % here, +5.6 % on heldout-gpt."""
    from parsim.costs import memory_by_stage
    from parsim.executor import ExecutorConfig, RunSpec, run_plans
    from parsim.specs import load_cluster

    spec = replace(load_model("tiny"), flash_attention=True, layers=4, hidden=128, ffn_hidden=512, vocab=4096,
                   seq_len=64)
    plan = parse_plan("pp=2 vpp=2 mbs=1 gbs=4 schedule=interleaved-zb dtype=fp32")
    result = run_plans([RunSpec(spec, plan, ExecutorConfig(steps=2, warmup=2, track_memory=True))])[0]
    predicted = [s.total for s in memory_by_stage(spec, plan, load_cluster("cpu:2"))]
    for rank, (measured, model) in enumerate(zip(result.peak_memory_bytes_by_rank, predicted)):
        assert model == pytest.approx(measured, rel=0.005), f"rank {rank}"


def recomputed_stage(spec, layers: int, first: bool = False, last: bool = False,
                     recompute: bool = True) -> StageModule:
    """A stage of ``layers`` fully recomputed layers (non-reentrant ``torch.utils.checkpoint``;
    ``recompute`` False: stored), its gradients allocated as in every step after the first."""
    torch.manual_seed(0)
    stage = StageModule(spec, 0, layers, first, last)
    for block in stage.layers.values():
        block.recompute_full = recompute
    for p in stage.parameters():
        p.grad = torch.zeros_like(p)
    return stage


@contextmanager
def tracked(stage):
    """The executor's allocator-level tracker, the stage's parameters and gradients classified."""
    tracker = MemoryTracker()
    with tracker:
        tracker.classify(list(stage.parameters()), "params")
        tracker.classify([p.grad for p in stage.parameters()], "grads")
        yield tracker


def _measure_weight_pass(spec, layers: int, recompute: bool = True) -> float:
    """Peak of a middle stage's W (torch's ``stage_backward_weight``) over its start, every layer
    fully recomputed (or, ``recompute`` False, stored), after its I (``executor.split_backward``)."""
    from parsim.executor.split_backward import backward_input, backward_weight

    stage = recomputed_stage(spec, layers, recompute=recompute)
    with tracked(stage) as tracker, tracker.phase("activations"):
        x = torch.randn(1, spec.seq_len, spec.hidden, requires_grad=True)
        out = stage(x)
        pending = backward_input(out, torch.randn_like(out), x, stage)
        del out
        start = sum(tracker.live.values())
        tracker.peak_total = 0
        backward_weight(pending, stage)
    return tracker.peak_total - start


# the GPT layer (GeLU, LayerNorm, learned positions, biases) and the Llama one (SwiGLU, RMSNorm,
# rope, no biases), each with SDPA and with the explicit core (GQA: K and V repeated)
LAYER_KINDS = {"gelu": dict(activation="gelu", norm="layernorm", position="learned", bias=True),
               "swiglu": dict(activation="swiglu", norm="rmsnorm", position="rope", bias=False)}


@pytest.mark.parametrize("kind", list(LAYER_KINDS))
@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("layers", [1, 2, 4])
def test_weight_pass_residue_of_recomputed_layers_matches_the_executor(kind, flash, layers):
    """W of a fully recomputed stage: each weight group's graph task re-runs the layer and keeps
    what its weightless ops saved until W ends, and the re-runs' copies of the later groups'
    inputs until those groups run (``costs.split_backward.w_recompute_residue``), beside the
    weight gradient (``weight_grad_working_bytes``). In the SwiGLU layer weightless nodes also
    keep the SiLU output (``mul``'s operand) and the residual (RMSNorm's ``pow`` and ``mul``), and
    the peak is the MLP-down task's re-run holding all the layer saves; in the GeLU layer it is
    that task's weight gradient. Derived to the byte on torch 2.13."""
    from parsim.costs.split_backward import w_recompute_residue, weight_grad_working_bytes

    spec = replace(load_model("tiny"), flash_attention=flash, **LAYER_KINDS[kind])
    plan = parse_plan("pp=2 mbs=1 recompute=full dtype=fp32")
    predicted = w_recompute_residue(spec, plan, layers) + weight_grad_working_bytes(spec, plan, False)
    assert predicted == pytest.approx(_measure_weight_pass(spec, layers), rel=0.01)


def test_weight_pass_residue_follows_the_explicit_cores_softmax_peak():
    """A long sequence with the explicit core: a W task's re-run peaks inside the core, where the
    scaled scores, the masked scores and the softmax output (three b a s^2 tensors) and GQA's
    unrepeated K and V are alive, above what the whole layer saves (``_rerun_peak``)."""
    from parsim.costs.split_backward import w_recompute_residue, weight_grad_working_bytes

    spec = replace(load_model("tiny"), flash_attention=False, seq_len=128)
    plan = parse_plan("pp=2 mbs=1 recompute=full dtype=fp32")
    predicted = w_recompute_residue(spec, plan, 1) + weight_grad_working_bytes(spec, plan, False)
    assert predicted == pytest.approx(_measure_weight_pass(spec, 1), rel=0.01)


@pytest.mark.parametrize("kind", list(LAYER_KINDS))
@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("layers", [1, 2])
def test_weight_pass_of_stored_layers_peaks_where_the_group_walk_says(kind, flash, layers):
    """W of a stage whose layers are stored: the groups run in order, each beside the previous
    one's weight gradient, after the earlier ones freed their output gradients and saved inputs
    (``split_backward.layer_weight_peak``), not the largest weight gradient on top of everything
    (which read a pp=4 ZB-H1 plan's middle ranks 2.5 % high)."""
    from parsim.costs.split_backward import weight_grad_working_bytes

    spec = replace(load_model("tiny"), flash_attention=flash, seq_len=128, **LAYER_KINDS[kind])
    plan = parse_plan("pp=2 mbs=1 dtype=fp32")
    measured = _measure_weight_pass(spec, layers, recompute=False)
    assert weight_grad_working_bytes(spec, plan, False) == pytest.approx(measured, rel=0.005)
