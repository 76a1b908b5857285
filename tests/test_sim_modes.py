"""Representative ranks vs every device, stragglers, and what a SimResult carries."""
import pytest

from parsim.schedules import build_schedule
from parsim.sim import simulate
from parsim.specs import RankLayout, SpecError, parse_plan
from parsim.trace.metrics import exposed_comm

SMALL_PLANS = [
    ("gpt3-1.3b", "a100-80g:8", "dp=2 pp=4 gbs=16"),
    ("gpt3-1.3b", "a100-80g:8", "dp=4 pp=2 gbs=16 zero=1"),
    ("gpt3-1.3b", "a100-80g:8", "dp=2 tp=2 pp=2 gbs=16"),
    ("gpt3-1.3b", "a100-80g:8", "dp=2 tp=2 pp=2 gbs=16 mbs=2 tp_overlap=subpipe sp=true"),
    ("gpt3-1.3b", "a100-80g:8", "tp=2 pp=4 gbs=8 schedule=interleaved vpp=2 recompute=full"),
    ("gpt3-1.3b", "a100-80g:8", "dp=8 gbs=16 zero=3"),
    ("gpt3-1.3b", "a100-80g:8", "dp=8 gbs=16 zero=2 offload=optimizer"),
    ("gpt3-1.3b", "a100-80g:8", "dp=4 pp=2 gbs=8 dp_impl=ps"),
    ("gpt3-1.3b", "a100-80g:16", "dp=2 tp=4 pp=2 gbs=8 schedule=gpipe"),
]


@pytest.mark.parametrize("model, cluster, plan", SMALL_PLANS)
def test_full_mode_without_slowdown_gives_the_representative_step_time(model, cluster, plan):
    rep = simulate(model, cluster, plan)
    full = simulate(model, cluster, plan, mode="full")
    assert len(full.simulated_ranks) == parse_plan(plan).world_size
    assert full.step_time_s == pytest.approx(rep.step_time_s, rel=1e-9)
    assert full.peak_memory_bytes == pytest.approx(rep.peak_memory_bytes, rel=1e-12)
    for k in ("tp", "dp", "pp"):
        assert full.exposed_comm_s[k] == pytest.approx(rep.exposed_comm_s[k], rel=1e-9, abs=1e-12)


def test_a_straggler_in_a_dp_group_slows_the_whole_step():
    base = simulate("gpt3-1.3b", "a100-80g:8", "dp=2 pp=4 gbs=16", mode="full")
    layout = RankLayout(dp=2, tp=1, pp=4)
    straggler = layout.rank(2, 1, 0)
    slow = simulate("gpt3-1.3b", "a100-80g:8", "dp=2 pp=4 gbs=16", mode="full", slowdown={straggler: 1.5})
    assert slow.step_time_s > 1.1 * base.step_time_s
    # its DP peer finishes its backward early and waits at the gradient all-reduce
    peer = layout.rank(2, 0, 0)
    assert slow.exposed_comm_s["dp"] > base.exposed_comm_s["dp"]
    peer_sync = [e for e in slow.trace.events if e.rank == peer and e.kind == "dp_allreduce"]
    mine_sync = [e for e in slow.trace.events if e.rank == straggler and e.kind == "dp_allreduce"]
    assert [(e.start, e.end) for e in peer_sync] == [(e.start, e.end) for e in mine_sync]


def test_a_straggler_in_a_tp_group_holds_its_peers_at_every_collective():
    plan = "tp=2 pp=2 gbs=8"
    base = simulate("gpt3-1.3b", "a100-80g:4", plan, mode="full")
    slow = simulate("gpt3-1.3b", "a100-80g:4", plan, mode="full", slowdown={1: 1.5})
    assert slow.step_time_s > 1.2 * base.step_time_s   # compute 1.5x; communication unchanged
    # rank 0, its TP peer, is not slowed itself but waits for rank 1 at every collective: its
    # actions last about as long as the straggler's (all but the compute after the last one)
    peer_base = sum(e.duration for e in base.trace.action_events(0))
    peer_slow = sum(e.duration for e in slow.trace.action_events(0))
    straggler = sum(e.duration for e in slow.trace.action_events(1))
    assert peer_slow > 1.4 * peer_base
    assert peer_slow == pytest.approx(straggler, rel=0.02)


@pytest.mark.parametrize("kwargs, field", [
    ({"mode": "everything"}, "mode"),
    ({"slowdown": {3: 1.5}}, "slowdown"),                      # needs mode=full
    ({"mode": "full", "slowdown": {99: 1.5}}, "slowdown"),     # no such rank
    ({"mode": "full", "slowdown": {3: 0.0}}, "slowdown"),      # not a positive factor
    ({"schedule": build_schedule("gpipe", 2, 8)}, "schedule"),  # does not match the plan
])
def test_bad_engine_arguments_raise_a_spec_error_naming_the_field(kwargs, field):
    with pytest.raises(SpecError) as err:
        simulate("gpt3-1.3b", "a100-80g:8", "dp=2 pp=4 gbs=16", **kwargs)
    assert err.value.field == field


def test_result_carries_the_design_json_keys():
    r = simulate("gpt3-1.3b", "a100-80g:8", "dp=2 tp=2 pp=2 gbs=16")
    d = r.to_dict()
    for k in ("step_time_s", "tokens_per_s", "mfu", "hfu", "bubble_fraction", "peak_memory_bytes", "memory_by_stage",
              "fits", "model_flops_per_step", "exposed_comm_s", "num_events", "sim_wall_s", "plan", "model", "cluster",
              "warnings"):
        assert k in d
    assert set(d["exposed_comm_s"]) == {"tp", "dp", "pp"}
    assert set(d["memory_by_stage"][0]) == {"stage", "params", "grads", "optimizer", "activations", "other", "total"}
    assert d["tokens_per_s"] == pytest.approx(16 * 2048 / d["step_time_s"], rel=1e-12)
    assert 0 < d["mfu"] <= d["hfu"] < 1
    assert d["num_events"] > 0


def test_one_compute_event_per_schedule_action_named_like_the_ir():
    plan = parse_plan("pp=4 gbs=8 schedule=interleaved vpp=2")
    r = simulate("gpt3-1.3b", "a100-80g:4", plan)
    schedule = build_schedule("interleaved", 4, 8, 2)
    for p in range(4):
        events = r.trace.action_events(p)
        assert [e.name for e in events] == [str(a) for a in schedule.actions[p]]


def test_engine_exposed_tp_equals_the_trace_metric_on_a_detailed_trace():
    # two accounts of one quantity: the engine's blocked time and parsim.trace.metrics on the
    # per-layer events (a single pipeline rank, so no other waiting blurs the comparison)
    r = simulate("gpt3-1.3b", "a100-80g:2", "tp=2 gbs=4", detail=True)
    assert any(e.layer >= 0 for e in r.trace.events)
    assert exposed_comm(r.trace)["tp"] == pytest.approx(r.exposed_comm_s["tp"], rel=1e-9)


def test_detail_only_adds_events_and_never_changes_the_numbers():
    plan = "dp=2 tp=2 pp=2 gbs=8 recompute=selective"
    coarse = simulate("gpt3-1.3b", "a100-80g:8", plan)
    fine = simulate("gpt3-1.3b", "a100-80g:8", plan, detail=True)
    assert len(fine.trace.events) > len(coarse.trace.events)
    assert fine.step_time_s == coarse.step_time_s
    assert fine.exposed_comm_s == coarse.exposed_comm_s
    quiet = simulate("gpt3-1.3b", "a100-80g:8", plan, record_events=False)
    assert quiet.trace.events == [] and quiet.step_time_s == coarse.step_time_s


def test_parameter_server_dp_is_slower_than_ring_all_reduce_for_eight_replicas():
    # the server's link carries (n - 1) copies each way; a ring moves 2 (n - 1)/n per device
    ring = simulate("gpt3-1.3b", "a100-80g:8", "dp=8 gbs=16")
    ps = simulate("gpt3-1.3b", "a100-80g:8", "dp=8 gbs=16 dp_impl=ps")
    assert ps.exposed_comm_s["dp"] > 3 * ring.exposed_comm_s["dp"]


def test_offload_moves_gradients_and_the_optimizer_step_to_the_host():
    r = simulate("gpt3-1.3b", "a100-80g:8", "dp=8 gbs=16 zero=2 offload=optimizer")
    kinds = {(e.stream, e.kind) for e in r.trace.events}
    assert {("host", "offload_d2h"), ("host", "optimizer"), ("host", "offload_h2d")} <= kinds
    assert ("compute", "optimizer") not in kinds
    assert r.memory_by_stage[0]["optimizer"] == 0.0


def test_a_split_backward_schedule_runs_and_its_input_and_weight_passes_add_up_to_one_backward():
    # zero-bubble style actions (I = input grad, W = weight grad): ZB-H1 order for p = 2, m = 4
    from parsim.schedules import Action, Schedule, check_schedule
    orders = [["F0.0", "F0.1", "I0.0", "F0.2", "W0.0", "I0.1", "F0.3", "W0.1", "I0.2", "W0.2", "I0.3", "W0.3"],
              ["F1.0", "I1.0", "F1.1", "W1.0", "I1.1", "F1.2", "W1.1", "I1.2", "F1.3", "W1.2", "I1.3", "W1.3"]]
    actions = tuple(tuple(Action(a[0], int(a[1]), int(a[3])) for a in order) for order in orders)
    zb = Schedule("zb-h1", 2, 1, 4, actions)
    check_schedule(zb)
    split = simulate("gpt3-1.3b", "a100-80g:4", "dp=2 pp=2 gbs=8", schedule=zb)
    whole = simulate("gpt3-1.3b", "a100-80g:4", "dp=2 pp=2 gbs=8")
    busy = {k: sum(e.duration for e in split.trace.events if e.kind == k and e.layer == -1 and e.rank == 0)
            for k in ("I", "W")}
    b = sum(e.duration for e in whole.trace.events if e.kind == "B" and e.layer == -1 and e.rank == 0)
    assert busy["I"] + busy["W"] == pytest.approx(b, rel=1e-9)
    assert split.step_time_s < whole.step_time_s          # W fills the cool-down bubble


def test_a_schedule_that_deadlocks_is_reported_not_hung():
    from parsim.schedules import Action, Schedule
    backwards_first = Schedule("bad", 2, 1, 1, ((Action("B", 0, 0), Action("F", 0, 0)),
                                                (Action("F", 1, 0), Action("B", 1, 0))))
    with pytest.raises(SpecError) as err:
        simulate("gpt3-1.3b", "a100-80g:2", "pp=2 gbs=1", schedule=backwards_first)
    assert err.value.field == "schedule" and "deadlock" in str(err.value)


def test_host_contention_applies_to_ranks_computing_at_once_not_to_idle_ones():
    """4 ranks on a 2-core host: with every rank busy (dp=4) the step runs at the measured
    4-rank slowdown; a pipeline with big bubbles (pp=4, 4 microbatches) computes at a
    smaller mean-field slowdown, so it is faster than with the 4-rank slowdown throughout."""
    from parsim.costs.timing import host_contention, host_scale
    from parsim.schedules import build_schedule
    from parsim.sim.engine import _run
    from parsim.specs import load_cluster, load_model, parse_plan

    model = load_model("cpu-small")
    cluster = load_cluster("cpu:4", profile="cpu-calibrated")
    c4 = host_contention(cluster, 4)
    assert c4 > 1.5
    for text, busy in (("dp=4 gbs=8 dtype=fp32", True), ("pp=4 gbs=4 dtype=fp32", False)):
        plan = parse_plan(text)
        fixed = _run(model, cluster, plan, build_schedule(plan.schedule, plan.pp, plan.num_microbatches, plan.vpp),
                     "representative", {}, False, False, host_scale(cluster, 4))
        step_fixed = max(fixed.recorder.finish.values())
        step = simulate(model, cluster, plan).step_time_s
        if busy:
            assert step == pytest.approx(step_fixed, rel=0.05)
        else:
            assert step < 0.85 * step_fixed
