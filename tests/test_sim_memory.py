"""Two computations of one quantity: the peak memory the SimPy engine reads off its
allocation timeline, and the analytic ``parsim.costs.memory_by_stage``. They must agree
category by category (to float rounding: the timeline adds and subtracts the same byte
counts the analytic model multiplies) over a matrix of plans."""
import pytest

from parsim.costs import CATEGORIES, memory_by_stage
from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

PIPELINES = [("naive", 4, 1, 8), ("gpipe", 4, 1, 8), ("1f1b", 4, 1, 8), ("1f1b", 4, 1, 2), ("1f1b", 8, 1, 16),
             ("interleaved", 4, 2, 8), ("interleaved", 4, 2, 4), ("interleaved", 2, 3, 4), ("interleaved", 4, 2, 12)]
PLANS = [f"pp={pp} vpp={v} schedule={s} gbs={m} recompute={rc}"
         for s, pp, v, m in PIPELINES for rc in ("none", "full", "selective")] + [
    "tp=2 pp=2 gbs=8 sp=true",
    "tp=2 pp=2 gbs=8 sp=true recompute=selective",
    "tp=4 pp=2 gbs=8 recompute=full",
    "dp=2 pp=2 gbs=8 zero=1",
    "dp=2 pp=2 gbs=8 zero=2",
    "dp=2 pp=2 gbs=8 zero=3",
    "dp=2 pp=2 gbs=8 zero=2 offload=optimizer",
    "dp=2 pp=2 gbs=8 zero=3 offload=optimizer+params",
    "dp=2 tp=2 pp=2 gbs=8 zero=1 mbs=2 tp_overlap=subpipe",
    "pp=4 gbs=8 recompute=stage-aware recompute_layers=2,1,1,0",
    "pp=4 gbs=8 recompute=full shifted_critical_path=true",
    "pp=2 vpp=2 schedule=interleaved gbs=4 recompute=stage-aware recompute_layers=1,2,3,0",
    "pp=4 gbs=8 partition=5,7,7,5",
    "pp=4 gbs=8 dtype=fp32",
]


@pytest.mark.parametrize("model", ["gpt3-1.3b", "llama2-7b"])
@pytest.mark.parametrize("plan", PLANS)
def test_simulated_peak_memory_equals_the_analytic_model(model, plan):
    m, p = load_model(model), parse_plan(plan)
    if p.partition is not None and sum(p.partition) != m.layers:
        pytest.skip("partition written for 24 layers")
    r = simulate(m, f"a100-80g:{p.world_size}", p, record_events=False)
    analytic = memory_by_stage(m, p, load_cluster(f"a100-80g:{p.world_size}"))   # the same stack
    assert len(r.memory_by_stage) == len(analytic) == p.pp
    for sim, ref in zip(r.memory_by_stage, analytic):
        for c in CATEGORIES:
            assert sim[c] == pytest.approx(getattr(ref, c), rel=1e-9, abs=1.0), (sim["stage"], c)
        assert sim["total"] == pytest.approx(ref.total, rel=1e-9)
    assert r.peak_memory_bytes == pytest.approx(max(s.total for s in analytic), rel=1e-9)


def test_memory_timeline_starts_and_ends_with_the_model_states_only():
    r = simulate("gpt3-1.3b", "a100-80g:8", "dp=2 pp=4 gbs=16 zero=1")
    for rank, samples in r.memory_timeline.items():
        (t0, first), (t1, last) = samples[0], samples[-1]
        assert t0 == 0.0 and first["activations"] == 0.0
        assert last["activations"] == pytest.approx(0.0, abs=1.0)
        assert t1 <= r.step_time_s
        assert {k: first[k] for k in ("params", "grads", "optimizer")} == \
               {k: last[k] for k in ("params", "grads", "optimizer")}


def test_peak_is_the_largest_total_on_the_timeline():
    r = simulate("gpt3-1.3b", "a100-80g:4", "pp=4 gbs=8 schedule=gpipe recompute=full")
    for stage, (rank, samples) in zip(r.memory_by_stage, sorted(r.memory_timeline.items())):
        assert max(sum(b.values()) for _, b in samples) == pytest.approx(stage["total"], rel=1e-12)


def test_gpipe_holds_every_microbatch_and_1f1b_at_most_p_minus_rank():
    # Huang et al. 2019: GPipe stores all m microbatches; Narayanan et al. 2021 Sec. 2.2.1:
    # 1F1B stores at most p - i on rank i
    gpipe = simulate("gpt3-1.3b", "a100-80g:4", "pp=4 gbs=8 schedule=gpipe")
    ofob = simulate("gpt3-1.3b", "a100-80g:4", "pp=4 gbs=8 schedule=1f1b")
    # middle ranks carry neither the embedding nor the head: activations per microbatch are equal
    per_mb = gpipe.memory_by_stage[1]["activations"] / 8
    for i in (1, 2):
        assert ofob.memory_by_stage[i]["activations"] == pytest.approx((4 - i) * per_mb, rel=1e-12)


def test_fsdp2_memory_keeps_the_sharded_copy_under_zero2_and_the_layer_gradients_in_backward():
    """Profiles with zero_copies=fsdp2 (the executor's ZeRO-2/3): ZeRO-2 holds the gathered
    parameters plus the 1/dp sharded storage; a layer's backward adds 2 x its gradient bytes
    (unsharded gradients + reduce-scatter input), the loss's does not; ZeRO-3 keeps the root
    unit gathered. The SimPy timeline and the analytic model agree on it."""
    from dataclasses import replace

    from parsim.costs import layer_params, memory_by_stage, stage_params, state_bytes
    from parsim.costs.memory import (fsdp2_layer_only_bytes, fsdp2_post_backward, fsdp2_root_bytes,
                                     fsdp2_root_post_backward, gathered_bytes, rank_backward_working)
    from parsim.sim import simulate
    from parsim.specs import load_cluster, load_model, parse_plan

    model = load_model("cpu-small")
    base = load_cluster("cpu:2")
    fsdp = replace(base, device=replace(base.device, tables=base.device.tables.replace(zero_copies="fsdp2")))
    sb = state_bytes("fp32")
    for text in ("dp=2 gbs=4 zero=2 dtype=fp32", "dp=2 gbs=4 zero=3 dtype=fp32"):
        plan = parse_plan(text)
        plain, with_fsdp = memory_by_stage(model, plan, base)[0], memory_by_stage(model, plan, fsdp)[0]
        sharded = stage_params(model, plan)[0] * sb.param / 2 if plan.zero == 2 else 0.0
        assert with_fsdp.params - plain.params == pytest.approx(sharded)
        # FSDP2's term holds the layer's weight gradients, so the layer phase drops its own; they and
        # the reduce-scatter input meet at the layer's post-backward, its saved tensors freed by then;
        # ZeRO-3's second gathered layer is held by a layer's backward only
        post = fsdp2_post_backward(model, plan, [(model.layers, "none")], 2 * layer_params(model, 1) * sb.grad)
        ahead = fsdp2_layer_only_bytes(model, plan)
        assert 0 < post < 2 * layer_params(model, 1) * sb.grad and (ahead > 0) == (plan.zero == 3)
        root = fsdp2_root_bytes(model, plan, 0)
        assert (root > 0) == (plan.zero == 3)
        # the root unit (embedding, final norm, head: one stage here) keeps the head's gradient over
        # the layers' backward and reduce-scatters after the stage's last op, ZeRO-3 resharded by then
        roots = [fsdp2_root_post_backward(model, plan, 0, gathered_bytes(model, plan) - ahead + root, False)]
        assert roots[0][0] > 0
        fsdp_working = rank_backward_working(model, plan, 0, weight_grads=False, layer_extra=post + ahead, roots=roots)
        # tied embeddings on one stage: autograd's input buffer keeps the head's gradient for the
        # embedding's either way (``footprint.backward_working``), the root unit's moment on top
        assert fsdp_working >= rank_backward_working(model, plan, 0, weight_grads=False, layer_extra=post + ahead)
        untied = replace(model, tied_embeddings=False)        # here only FSDP2's root keeps it
        assert (rank_backward_working(untied, plan, 0, weight_grads=False, layer_extra=post + ahead, roots=roots)
                > rank_backward_working(untied, plan, 0, weight_grads=False, layer_extra=post + ahead))
        assert with_fsdp.other - plain.other == pytest.approx(fsdp_working - rank_backward_working(model, plan, 0)
                                                              + root - ahead)
        sim = simulate(model, fsdp, plan)
        assert sim.peak_memory_bytes == pytest.approx(with_fsdp.total, rel=1e-6)


@pytest.mark.parametrize("plan", ["pp=2 gbs=4 recompute=full dtype=fp32",
                                  "dp=2 pp=2 gbs=4 zero=1 recompute=full dtype=fp32",
                                  "dp=2 gbs=4 zero=2 dtype=fp32", "dp=2 gbs=4 zero=3 dtype=fp32"])
def test_the_optimizer_step_holds_its_temporaries_on_the_timeline_as_the_analytic_model_does(plan):
    """The executor's profile (torch stack: eager AdamW's two fp32 copies of the largest tensor;
    FSDP2 for ZeRO-2/3) and a wide vocabulary: the step after the last backward is the peak of
    the plans without FSDP2 (nothing in ``activations``); FSDP2's ZeRO-2 frees its gathered
    parameters first, so its step never is. The timeline holds the temporaries for the step
    only."""
    from dataclasses import replace
    model, p = replace(load_model("tiny"), vocab=32768), parse_plan(plan)
    cluster = load_cluster(f"cpu:{p.world_size}", profile="cpu-calibrated")
    r = simulate(model, cluster, p)
    analytic = memory_by_stage(model, p, cluster)
    for sim, ref in zip(r.memory_by_stage, analytic):
        for c in CATEGORIES:
            assert sim[c] == pytest.approx(getattr(ref, c), rel=1e-9, abs=1.0), (sim["stage"], c)
        assert (ref.activations == 0.0) == (p.zero < 2)
    for samples in r.memory_timeline.values():
        assert samples[-1][1]["other"] == pytest.approx(samples[0][1]["other"], abs=1.0)


@pytest.mark.parametrize("plan", ["dp=2 mbs=2 gbs=4 zero=2", "dp=2 mbs=2 gbs=4 zero=3", "dp=2 mbs=2 gbs=8 zero=3",
                                  "dp=2 pp=2 mbs=2 gbs=4 zero=3 schedule=1f1b",
                                  "dp=2 pp=2 mbs=2 gbs=4 zero=2 schedule=1f1b",
                                  "dp=2 pp=2 mbs=1 gbs=8 zero=2 schedule=1f1b",
                                  "dp=2 pp=2 vpp=2 mbs=1 gbs=8 zero=3 schedule=interleaved",
                                  "dp=2 pp=2 mbs=1 gbs=8 zero=3 schedule=zb-h1"])
def test_fsdp2_makes_its_gradient_shards_in_each_ranks_first_backward_in_both_engines(plan):
    """FSDP2: the gradient shards the states count exist only from a rank's first backward's
    reduce-scatters (``costs.unmade_grads``). The analytic moments take them off that backward
    (and the forwards before it), the SimPy timeline allocates them at its start; the two peaks
    agree, and the timeline starts with that many gradient bytes fewer than it ends with. A walked
    schedule with several microbatches keeps them all step (``first_backward_apart``)."""
    from dataclasses import replace

    from parsim.costs import unmade_grads

    model = replace(load_model("tiny"), flash_attention=True, layers=4, hidden=128, ffn_hidden=512, vocab=1024,
                    seq_len=64)
    p = parse_plan(plan + " dtype=bf16")
    cluster = load_cluster(f"cpu:{p.world_size}", profile="cpu-calibrated")     # FSDP2 on gloo, as the executor
    r = simulate(model, cluster, p)
    analytic = memory_by_stage(model, p, cluster)
    assert r.peak_memory_bytes == pytest.approx(max(s.total for s in analytic), rel=1e-9)
    unmade = [unmade_grads(model, p, k, True) for k in range(p.pp)]
    assert all(u > 0 for u in unmade) == (p.num_microbatches == 1 or p.schedule != "zb-h1")
    for rank, samples in r.memory_timeline.items():
        first, last = samples[0][1], samples[-1][1]
        assert last["grads"] - first["grads"] == pytest.approx(unmade[rank // (p.dp * p.tp)], abs=1.0)
