"""Representative ranks vs every device, stragglers, and what a SimResult carries."""
from pathlib import Path

import pytest

from parsim.schedules import build_schedule
from parsim.sim import simulate
from parsim.specs import RankLayout, SpecError, parse_plan
from parsim.trace.metrics import exposed_comm

CPU_CALIBRATED = str(Path(__file__).resolve().parent / "fixtures" / "cpu-calibrated.yaml")   # frozen measured profile

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
    plan = "tp=2 pp=2 gbs=8 stack=torch"      # synchronous TP collectives (megatron-core hides some)
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
    smaller mean-field slowdown, so it is faster than with the 4-rank slowdown throughout.
    "Throughout" is the same host without its contention table and every rank a straggler
    by the 4-rank slowdown (GEMM and memory-bound ops share one table here, so one factor
    is the whole slowdown)."""
    from parsim.costs.host import host_contention
    from parsim.specs import cluster_from_dict, load_model, load_profile_dict, parse_plan

    model = load_model("cpu-small")
    shared = load_profile_dict(CPU_CALIBRATED)
    shared["device"]["extra"].pop("contention_membound")
    cluster = cluster_from_dict(shared, num_devices=4)
    c4 = host_contention(cluster, 4)
    assert c4 > 1.5 and host_contention(cluster, 4, "membound") == c4
    alone = load_profile_dict(CPU_CALIBRATED)
    for key in ("contention", "contention_membound"):
        alone["device"]["extra"].pop(key)
    no_sharing = cluster_from_dict(alone, num_devices=4)
    for text, busy in (("dp=4 gbs=8 dtype=fp32", True), ("pp=4 gbs=4 dtype=fp32", False)):
        plan = parse_plan(text)
        step_fixed = simulate(model, no_sharing, plan, mode="full", slowdown={r: c4 for r in range(4)}).step_time_s
        step = simulate(model, cluster, plan).step_time_s
        if busy:
            assert step == pytest.approx(step_fixed, rel=0.05)
        else:
            assert step < 0.85 * step_fixed


def _with_interference(cluster, value, **keys):
    from dataclasses import replace
    from parsim.specs import RankCurve
    tables = cluster.device.tables.replace(comm_interference=None if value is None else RankCurve(((2, value),)),
                                           **keys)
    return replace(cluster, device=replace(cluster.device, tables=tables))


def _overlap(intervals, others):
    return sum(max(0.0, min(e, f) - max(s, g)) for s, e in intervals for g, f in others)


def test_comm_interference_delays_compute_by_the_overlapped_collective_time():
    """CPU host: a DP all-reduce overlapping the backward takes interference x overlap seconds
    from the rank's compute, paid before the optimizer step (one microbatch: nothing else)."""
    from parsim.specs import load_cluster, load_model, parse_plan

    model = load_model("cpu-small")
    base = load_cluster("cpu:2", profile=CPU_CALIBRATED)
    plan = parse_plan("dp=2 gbs=2 mbs=1 dtype=fp32 dp_bucket_bytes=4000000")
    plain = simulate(model, _with_interference(base, None), plan)
    r0 = [e for e in plain.trace.events if e.rank == 0]
    backward = [(e.start, e.end) for e in r0 if e.kind == "B"]
    buckets = [(e.start, e.end) for e in r0 if e.kind == "dp_allreduce"]
    overlap = _overlap(buckets, backward)
    assert len(buckets) > 1 and overlap > 0
    hit = simulate(model, _with_interference(base, 0.6), plan)
    # (1% : the mean-field host contention moves a little with the longer step)
    assert hit.step_time_s - plain.step_time_s == pytest.approx(0.6 * overlap, rel=0.01)


def test_comm_interference_costs_nothing_when_the_collective_overlaps_no_compute():
    from parsim.specs import load_cluster, load_model, parse_plan

    model = load_model("cpu-small")
    base = load_cluster("cpu:2", profile=CPU_CALIBRATED)
    plan = parse_plan("dp=2 gbs=4 mbs=1 dtype=fp32 dp_overlap=false")
    plain = simulate(model, _with_interference(base, None), plan)
    hit = simulate(model, _with_interference(base, 0.9), plan)
    assert hit.step_time_s == pytest.approx(plain.step_time_s, rel=1e-9)


def test_comm_interference_slows_zero3_whose_gathers_overlap_every_layer():
    from parsim.specs import load_cluster, load_model, parse_plan

    model = load_model("cpu-small")
    base = load_cluster("cpu:2", profile=CPU_CALIBRATED)
    plan = parse_plan("dp=2 gbs=4 mbs=1 zero=3 dtype=fp32")
    # collectives on a side stream (overlapping), no FSDP2 copies
    plain = simulate(model, _with_interference(base, None, zero_overlap=True, zero_copies="none"), plan)
    hit = simulate(model, _with_interference(base, 0.5, zero_overlap=True, zero_copies="none"), plan)
    r0 = [e for e in plain.trace.events if e.rank == 0]
    comm = [(e.start, e.end) for e in r0 if e.stream == "dp"]
    compute = [(e.start, e.end) for e in r0 if e.kind in ("F", "B")]
    overlap = _overlap(comm, compute)
    # the delays shift later collectives, so the total is near, not exactly, 0.5 x overlap
    assert 0.3 * overlap < hit.step_time_s - plain.step_time_s < 0.7 * overlap


def test_processor_sharing_host_slows_jobs_only_while_they_overlap():
    """Two 1-second GEMM jobs, the second starting at 0.5 s, on a host where two at once run
    at half speed: the first is half done alone, then both progress at 1/2 per second, so
    the first ends at 1.5 s and the second (half done by then) alone at 2.0 s."""
    import simpy

    from parsim.costs.host import ProcessorSharing

    env = simpy.Environment()
    host = ProcessorSharing(env, lambda n: (float(n), 1.0, 1.0))
    ends = {}

    def job(name, at, fixed=0.0, gemm=1.0):
        yield env.timeout(at)
        yield host.run(fixed, gemm, 0.0)
        ends[name] = env.now

    env.process(job("a", 0.0))
    env.process(job("b", 0.5))
    env.run()
    assert ends["a"] == pytest.approx(1.5) and ends["b"] == pytest.approx(2.0)
    # a fixed (not shared) part is not slowed
    env = simpy.Environment()
    host = ProcessorSharing(env, lambda n: (float(n), 1.0, 1.0))
    ends.clear()
    env.process(job("a", 0.0, fixed=1.0, gemm=0.0))
    env.process(job("b", 0.0, fixed=1.0, gemm=0.0))
    env.run()
    assert ends["a"] == pytest.approx(1.0) and ends["b"] == pytest.approx(1.0)


def test_pipeline_ranks_on_a_shared_host_compute_faster_in_the_bubbles_than_in_the_steady_state():
    """pp=4 on 2 cores: rank 0's first forward runs alone (fast); in the steady state all four
    ranks compute at once and its forwards take about the 4-rank slowdown longer."""
    from parsim.costs.host import host_contention
    from parsim.specs import load_cluster, load_model, parse_plan

    cluster = load_cluster("cpu:4", profile=CPU_CALIBRATED)
    res = simulate(load_model("cpu-small"), cluster, parse_plan("pp=4 gbs=8 dtype=fp32"))
    forwards = [e.end - e.start for e in res.trace.events if e.rank == 0 and e.kind == "F"]
    assert len(forwards) == 8
    assert max(forwards) > 1.3 * forwards[0]
    worst = max(host_contention(cluster, 4, "gemm"), host_contention(cluster, 4, "membound"))
    assert max(forwards) <= worst * forwards[0] * 1.01


def _cpu_with(**extra):
    from dataclasses import replace

    from parsim.specs import load_cluster
    base = load_cluster("cpu:2")          # no contention table: no host sharing to move times
    return replace(base, device=replace(base.device, tables=base.device.tables.replace(**extra)))


def test_blocking_zero_collectives_never_overlap_compute():
    """FSDP2 without side streams (CPU): every ZeRO-3 gather and reduce-scatter runs while
    the rank's compute waits, so no per-layer compute segment overlaps a DP collective."""
    from parsim.specs import load_model, parse_plan

    model, plan = load_model("cpu-small"), parse_plan("dp=2 gbs=4 mbs=1 zero=3 dtype=fp32")
    blocking = simulate(model, _cpu_with(zero_overlap=False), plan, detail=True)
    overlapped = simulate(model, _cpu_with(), plan, detail=True)
    for res, expect_overlap in ((blocking, False), (overlapped, True)):
        r0 = [e for e in res.trace.events if e.rank == 0]
        comm = [(e.start, e.end) for e in r0 if e.stream == "dp"]
        compute = [(e.start, e.end) for e in r0 if e.stream == "compute" and e.layer >= 0]
        assert comm and compute
        assert (_overlap(comm, compute) > 1e-6) == expect_overlap
    assert blocking.step_time_s > overlapped.step_time_s


def test_fsdp_copies_add_their_streaming_passes_per_collective_when_blocking():
    """zero_copies=fsdp2: each all-gather is preceded by the copy-in of the rank's 1/dp shard
    and followed by the copy-out of its output, each reduce-scatter preceded by the copy-in of
    its input: 2 x those bytes at the streaming bandwidth; with blocking collectives they add up."""
    from parsim.costs.timing import membound_time
    from parsim.specs import load_model, parse_plan

    model, plan = load_model("cpu-small"), parse_plan("dp=2 gbs=4 mbs=1 zero=3 dtype=fp32")
    plain = simulate(model, _cpu_with(zero_overlap=False), plan)
    cluster = _cpu_with(zero_overlap=False, zero_copies="fsdp2")
    copied = simulate(model, cluster, plan)
    dp = [e for e in plain.trace.events if e.rank == 0 and e.stream == "dp"]
    shard_in = [e.bytes / plan.dp for e in dp if e.kind == "zero_allgather"]
    expect = sum(membound_time(cluster.device, 2 * x, "fsdp_copy") for x in [e.bytes for e in dp] + shard_in)
    assert len(dp) > 10 and shard_in
    assert copied.step_time_s - plain.step_time_s == pytest.approx(expect, rel=1e-6)
    kinds = {e.kind for e in copied.trace.events if e.rank == 0 and e.stream == "compute"}
    assert {"fsdp_copy_in", "fsdp_copy_out"} <= kinds


def test_fsdp_host_work_is_charged_once_per_unit_and_collective():
    """The calibrated FSDP2 host seconds per unit (``fsdp_gather_host_s`` /
    ``fsdp_scatter_host_s``) add once per all-gather and per reduce-scatter of a blocking ZeRO-3
    step, and nothing where the profile has none."""
    from parsim.specs import load_model, parse_plan

    model, plan = load_model("cpu-small"), parse_plan("dp=2 gbs=4 mbs=1 zero=3 dtype=fp32")
    base = dict(zero_overlap=False, zero_copies="fsdp2")
    without = simulate(model, _cpu_with(**base), plan)
    gather, scatter = 3e-4, 1e-4
    hosted = simulate(model, _cpu_with(**base, fsdp_gather_host_s=gather, fsdp_scatter_host_s=scatter), plan)
    dp = [e for e in without.trace.events if e.rank == 0 and e.stream == "dp"]
    gathers = sum(e.kind == "zero_allgather" for e in dp)
    scatters = sum(e.kind == "zero_reducescatter" for e in dp)
    assert gathers > scatters > 0
    assert hosted.step_time_s - without.step_time_s == pytest.approx(gathers * gather + scatters * scatter, rel=1e-6)


def test_sub_pipelined_tp_collectives_under_compute_take_interference_on_a_cpu_host():
    """tp_overlap=subpipe hides one half's TP collectives under the other half's compute; on a
    CPU host the hidden collectives still take interference x their time from the compute."""
    from parsim.specs import load_cluster, load_model, parse_plan

    model = load_model("cpu-small")
    base = load_cluster("cpu:2", profile=CPU_CALIBRATED)
    plan = parse_plan("tp=2 mbs=2 gbs=4 dtype=fp32 tp_overlap=subpipe")
    plain = simulate(model, _with_interference(base, None), plan)
    hit = simulate(model, _with_interference(base, 0.5), plan)
    assert hit.step_time_s > plain.step_time_s
    # nothing overlapped without sub-pipelining: no charge
    flat = parse_plan("tp=2 mbs=2 gbs=4 dtype=fp32")
    assert simulate(model, _with_interference(base, 0.5), flat).step_time_s == pytest.approx(
        simulate(model, _with_interference(base, None), flat).step_time_s, rel=1e-9)


def test_zero2_as_fsdp2_gathers_unit_by_unit_once_a_step():
    """ZeRO-2 run as FSDP2 (zero_copies=fsdp2): the parameters are all-gathered once a step, one
    collective per layer and one for the stage's root unit, each with its copies; without FSDP2,
    in the DP buckets after the optimizer step."""
    from parsim.specs import load_model, parse_plan

    model, plan = load_model("cpu-small"), parse_plan("dp=2 gbs=4 mbs=1 zero=2 dtype=fp32")
    for copies in ("fsdp2", "none"):
        res = simulate(model, _cpu_with(zero_overlap=False, zero_copies=copies), plan)
        r0 = [e for e in res.trace.events if e.rank == 0]
        kinds = [e.kind for e in r0 if e.stream == "dp" and "allgather" in e.kind]
        if copies == "fsdp2":
            assert kinds == ["zero_allgather"] * (model.layers + 1)
            assert sum(e.kind == "fsdp_copy_out" for e in r0) == model.layers + 1
        else:
            assert kinds and set(kinds) == {"dp_allgather"}
