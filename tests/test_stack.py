"""The software stack as a plan key (issue 19): presets, profile numbers, what each changes."""
import json
from dataclasses import replace

import pytest

from parsim.costs import fits, memory_by_stage, p2p_bytes, stage_params
from parsim.costs.stack import apply_stack, resolve_stack
from parsim.fast import PlanTable, evaluate
from parsim.sim import simulate
from parsim.specs import ModelSpec, Plan, SpecError, load_cluster, load_model, parse_plan
from parsim.specs.stack import STACKS, get_stack, stacks_from_dict, stacks_to_dict


def test_plan_key_stack_accepts_the_presets_and_auto_and_names_what_is_allowed():
    assert parse_plan("dp=2 stack=fsdp1").stack == "fsdp1"
    assert parse_plan("dp=2").stack == "auto"
    assert "stack=" not in Plan().to_string()
    with pytest.raises(SpecError, match="stack='fsdp9'.*one of auto, torch, megatron-core"):
        parse_plan("stack=fsdp9")


def test_auto_is_the_profiles_default_stack_and_torch_without_one():
    gpu, cpu = load_cluster("a100-80g:8"), load_cluster("cpu:2")
    assert resolve_stack(gpu, "auto").name == gpu.device.default_stack == "megatron-core"
    assert resolve_stack(cpu, "auto").name == "torch"


def test_the_torch_stack_leaves_the_profile_as_it_is():
    c = load_cluster("cpu:2")
    m, eff, plan = apply_stack(load_model("cpu-small"), c, Plan(dp=2))
    assert (eff.device.gemm, eff.device.attention_efficiency, eff.device.kernel_overhead_s,
            eff.device.usable_memory_fraction) == (c.device.gemm, c.device.attention_efficiency,
                                                   c.device.kernel_overhead_s, c.device.usable_memory_fraction)
    assert plan.stack == "torch" and plan.dp_overlap


def test_megatron_lm_2021_runs_unfused_attention_and_reduces_gradients_after_the_flush():
    m, c, plan = apply_stack(load_model("llama3-8b"), load_cluster("a100-80g:8"), Plan(dp=8, stack="megatron-lm"))
    assert m.flash_attention is False and plan.dp_overlap is False
    assert c.device.gemm.max_efficiency == pytest.approx(0.86 * c.device.stack.gemm_efficiency)


def test_eager_unfused_attention_pays_its_scale_and_mask_passes_and_a_fused_softmax_does_not():
    from parsim.costs.ops import layer_ops
    from parsim.costs.timing import op_time
    m = load_model("studies/validation_cpu/heldout/model_deep.yaml")      # unfused attention
    plan = Plan(mbs=2, dtype="fp32")
    ops = {op.name: op for op in layer_ops(m, plan)}
    scores = 2 * (m.heads * m.seq_len ** 2) * 4 * 2.0                      # b a s^2 fp32, read + write
    assert ops["attn_scale"].fwd_bytes == ops["attn_mask"].bwd_bytes == pytest.approx(scores)
    assert ops["attn_scale"].attention_core                                 # selective recompute drops it
    assert not {"attn_scale", "attn_mask"} & {op.name for op in layer_ops(m, replace(plan, stack="megatron-lm"))}
    assert not {"attn_scale", "attn_mask"} & {op.name for op in layer_ops(replace(m, flash_attention=True), plan)}
    # the gradient's pass streams the same bytes through the same kind of kernel as the forward:
    # the residual add's forward fit, not its backward (which only passes a gradient on)
    from parsim.specs.surfaces import MemboundFit
    dev = load_cluster("cpu:2").device
    add = MemboundFit(fwd=(5e-6, 1e-10), bwd=(2e-5, 0.0))
    dev = replace(dev, tables=dev.tables.replace(membound_surface={"residual_add": add}, layer_composition=None))
    assert op_time(dev, ops["attn_mask"], "bwd", "fp32") == op_time(dev, ops["attn_mask"], "fwd", "fp32")
    assert op_time(dev, ops["attn_mask"], "fwd", "fp32") == pytest.approx(5e-6 + 1e-10 * scores)
    assert op_time(dev, ops["attn_residual"], "bwd", "fp32") == pytest.approx(2e-5)


def test_deepspeed_pipeline_sends_the_whole_activation_from_every_tp_rank():
    m = load_model("gpt3-13b")
    megatron, deepspeed = Plan(tp=4, pp=2, stack="megatron-lm"), Plan(tp=4, pp=2, stack="megatron-deepspeed")
    assert p2p_bytes(m, deepspeed) == pytest.approx(4 * p2p_bytes(m, megatron))


def test_a_fused_bf16_loss_keeps_half_the_logit_bytes_of_torchs_fp32_loss():
    # LayerNorm: the two stacks' RMSNorm kernels keep different bytes (``Stack.eager_rmsnorm``)
    m, c = replace(load_model("llama3-8b"), norm="layernorm"), load_cluster("h100-sxm:8")
    torch_last = memory_by_stage(m, Plan(pp=8, gbs=8, stack="fsdp2"), c)[-1].activations
    fused_last = memory_by_stage(m, Plan(pp=8, gbs=8, stack="fsdp1"), c)[-1].activations
    logits = 8192 * 128256                             # one microbatch's logits on the last stage
    assert torch_last - fused_last == pytest.approx(2 * logits, rel=0.02)


def test_fsdp_keeps_fp32_shards_as_master_weights_16_bytes_per_parameter():
    m, c = load_model("llama3-8b"), load_cluster("h100-sxm:8")
    fsdp = memory_by_stage(m, Plan(dp=8, zero=3, gbs=8, stack="fsdp2"), c)[0]
    core = memory_by_stage(m, Plan(dp=8, zero=3, gbs=8, stack="megatron-core"), c)[0]
    assert (fsdp.params + fsdp.grads + fsdp.optimizer) / (core.params + core.grads + core.optimizer) == \
        pytest.approx(16 / 18, rel=1e-6)


def test_deepspeeds_bf16_optimizer_keeps_bf16_gradients_beside_its_fp32_buffer():
    m, c = load_model("gpt3-13b"), load_cluster("a100-80g:8")
    for dtype, zero, extra in (("bf16", 1, 2.0), ("bf16", 0, 2.0), ("fp16", 1, 0.0), ("bf16", 2, 0.0)):
        plan = Plan(dp=2, tp=4, zero=zero, dtype=dtype, gbs=4)
        ds = memory_by_stage(m, plan.replace(stack="megatron-deepspeed"), c)[0].grads
        mlm = memory_by_stage(m, plan.replace(stack="megatron-lm"), c)[0].grads
        n = stage_params(m, plan)[0]                   # parameters on the device, not sharded
        assert ds - mlm == pytest.approx(extra * n, rel=1e-12), (dtype, zero)


def test_profile_stack_numbers_are_checked_with_a_message_naming_the_field():
    with pytest.raises(SpecError, match="gemm_eficiency"):
        stacks_from_dict({"fsdp1": {"gemm_eficiency": 0.9}})
    with pytest.raises(SpecError, match="one of"):
        stacks_from_dict({"fsdp9": {}})
    assert stacks_from_dict({"fsdp1": {"gemm_efficiency": 0.9}})["fsdp1"].gemm_efficiency == 0.9
    assert set(STACKS) >= {"torch", "megatron-core", "megatron-lm", "megatron-deepspeed", "deepspeed", "fsdp1", "fsdp2"}


@pytest.mark.parametrize("plan", ["dp=8 gbs=32 zero=3 stack=fsdp1", "dp=8 gbs=32 zero=3 stack=deepspeed",
                                  "tp=4 pp=2 gbs=16 stack=megatron-lm recompute=full",
                                  "tp=2 pp=4 gbs=16 stack=megatron-deepspeed", "dp=2 tp=4 gbs=16 stack=megatron-core",
                                  "tp=2 pp=4 gbs=16 schedule=zb-h1 stack=megatron-core",
                                  "tp=2 pp=4 gbs=64 schedule=zbv stack=megatron-core",
                                  "tp=2 pp=4 gbs=64 schedule=dualpipev stack=megatron-core"])
def test_fast_path_and_simpy_agree_under_each_stack(plan):
    """Every stack term reaches both engines through costs: step within 3 % (5 % where NCCL
    slows ZeRO-3 compute: the fast path charges slowdown x min(compute, collective) per layer,
    the SimPy engine the compute each collective actually overlapped), memory 0.1 %. The
    zero-bubble schedules too: a split backward's I hides no TP collective behind a
    weight-gradient GEMM in either engine (``fast.tables`` L_TP_COVER)."""
    model, cluster = load_model("gpt3-2.7b"), load_cluster("a100-80g:8")
    p = parse_plan(plan)
    fast = evaluate(model, cluster, PlanTable.from_plans([p]))
    sim = simulate(model, cluster, p, record_events=False)
    slowed = "zero=3" in plan and cluster.device.stacks.get(p.stack, get_stack(p.stack)).comm_compute_slowdown > 0
    assert fast.step_time_s[0] == pytest.approx(sim.step_time_s, rel=0.05 if slowed else 0.03)
    assert fast.peak_memory_bytes[0] == pytest.approx(sim.peak_memory_bytes, rel=1e-3)
    assert bool(fast.fits()[0]) == sim.fits == fits(model, p, cluster)


def test_nccl_on_the_sms_slows_the_compute_a_zero3_gather_overlaps():
    model, cluster = load_model("gpt3-2.7b"), load_cluster("a100-80g:8")
    p = Plan(dp=8, gbs=32, zero=3, stack="deepspeed")
    slow = evaluate(model, cluster, PlanTable.from_plans([p])).step_time_s[0]
    stack = get_stack("deepspeed").with_values({"comm_compute_slowdown": 0.0})
    from dataclasses import replace
    quiet = replace(cluster, device=replace(cluster.device, stacks={**cluster.device.stacks, "deepspeed": stack}))
    assert evaluate(model, quiet, PlanTable.from_plans([p])).step_time_s[0] < slow


def test_simulate_json_names_the_stack_it_ran_and_the_plan_as_given(capsys):
    from parsim.cli import main
    for cluster, plan, stack in (("a100-80g:8", "dp=8 stack=fsdp1", "fsdp1"), ("a100-80g:8", "dp=8", "megatron-core"),
                                 ("cpu:2", "dp=2 dtype=fp32", "torch")):
        assert main(["simulate", "--model", "gpt3-125m", "--cluster", cluster, "--plan", plan, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["stack"] == stack
        assert out["plan"] == parse_plan(plan).to_string()      # auto stays auto: the user's plan


def test_a_profile_may_refine_only_a_stacks_per_gpu_numbers():
    # the software's facts (what it keeps, sends, overlaps) are the preset's: the rules that
    # see only the plan read them there (specs.plan_stack)
    with pytest.raises(SpecError, match="fp32_shards.*per-GPU numbers are gemm_efficiency"):
        stacks_from_dict({"fsdp2": {"fp32_shards": False}})
    with pytest.raises(SpecError, match="non-negative number"):
        stacks_from_dict({"fsdp1": {"op_overhead_s": -1e-6}})
    refined = stacks_from_dict({"fsdp1": {"op_overhead_s": 1e-4, "gemm_efficiency": 0.9}})
    assert stacks_to_dict(refined) == {"fsdp1": {"gemm_efficiency": 0.9, "op_overhead_s": 1e-4}}


def test_a_shipped_profile_reads_its_default_stack_and_numbers():
    dev = load_cluster("a100-80g:8").device
    assert dev.default_stack == "megatron-core" and dev.stack is None
    assert dev.stacks["megatron-deepspeed"].memory_reserve_bytes > 0
    assert load_cluster("cpu-calibrated:2").device.default_stack == "torch"


def test_the_partitioner_prices_stage_memory_under_the_stack_as_memory_by_stage_does():
    from parsim.partition import partition
    model = ModelSpec(name="m", layers=12, hidden=1024, heads=16, vocab=51200, seq_len=1024)
    cluster = load_cluster("a100-80g:4")
    for stack in ("fsdp2", "deepspeed", "megatron-core"):
        plan = Plan(dp=2, pp=2, mbs=2, gbs=16, zero=3, stack=stack)
        result = partition(model, plan, cluster, graph="analytic")
        expected = memory_by_stage(model, plan.replace(partition=result.partition), cluster)
        assert [s.memory_bytes for s in result.stages] == pytest.approx([m.total for m in expected], rel=1e-12)
        assert result.plan == plan.to_string()


def test_memory_on_a_model_without_stack_facts_is_unchanged_for_the_executor_stack():
    m = ModelSpec(name="x", layers=4, hidden=256, heads=4, vocab=1000, seq_len=64)
    a = memory_by_stage(m, Plan(pp=2, gbs=4), load_cluster("cpu:2"))
    b = memory_by_stage(m, Plan(pp=2, gbs=4, stack="torch"), load_cluster("cpu:2"))
    assert [s.total for s in a] == [s.total for s in b]


def test_a_straggler_under_async_tp_backward_slows_its_group_and_does_not_deadlock():
    """megatron-core hides backward TP collectives behind the weight-gradient GEMM; the hidden
    part is one number for the TP group, so a straggler still joins every collective."""
    model, cluster = load_model("gpt3-350m"), load_cluster("h100-sxm:8")
    plan = parse_plan("tp=4 pp=2 mbs=1 gbs=8 schedule=1f1b stack=megatron-core")
    base = simulate(model, cluster, plan, mode="full", record_events=False)
    slow = simulate(model, cluster, plan, mode="full", slowdown={7: 1.5}, record_events=False)
    assert base.exposed_comm_s["tp"] < simulate(model, cluster, plan.replace(stack="megatron-lm-2021"), mode="full",
                                                record_events=False).exposed_comm_s["tp"]
    # rank 7 (last stage) computes 1.5x slower: the step grows, by less than 1.5x
    assert base.step_time_s * 1.05 < slow.step_time_s < base.step_time_s * 1.5


def test_deepspeeds_gradient_accumulation_is_priced_as_its_own_memory_bound_kernels():
    """Under DeepSpeed's engine gradients add up outside the wgrad GEMM: autograd's
    ``.grad += new`` (3 x 2 bytes a parameter in fp16) or, with its BF16 optimizer, a cast and
    an fp32 add per microbatch (18 bytes); Megatron-LM fuses it (nothing on a GPU). Both
    engines charge the same seconds: the BF16 optimizer's 12 bytes a parameter more than fp16
    over every microbatch's layers, at the profile's memory-bound rate."""
    from parsim.costs.ops import grad_accumulation_bytes
    from parsim.costs.params import embedding_params, layer_params
    from parsim.costs.timing import membound_time

    assert grad_accumulation_bytes(parse_plan("dp=2 stack=megatron-deepspeed dtype=bf16 zero=1")) == (18.0, True)
    assert grad_accumulation_bytes(parse_plan("dp=2 stack=megatron-deepspeed dtype=fp16 zero=1")) == (6.0, True)
    assert grad_accumulation_bytes(parse_plan("dp=2 stack=megatron-deepspeed dtype=bf16 zero=2"))[1] is False
    assert grad_accumulation_bytes(parse_plan("dp=2 stack=megatron-lm dtype=bf16"))[1] is False
    model, cluster = load_model("gpt3-1.3b"), load_cluster("a100-80g:8")
    base = "dp=1 tp=1 pp=8 mbs=1 gbs=16 schedule=1f1b recompute=full stack=megatron-deepspeed"
    steps = {"fast": {}, "sim": {}}
    for dtype in ("bf16", "fp16"):
        plan = parse_plan(f"{base} dtype={dtype}")
        steps["fast"][dtype] = evaluate(model, cluster, PlanTable.from_plans([plan])).step_time_s[0]
        steps["sim"][dtype] = simulate(model, cluster, plan, record_events=False).step_time_s
    # each microbatch's backward on a stage's 3 layers is longer by 12 bytes a parameter at the
    # memory-bound rate; 1F1B's step holds 16 + 7 backwards of its slowest stage (at least a
    # middle one's, at most the first one's with the embedding's gradients too), in both engines
    middle = 3 * layer_params(model, 1)
    first = middle + embedding_params(model, parse_plan(base))
    extras = {engine: s["bf16"] - s["fp16"] for engine, s in steps.items()}
    assert extras["fast"] == pytest.approx(extras["sim"], rel=0.05)
    extra = extras["sim"]
    assert (16 + 7) * membound_time(cluster.device, 12.0 * middle) <= extra
    assert extra <= (16 + 7) * membound_time(cluster.device, 12.0 * first) * 1.01
    megatron = parse_plan(base.replace("megatron-deepspeed", "megatron-lm") + " dtype=bf16")
    sim_m = simulate(model, cluster, megatron, record_events=False).step_time_s
    # Megatron-LM fuses it: its bf16 and fp16 steps differ by a tenth of that at most
    assert abs(simulate(model, cluster, replace(megatron, dtype="fp16"), record_events=False).step_time_s - sim_m) \
        < 0.1 * extra


def test_eager_llama_ops_move_the_bytes_of_their_chains_and_fused_ones_their_tensors_once():
    """FSDP1 (HF's Llama modules) runs RMSNorm, SwiGLU and RoPE as chains of eager ops; Megatron-Core
    fuses each. On a GPU priced from its datasheet the chain's seconds are ``EAGER_TRAFFIC`` x the
    fused kernel's bytes at the streaming rate; the op list and its nominal bytes are the same."""
    from parsim.costs.ops import EAGER_TRAFFIC, layer_ops
    from parsim.costs.timing import op_time
    model = load_model("llama3-8b")
    runs = {}
    for stack in ("fsdp1", "megatron-core", "fsdp2"):
        m, c, plan = apply_stack(model, load_cluster("a100-80g:8"), Plan(dp=8, stack=stack))
        runs[stack] = (c.device, {op.name: op for op in layer_ops(m, plan)})
    dev, eager = runs["fsdp1"]
    fused_dev, fused = runs["megatron-core"]
    rate = dev.memory_bandwidth * dev.membound_efficiency
    for name, chain in (("input_norm", "rmsnorm"), ("swiglu", "swiglu"), ("rope", "rope")):
        assert eager[name].fwd_bytes == fused[name].fwd_bytes and eager[name].bwd_bytes == fused[name].bwd_bytes
        fwd, bwd = EAGER_TRAFFIC[chain]
        assert op_time(dev, eager[name], "fwd", "bf16") - dev.kernel_overhead_s == pytest.approx(
            fwd * eager[name].fwd_bytes / rate)
        assert op_time(dev, eager[name], "bwd", "bf16") - dev.kernel_overhead_s == pytest.approx(
            bwd * eager[name].bwd_bytes / rate)
        assert op_time(fused_dev, fused[name], "fwd", "bf16") - fused_dev.kernel_overhead_s == pytest.approx(
            fused[name].fwd_bytes / rate)
    # torchtitan's nn.RMSNorm is F.rms_norm: one fused kernel on CUDA; its SwiGLU and RoPE are eager
    assert runs["fsdp2"][1]["input_norm"].traffic == (1.0, 1.0)
    assert runs["fsdp2"][1]["rope"].traffic == EAGER_TRAFFIC["rope"]
    # q and k, read and written once each way by the fused kernel
    assert fused["rope"].fwd_bytes == fused["rope"].bwd_bytes == 2 * 2 * 8192 * (4096 + 1024)


def test_rope_is_an_op_only_of_rotary_models_and_a_calibrated_composition_holds_it():
    """RoPE is priced where the model rotates q and k (not learned positions, not ALiBi's in-kernel
    bias: position "none"); a calibrated CPU profile never timed it alone, its layer-composition
    terms (fitted over synthetic stages that ran it) hold it: 0 s wherever memory-bound ops are
    priced from measurements, in the fit of those terms as in every prediction after it."""
    from parsim.costs.ops import layer_ops
    from parsim.costs.timing import op_time
    llama = load_model("llama3-8b")
    assert "rope" in {op.name for op in layer_ops(llama, Plan())}
    for position in ("learned", "none"):
        assert "rope" not in {op.name for op in layer_ops(replace(llama, position=position), Plan())}
    rope = next(op for op in layer_ops(llama, Plan()) if op.name == "rope")
    calibrated = load_cluster("cpu:2", profile="tests/fixtures/cpu-calibrated.yaml").device
    assert calibrated.tables.membound and calibrated.tables.layer_composition is not None
    assert op_time(calibrated, rope, "fwd", "fp32") == op_time(calibrated, rope, "bwd", "fp32") == 0.0
    assert op_time(load_cluster("cpu:2").device, rope, "fwd", "fp32") > 0
    with pytest.raises(SpecError, match="model.position"):
        replace(llama, position="alibi")


def test_the_eager_traffic_multiples_are_what_the_chains_move_counted_op_by_op():
    """``EAGER_TRAFFIC`` is read off studies/public_record/eager_kernels.py: the aten ops of HF's
    RMSNorm, silu(gate) * up and the two Llama RoPEs, forward and backward, counted under a
    TorchDispatchMode, against the fused kernel's bytes."""
    pytest.importorskip("torch")
    import importlib.util
    from pathlib import Path

    from parsim.costs.ops import EAGER_TRAFFIC
    path = Path(__file__).resolve().parents[1] / "studies" / "public_record" / "eager_kernels.py"
    spec = importlib.util.spec_from_file_location("eager_kernels", path)
    ek = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ek)
    rows = {row[1]: row for row in ek.measure()}
    norm, glu = rows["HF LlamaRMSNorm"], rows["silu(gate) * up"]
    assert (norm[4], norm[7]) == pytest.approx(EAGER_TRAFFIC["rmsnorm"], rel=0.02)
    assert (glu[4], glu[7]) == pytest.approx(EAGER_TRAFFIC["swiglu"], rel=0.02) and glu[5] == 3
    assert rows["F.layer_norm (one kernel)"][4] == pytest.approx(1.0, rel=0.02)     # one kernel: the fused bytes
    rope = [rows["torchtitan complex"], rows["HF rotate_half"]]
    fwd, bwd = EAGER_TRAFFIC["rope"]
    assert all(r[4] == pytest.approx(fwd, rel=0.02) for r in rope)
    assert min(r[7] for r in rope) <= bwd <= max(r[7] for r in rope)


def test_transformer_engine_runs_cudnn_attention_where_the_profile_rates_it_and_sdpa_flash():
    # Hopper profiles state cuDNN's fused-attention rate: Megatron-Core (TE) runs it there, the
    # SDPA / Triton stacks their flash kernels; on the A100 TE runs FlashAttention-2 (no rate)
    model = load_model("llama3-8b")
    plan = parse_plan("dp=8 gbs=16")
    h100, a100 = load_cluster("h100-sxm:8"), load_cluster("a100-80g:8")
    cudnn, flash = h100.device.cudnn_attention_efficiency, h100.device.attention_efficiency
    assert cudnn > flash > 0 and a100.device.cudnn_attention_efficiency == 0
    rate = {s: apply_stack(model, h100, plan.replace(stack=s))[1].device.attention_efficiency
            for s in ("megatron-core", "fsdp2", "fsdp1")}
    assert rate["megatron-core"] == pytest.approx(cudnn)
    assert rate["fsdp2"] == pytest.approx(flash)
    assert rate["fsdp1"] == pytest.approx(flash * h100.device.stacks["fsdp1"].attention_efficiency)
    on_a100 = apply_stack(model, a100, plan.replace(stack="megatron-core"))[1].device.attention_efficiency
    assert on_a100 == pytest.approx(a100.device.attention_efficiency)
    # the step moves by the attention's share: faster, by less than the rate's ratio
    steps = {r: simulate(model, replace(h100, device=replace(h100.device, cudnn_attention_efficiency=r)),
                         plan.replace(stack="megatron-core")).step_time_s for r in (flash, cudnn)}
    assert steps[flash] / cudnn * flash < steps[cudnn] < 0.99 * steps[flash]


def test_a_profiles_cudnn_attention_rate_is_checked_with_a_message_naming_it():
    from parsim.specs.profile_parse import device_from_dict
    dev = {"peak_flops": {"bf16": 1e15}, "memory_bytes": 8e10, "memory_bandwidth": 3e12}
    assert device_from_dict({**dev, "cudnn_attention_efficiency": 0.5}).cudnn_attention_efficiency == 0.5
    with pytest.raises(SpecError, match="cudnn_attention_efficiency"):
        device_from_dict({**dev, "cudnn_attention_efficiency": -0.1})
