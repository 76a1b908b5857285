"""The zero-bubble family as plan values: rules, placement, the split-backward cost model, and the
SimPy engine, the analytic memory model and the partitioner agreeing on them."""
import pytest

from parsim.costs import CATEGORIES, layer_ops, memory_by_stage, stage_params
from parsim.costs.placement import rank_of_stage, stages_of_rank
from parsim.costs.split_backward import output_grad_bytes, overlapped_time, w_recomputes
from parsim.costs.timing import op_time
from parsim.schedules import build_schedule, dump_schedule_csv
from parsim.sim import simulate
from parsim.specs import SpecError, load_cluster, load_model, parse_plan, validate

NEW = ["zb-h1", "zb-h2", "interleaved-zb vpp=2", "zbv", "dualpipev", "looped-bfs vpp=2"]


def test_v_placed_schedules_default_to_two_stages_per_rank():
    assert parse_plan("pp=4 schedule=zbv").vpp == parse_plan("pp=4 schedule=dualpipev").vpp == 2
    assert parse_plan("pp=4 schedule=zb-h1").vpp == 1


@pytest.mark.parametrize("plan, field, words", [
    ("pp=4 gbs=6 schedule=dualpipev", "gbs", "2*pp=8"),
    ("pp=4 vpp=3 gbs=8 schedule=zbv", "vpp", "needs vpp=2"),
    ("pp=4 vpp=2 gbs=8 schedule=zb-h1", "vpp", "vpp > 1 needs"),
    ("pp=4 gbs=8 schedule=interleaved-zb", "vpp", "vpp >= 2"),
    ("pp=4 vpp=2 gbs=9 schedule=interleaved-zb", "gbs", "rounds"),
])
def test_zero_bubble_rules_name_the_field(plan, field, words):
    with pytest.raises(SpecError) as err:
        validate(load_model("gpt3-1.3b"), load_cluster("a100-80g:4"), parse_plan(plan))
    assert err.value.field == field and words in str(err.value)


def test_a_csv_schedule_is_a_plan_value_timed_like_the_generated_one(tmp_path):
    path = dump_schedule_csv(build_schedule("zbv", 4, 8, 2), tmp_path / "zbv.csv")
    model, cluster = load_model("gpt3-1.3b"), load_cluster("a100-80g:4")
    plan = parse_plan(f"pp=4 gbs=8 schedule=csv:{path}")
    assert plan.vpp == 2                                   # the file's stages per row
    from_file = simulate(model, cluster, plan, record_events=False)
    generated = simulate(model, cluster, parse_plan("pp=4 gbs=8 schedule=zbv"), record_events=False)
    assert from_file.step_time_s == pytest.approx(generated.step_time_s, rel=1e-12)
    assert from_file.peak_memory_bytes == pytest.approx(generated.peak_memory_bytes, rel=1e-12)


@pytest.mark.parametrize("plan, field", [("pp=2 gbs=8", "pp"), ("pp=4 vpp=1 gbs=8", "vpp"), ("pp=4 gbs=16", "gbs")])
def test_a_csv_schedule_must_match_the_plan(tmp_path, plan, field):
    path = dump_schedule_csv(build_schedule("zbv", 4, 8, 2), tmp_path / "zbv.csv")
    with pytest.raises(SpecError) as err:
        validate(load_model("gpt3-1.3b"), load_cluster(f"a100-80g:{parse_plan(plan).pp}"),
                 parse_plan(f"{plan} schedule=csv:{path}"))
    assert err.value.field == field and str(path) in str(err.value)


def test_v_placement_puts_both_ends_of_the_model_on_rank_0():
    model = load_model("gpt3-1.3b")
    v, loop = parse_plan("pp=4 gbs=8 schedule=zbv"), parse_plan("pp=4 vpp=2 gbs=8 schedule=interleaved")
    assert [stages_of_rank(v, r) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert rank_of_stage(v, 7) == 0 and rank_of_stage(loop, 7) == 3
    assert sum(stage_params(model, v)) == pytest.approx(sum(stage_params(model, loop)), rel=1e-12)
    assert stage_params(model, v)[0] > stage_params(model, loop)[0]      # embedding and head together


def test_input_and_weight_gradient_passes_add_up_to_the_backward():
    model, cluster, plan = load_model("llama2-7b"), load_cluster("a100-80g:8"), parse_plan("tp=2 gbs=2 mbs=2")
    for op in layer_ops(model, plan):
        i, w = (op_time(cluster.device, op, p, plan.dtype) for p in ("bwd_input", "bwd_weight"))
        assert i + w == pytest.approx(op_time(cluster.device, op, "bwd", plan.dtype), rel=1e-12)
        if op.kind != "gemm":
            assert w == 0.0 or op.grad_accumulation            # weightless backward belongs to I


def test_w_re_runs_a_recomputed_layer_once_per_weight_as_measured_on_the_executor():
    # executor layers, torch 2.13: 8 forward re-runs in W on the GPT layer, 9 on the Llama one
    assert w_recomputes(load_model("tiny")) == 8
    assert w_recomputes(load_model("llama2-7b")) == 9


@pytest.mark.parametrize("f, fc, b, bc", [(1.0, 0.0, 2.0, 0.0), (1.0, 0.5, 2.0, 0.3), (1.0, 3.0, 1.0, 0.1)])
def test_overlapped_slot_lies_between_the_longer_pass_and_both_passes(f, fc, b, bc):
    t = overlapped_time(f, fc, b, bc)
    assert max(f + fc, b + bc) <= t <= f + fc + b + bc
    assert t >= f + b                                      # compute does not overlap compute


def test_output_gradients_kept_for_w_follow_the_layer_shape():
    model = load_model("gpt3-1.3b")
    e, r, s, h = 2, 4, model.seq_len, model.hidden
    # 16-bit parameters: QKV 3h, attention-out h, MLP-up 4h, MLP-down h, two norms h each (t = 1);
    # the row-parallel biases' adds share their GEMMs' dY
    assert output_grad_bytes(model, parse_plan("gbs=1 stack=megatron-core")) == e * s * h * (3 + 1 + 4 + 1 + 2)
    # autocast (the executor): the norms and the two bias adds are fp32 (the residual stream's),
    # beside the GEMMs' 16-bit dYs
    assert output_grad_bytes(model, parse_plan("gbs=1 stack=torch")) == s * h * (e * (3 + 1 + 4 + 1) + r * (2 + 2))


@pytest.mark.parametrize("schedule", NEW)
@pytest.mark.parametrize("extra", ["", "recompute=full", "recompute=selective", "tp=2 sp=true", "dp=2 zero=1"])
def test_simulated_peak_memory_equals_the_analytic_model(schedule, extra):
    m, p = load_model("gpt3-1.3b"), parse_plan(f"pp=4 gbs={8 * (2 if 'dp=2' in extra else 1)} "
                                               f"schedule={schedule} {extra}")
    r = simulate(m, f"a100-80g:{p.world_size}", p, record_events=False)
    analytic = memory_by_stage(m, p, load_cluster(f"a100-80g:{p.world_size}"))   # the same stack
    for sim, ref in zip(r.memory_by_stage, analytic):
        for c in CATEGORIES:
            assert sim[c] == pytest.approx(getattr(ref, c), rel=1e-9, abs=1.0), (sim["stage"], c)


def test_the_first_stage_runs_its_whole_backward_as_w():
    r = simulate("gpt3-1.3b", "a100-80g:2", "pp=2 gbs=4 schedule=zb-h1", record_events=True)
    events = [e for e in r.trace.events if e.stream == "compute" and e.layer == -1]
    first_i = [e.end - e.start for e in events if e.stage == 0 and e.kind == "I"]
    first_w = [e.end - e.start for e in events if e.stage == 0 and e.kind == "W"]
    later_i = [e.end - e.start for e in events if e.stage == 1 and e.kind == "I"]
    assert max(first_i) == 0.0 and min(first_w) > 0.0 and min(later_i) > 0.0


@pytest.mark.parametrize("schedule", ["zb-h1", "zbv", "dualpipev"])
def test_partitioner_times_split_schedules_close_to_the_simpy_engine(schedule):
    from parsim.partition import partition
    from parsim.specs import load_model as lm
    res = partition(lm("gpt3-2.7b"), parse_plan(f"dp=2 pp=4 gbs=64 schedule={schedule}"), "a100-80g:8")
    plan = parse_plan(f"dp=2 pp=4 gbs=64 schedule={schedule} partition={','.join(map(str, res.partition))}")
    sim = simulate("gpt3-2.7b", "a100-80g:8", plan, record_events=False)
    assert res.step_time_s == pytest.approx(sim.step_time_s, rel=0.03)


@pytest.mark.parametrize("schedule", NEW)
@pytest.mark.parametrize("base", ["pp=2 gbs=8", "tp=2 pp=2 gbs=8 sp=true"])
def test_every_new_schedule_runs_on_a_host_whose_cores_the_ranks_share(schedule, base):
    # the CPU validation target: processor sharing prices each action solo, an overlapped slot
    # under its (forward, backward) stages (this raised for DualPipeV before)
    model, plan = load_model("cpu-small"), parse_plan(f"{base} schedule={schedule} dtype=fp32")
    cluster = load_cluster(f"cpu:{plan.world_size}", profile="cpu-calibrated")
    result = simulate(model, cluster, plan, mode="full", record_events=False)
    one = simulate(model, cluster, parse_plan(f"{base} schedule=1f1b dtype=fp32"), mode="full", record_events=False)
    # the same work in every schedule: a lower bubble, and a step that gains at most 1F1B's
    # bubble (3 % slack: a split backward's W runs in other slots) and loses at most a tenth
    assert 0 <= result.bubble_fraction <= one.bubble_fraction
    assert one.step_time_s * (1 - one.bubble_fraction) * 0.97 <= result.step_time_s <= one.step_time_s * 1.1


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "zbv", "dualpipev"])
def test_zero3_gathers_and_scatters_every_unit_alike_whether_the_backward_is_split(schedule):
    """ZeRO-3 under a split backward: I gathers its layers and its root unit (the head's input
    gradient needs its weight), W reduce-scatters them; the first stage's W is its whole
    backward, so it gathers too; an overlapped slot (DualPipeV) gathers both passes' units and
    reduce-scatters its backward's layers. Per microbatch every rank gathers each of its layers
    twice (forward and backward) and its root units' bytes twice, and reduce-scatters each
    once, as 1F1B does (before, a split backward skipped the first stage's gathers and every
    root unit's backward gather and reduce-scatter, and DualPipeV's overlapped slots two
    thirds of the layers' reduce-scatters)."""
    model, cluster = load_model("gpt3-1.3b"), load_cluster("a100-80g:8")
    m = 8
    plan = parse_plan(f"dp=2 pp=4 gbs={2 * m} zero=3 schedule={schedule}")
    r = simulate(model, cluster, plan)
    per_rank = model.layers // plan.pp
    for rank in (0, 2, 4, 6):            # dp rank 0 of each pipeline rank
        events = [e for e in r.trace.events if e.rank == rank and e.stream == "dp"]

        def count(kind, root):
            return sum(1 for e in events if e.kind == kind and (e.layer < 0) == root)

        def nbytes(kind):
            return sum(e.bytes for e in events if e.kind == kind and e.layer < 0)
        assert count("zero_allgather", False) == 2 * m * per_rank, (schedule, rank)
        assert count("zero_reducescatter", False) == m * per_rank, (schedule, rank)
        # the root units' bytes (one collective may carry an overlapped slot's two units)
        assert nbytes("zero_allgather") == pytest.approx(2 * nbytes("zero_reducescatter")
                                                         * r_param_over_grad(plan)), (schedule, rank)
        assert (nbytes("zero_reducescatter") > 0) == (rank == 0 or (rank == 6 and schedule not in ("zbv", "dualpipev"))), \
            (schedule, rank)


def r_param_over_grad(plan) -> float:
    """Bytes of a parameter over bytes of its gradient in the plan's dtype (both 2 in bf16)."""
    from parsim.costs import state_bytes
    sb = state_bytes(plan.dtype)
    return sb.param / sb.grad
