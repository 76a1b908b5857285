"""Full mode simulates one device per class of identical ranks (``parsim.sim.symmetry``) and
must give the numbers of the rank-by-rank run (``symmetric=False``): every JSON field, every
rank's accounts, memory timeline and trace events; bit for bit, or within 1e-9 relative where
a class with a single TP member takes whole-action timeouts instead of segment steps."""
from __future__ import annotations

import dataclasses
import math

import pytest

from parsim.sim import simulate
from parsim.sim.symmetry import exact, rank_classes
from parsim.specs import RankLayout, load_cluster, parse_plan

REL = 1e-9


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=REL, abs_tol=0.0)
    return a == b


def _outputs(r) -> dict:
    """Everything a result reports, per rank included (wall clock and engine work left out)."""
    doc = {k: v for k, v in r.to_dict().items() if k not in ("num_events", "sim_wall_s")}
    rec = r.recorder
    doc["per_rank"] = [(rec.busy[k], rec.exposed[k], rec.finish[k]) for k in sorted(rec.busy)]
    doc["memory_timeline"] = sorted(r.memory_timeline.items())
    key = (lambda e: (e.rank, e.stage, e.stream, e.kind, e.microbatch, e.layer, e.name, e.start))
    doc["events"] = [dataclasses.astuple(e) for e in sorted(r.trace.events, key=key)]
    return doc


PLANS = [   # (model, cluster, plan, slowdown): TP inside a node, DP across nodes
    ("gpt3-1.3b", "a100-80g:32", "dp=2 tp=8 pp=2 gbs=8 schedule=1f1b", None),
    ("gpt3-1.3b", "a100-80g:32", "dp=2 tp=8 pp=2 gbs=8 schedule=1f1b", {3: 1.5}),
    ("gpt3-1.3b", "a100-80g:32", "dp=4 tp=8 pp=1 gbs=16 zero=1", {9: 1.5, 30: 1.2}),
    ("gpt3-1.3b", "a100-80g:32", "dp=2 tp=8 pp=2 gbs=16 zero=3", None),
    ("gpt3-1.3b", "a100-80g:32", "dp=2 tp=8 pp=2 gbs=16 zero=2 mbs=2 tp_overlap=subpipe", {17: 1.3}),
    ("gpt3-1.3b", "a100-80g:64", "dp=2 tp=8 pp=4 vpp=2 gbs=16 schedule=interleaved", {0: 2.0}),
    ("gpt3-1.3b", "a100-80g:48", "dp=3 tp=8 pp=2 gbs=12 dp_impl=ps", {8: 1.25}),
    ("gpt3-350m", "h100-sxm:64", "dp=8 tp=2 pp=4 mbs=2 gbs=64 zero=2 recompute=full", None),
    ("gpt3-1.3b", "a100-80g:32", "dp=4 tp=1 pp=8 gbs=32 zero=2 offload=optimizer", {4: 1.5}),
]


@pytest.mark.parametrize("model, cluster, plan, slowdown", PLANS)
def test_full_mode_by_classes_reports_what_the_rank_by_rank_run_reports(model, cluster, plan, slowdown):
    by_rank = simulate(model, cluster, plan, mode="full", slowdown=slowdown, symmetric=False)
    by_class = simulate(model, cluster, plan, mode="full", slowdown=slowdown)
    assert by_class.num_events < by_rank.num_events
    assert _close(_outputs(by_class), _outputs(by_rank))


def test_without_stragglers_each_pipeline_rank_is_one_class():
    plan = parse_plan("dp=8 tp=8 pp=4 gbs=64")
    classes = rank_classes(load_cluster("a100-80g:256"), plan, {})
    layout = RankLayout(8, 8, 4)
    assert classes.simulated == tuple(layout.rank(p, 0, 0) for p in range(4))
    assert all(len(m) == 64 for m in classes.members.values())


def test_a_straggler_splits_its_dp_and_tp_indices_from_the_rest():
    plan = parse_plan("dp=8 tp=8 pp=4 gbs=64")
    layout = RankLayout(8, 8, 4)
    slow = layout.rank(2, 5, 3)
    classes = rank_classes(load_cluster("a100-80g:256"), plan, {slow: 1.5})
    # DP indices {5} and the rest, TP indices {3} and the rest, in every pipeline rank
    assert len(classes.simulated) == 4 * 2 * 2
    assert classes.members[slow] == (slow,)
    assert classes.representative[layout.rank(0, 7, 6)] == layout.rank(0, 0, 0)
    assert classes.representative[layout.rank(1, 5, 6)] == layout.rank(1, 5, 0)
    assert classes.representative[layout.rank(3, 2, 3)] == layout.rank(3, 0, 3)


def test_dp_indices_whose_pipeline_sends_cross_nodes_differently_are_not_one_class():
    # dp=3 on 8-device nodes: the stage blocks of 3 ranks straddle node boundaries, so each DP
    # index has its own pattern of sends that stay in a node; dp=4 blocks do not straddle them
    straddling = rank_classes(load_cluster("a100-80g:24"), parse_plan("dp=3 pp=8 gbs=24"), {})
    assert len(straddling.simulated) == 24
    aligned = rank_classes(load_cluster("a100-80g:32"), parse_plan("dp=4 pp=8 gbs=32"), {})
    assert len(aligned.simulated) == 8


def test_tp_and_dp_on_one_link_simulate_every_rank():
    # both groups inside one node: which of two collectives asked for at one instant gets the
    # shared port follows SimPy's event order across devices, so the run is not symmetric
    plan = "dp=2 tp=2 pp=2 mbs=2 gbs=64 zero=2 partition=3,1 sp=true dtype=fp16 tp_overlap=subpipe"
    assert not exact(load_cluster("a100-80g:8"), parse_plan(plan))
    by_rank = simulate("tiny", "a100-80g:8", plan, mode="full", symmetric=False)
    full = simulate("tiny", "a100-80g:8", plan, mode="full")
    assert full.num_events == by_rank.num_events
    assert _close(_outputs(full), _outputs(by_rank))


def test_a_detailed_trace_by_classes_has_the_rank_by_rank_events():
    # per-layer compute and per-collective TP events: stepped rank by rank, placed by classes
    plan = "dp=2 tp=8 pp=2 mbs=2 gbs=8 tp_overlap=subpipe"
    by_rank = simulate("gpt3-1.3b", "a100-80g:32", plan, mode="full", detail=True, symmetric=False)
    by_class = simulate("gpt3-1.3b", "a100-80g:32", plan, mode="full", detail=True)
    assert len(by_class.trace.events) == len(by_rank.trace.events)
    assert _close(_outputs(by_class), _outputs(by_rank))


@pytest.mark.parametrize("plan, links", [
    ("dp=2 tp=8 pp=2 gbs=8 schedule=1f1b", {3: 4.0}),        # a degraded NIC in a DP group
    ("dp=4 tp=8 pp=1 gbs=16 zero=2", {9: 2.0, 30: 1.5}),
])
def test_a_degraded_nic_is_part_of_a_ranks_class(plan, links):
    # merged features: a rank with a degraded NIC (scale) must not share a class (fullsym) with
    # ranks whose NIC is healthy, or its slower transfers would be copied to them
    cluster = load_cluster("a100-80g:32")
    classes = rank_classes(cluster, parse_plan(plan), {}, links)
    for r in links:
        assert all(links.get(m, 1.0) == links[r] for m in classes.members[classes.representative[r]])
    by_rank = simulate("gpt3-1.3b", cluster, plan, mode="full", link_slowdown=links, symmetric=False)
    by_class = simulate("gpt3-1.3b", cluster, plan, mode="full", link_slowdown=links)
    assert by_class.num_events < by_rank.num_events
    assert _close(_outputs(by_class), _outputs(by_rank))


def test_the_event_bound_counts_the_classes_full_mode_simulates():
    # merged features: the work bound (issue 23) refuses full mode by its rank-by-rank size;
    # full mode by classes (issue 22) plays ~1e4 events for Llama-3 405B on 16,384 H100
    from parsim.api import simulate as api_simulate
    from parsim.costs.work import check_simulation
    from parsim.sim.symmetry import full_mode_classes
    from parsim.specs import SpecError, load_model
    model, cluster = load_model("llama3-405b"), load_cluster("h100-sxm:16384")
    plan = parse_plan("dp=128 tp=8 pp=16 mbs=1 gbs=2048 sp=true zero=2 schedule=interleaved vpp=4")
    with pytest.raises(SpecError, match="events"):
        check_simulation(model, cluster, plan, mode="full", limit=10**7)
    replicas = len(full_mode_classes(cluster, plan, {}).simulated) // plan.pp
    assert replicas == 1
    assert check_simulation(model, cluster, plan, mode="full", limit=10**7, replicas=replicas).events < 10**6
    result = api_simulate(model, cluster, plan, mode="full", max_events=10**7)
    assert result.step_time_s > 0


@pytest.mark.parametrize("plan, slowdown", [
    ("dp=2 tp=8 pp=2 gbs=8 schedule=zbv", None),
    ("dp=2 tp=8 pp=2 gbs=8 schedule=dualpipev", {3: 1.5}),
    ("dp=2 tp=8 pp=2 gbs=8 schedule=zb-h1", {17: 1.3}),
])
def test_zero_bubble_schedules_by_classes_report_what_the_rank_by_rank_run_reports(plan, slowdown):
    # merged features: V-shaped placement and split backward (issue 21) under full mode by classes
    by_rank = simulate("gpt3-1.3b", "a100-80g:32", plan, mode="full", slowdown=slowdown, symmetric=False)
    by_class = simulate("gpt3-1.3b", "a100-80g:32", plan, mode="full", slowdown=slowdown)
    assert by_class.num_events < by_rank.num_events
    assert _close(_outputs(by_class), _outputs(by_rank))
