"""The backward split's own cost (``costs.split_backward.split_weight_overhead``): torch 2.13's
W, run apart from its I, costs more than its ops, more with more layers in the chunk. Measured by
calibration (``calibration.compute.split_extra``), fitted to a L + b L^2 fractions of a layer's
backward, charged to every split W but the first stage's (a whole backward) by the SimPy engine
and the fast path alike."""
import dataclasses

import pytest

from parsim.costs.split_backward import split_weight_overhead
from parsim.costs.ops import layer_ops
from parsim.costs.timing import op_time
from parsim.specs import load_cluster, load_model, parse_plan
from parsim.specs.tables import CalibratedTables

FIXTURE = "tests/fixtures/cpu-calibrated.yaml"
FIT = {"per_layer": 0.2, "per_layer_squared": 0.02}


def _with(cluster, fit=FIT):
    tables = cluster.device.tables.replace(split_overhead=fit)
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))


def test_the_overhead_is_a_layers_backward_times_a_l_plus_b_l_squared():
    model, plan = load_model("cpu-small"), parse_plan("pp=2 gbs=8 schedule=zb-h1 dtype=fp32")
    base = load_cluster("cpu:2", profile=FIXTURE)
    assert split_weight_overhead(model, base, plan, 4) == 0.0                 # not measured: none
    b_layer = sum(op_time(base.device, op, "bwd", "fp32") for op in layer_ops(model, plan))
    cluster = _with(base)
    assert split_weight_overhead(model, cluster, plan, 1) == pytest.approx(b_layer * 0.22)
    assert split_weight_overhead(model, cluster, plan, 4) == pytest.approx(b_layer * (0.8 + 0.32))
    assert split_weight_overhead(model, cluster, plan, 0) == 0.0


def test_the_simpy_engine_charges_split_w_only():
    from parsim.sim import simulate
    model = load_model("cpu-small")
    base, cluster = load_cluster("cpu:2", profile=FIXTURE), _with(load_cluster("cpu:2", profile=FIXTURE))
    zb = parse_plan("pp=2 gbs=8 schedule=zb-h1 dtype=fp32")
    before = simulate(model, base, zb, mode="full")
    after = simulate(model, cluster, zb, mode="full")
    assert after.step_time_s > before.step_time_s
    w = {r: sum(e.duration for e in res.trace.events if e.rank == r and e.kind == "W" and e.layer == -1
                and e.stream == "compute") for r, res in ((0, before), (1, before))}
    w_after = {r: sum(e.duration for e in after.trace.events if e.rank == r and e.kind == "W" and e.layer == -1
                      and e.stream == "compute") for r in (0, 1)}
    assert w_after[0] == pytest.approx(w[0], rel=0.02)        # the first stage's W is a whole backward
    assert w_after[1] > 1.1 * w[1]                             # stage 1's W pays it, 8 microbatches
    one = parse_plan("pp=2 gbs=8 schedule=1f1b dtype=fp32")
    assert simulate(model, cluster, one).step_time_s == simulate(model, base, one).step_time_s


@pytest.mark.parametrize("plan", ["dp=2 pp=4 gbs=32 schedule=zb-h1", "pp=8 gbs=64 schedule=zbv",
                                  "pp=8 gbs=64 schedule=interleaved-zb vpp=2", "dp=2 pp=4 gbs=64 schedule=dualpipev"])
def test_the_fast_path_charges_it_as_the_simpy_engine_does(plan):
    from parsim.fast import PlanTable, evaluate
    from parsim.sim import simulate
    model = load_model("gpt3-2.7b")
    base = load_cluster("a100-80g:8")
    cluster = _with(base, {"per_layer": 0.3, "per_layer_squared": 0.03})
    p = parse_plan(f"{plan} stack=torch")
    fast = evaluate(model, cluster, PlanTable.from_plans([p]))
    sim = simulate(model, cluster, p, record_events=False)
    assert sim.step_time_s > simulate(model, base, p, record_events=False).step_time_s
    assert fast.step_time_s[0] == pytest.approx(sim.step_time_s, rel=0.005)


def test_calibration_fits_a_and_b_from_one_and_four_layers():
    from parsim.calibration.profile import split_overhead
    b1 = 0.010
    a, b = 0.2, 0.02
    fit = split_overhead({"b1": b1, "e1": b1 * (a + b), "e4": b1 * (4 * a + 16 * b)})
    assert fit == {"per_layer": pytest.approx(a), "per_layer_squared": pytest.approx(b)}
    assert split_overhead(None) is None and split_overhead({"b1": 0.0, "e1": 1, "e4": 1}) is None
    noisy = split_overhead({"b1": b1, "e1": -0.001, "e4": -0.002})     # noise below 0: clamped
    assert noisy == {"per_layer": 0.0, "per_layer_squared": 0.0}
    tables = CalibratedTables.from_dict({"split_overhead": fit})
    assert CalibratedTables.from_dict(tables.to_dict()).split_overhead == pytest.approx(fit)


def test_the_calibration_measures_it_on_the_executors_stages():
    pytest.importorskip("torch")
    import torch

    from parsim.calibration.compute import split_extra
    from parsim.calibration.timer import Clock
    torch.set_num_threads(1)
    tiny = dataclasses.replace(load_model("cpu-small"), hidden=64, heads=2, kv_heads=2, ffn_hidden=128, seq_len=16)
    out = split_extra(tiny, 1, "fp32", Clock(torch.device("cpu")), repeats=3, warmup=1)
    assert set(out) == {"b1", "e1", "e4"} and out["b1"] > 0
    assert all(abs(out[k]) < 1.0 for k in ("e1", "e4"))        # seconds, finite (a difference: may be < 0)


@pytest.mark.parametrize("raw", [{"per_layer": 0.1}, {"per_layer": 0.1, "per_layer_squared": -0.01},
                                 {"per_layer": 0.1, "per_layer_squared": 0.01, "per_layers": 0.2}])
def test_a_bad_split_overhead_table_is_named_with_what_is_allowed(raw):
    from parsim.specs import SpecError
    with pytest.raises(SpecError, match="split_overhead.*per_layer_squared: b"):
        CalibratedTables.from_dict({"split_overhead": raw})


def test_the_partitioners_replay_charges_it_as_the_simpy_engine_does():
    """``parsim partition``'s step estimate replays the schedule with the stages' jobs: each
    split W but the first stage's pays the term, with the layers' backward read off the graph's
    layer nodes (not the head beside them), so every stage's I + W is the engine's and the step
    grows by what the engine's grows."""
    from parsim.partition import partition
    from parsim.sim import simulate
    model, plan = load_model("gpt3-2.7b"), parse_plan("pp=4 gbs=32 schedule=zb-h1 stack=torch")
    base = load_cluster("a100-80g:4")
    cluster = _with(base, {"per_layer": 0.3, "per_layer_squared": 0.03})
    before, after = (partition(model, plan, c, graph="analytic") for c in (base, cluster))
    sim_before, sim_after = (simulate(model, c, plan) for c in (base, cluster))
    grew, sim_grew = (after.uniform_step_time_s - before.uniform_step_time_s,
                      sim_after.step_time_s - sim_before.step_time_s)
    assert grew > 0.2 * before.uniform_step_time_s
    assert grew == pytest.approx(sim_grew, rel=0.03)
    busy: dict[int, list[float]] = {}
    for e in sim_after.trace.action_events():
        if e.kind in ("I", "W"):
            busy.setdefault(e.stage, []).append(e.duration)
    for s in after.uniform_stages:
        assert s.bwd_s == pytest.approx(sum(busy[s.stage]) / plan.num_microbatches, rel=0.01)
