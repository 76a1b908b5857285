"""Automatic pipeline partitioning (Merak, Lai et al. 2023, Sec. 4): the solver and the
analytic graph of a ModelSpec (torch-free)."""
import itertools
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsim.costs import memory_by_stage, stage_aware_recompute_layers
from parsim.partition import CostGraph, CostNode, partition, pipeline_step_time
from parsim.partition.graph import build_segments, candidate_cuts
from parsim.partition.solver import balanced_counts, partition_graph
from parsim.partition.spec_graph import analytic_graph
from parsim.schedules import build_schedule, dry_run
from parsim.specs import ModelSpec, Plan, SpecError, load_cluster, validate

# 8 layers of hidden 512 with a 32000-word vocabulary: the output layer's logits GEMM
# (2 s h V FLOP) costs ~2.6 layers (24 s h^2 + 4 s^2 h FLOP each, Narayanan et al. 2021 Eq. 3)
HEAVY_HEAD = ModelSpec(name="heavy-head", layers=8, hidden=512, heads=8, ffn_hidden=2048, vocab=32000,
                       seq_len=128, dropout=False)
CPU2 = load_cluster("cpu:2")

CPU_CALIBRATED = str(Path(__file__).resolve().parent / "fixtures" / "cpu-calibrated.yaml")   # frozen measured profile


def chain_graph(times, params, acts=None) -> CostGraph:
    """A chain of nodes: node i feeds node i+1 (every position is a cut with one live tensor)."""
    acts = acts or [0.0] * len(times)
    nodes = tuple(CostNode(f"n{i}", t, 2 * t, 1.0, a, params=(f"p{i}",), inputs=(i - 1,) if i else ())
                  for i, (t, a) in enumerate(zip(times, acts)))
    return CostGraph("chain", nodes, param_numel={f"p{i}": float(p) for i, p in enumerate(params)},
                     output_inputs=(len(times) - 1,))


def brute_force(times, stages, fits=lambda a, b, k: True):
    best = None
    n = len(times)
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        if not all(fits(a, b, k) for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))):
            continue
        worst = max(3 * sum(times[a:b]) for a, b in zip(bounds[:-1], bounds[1:]))
        best = worst if best is None else min(best, worst)
    return best


@settings(max_examples=60, deadline=None)
@given(times=st.lists(st.integers(1, 50), min_size=3, max_size=9), stages=st.integers(2, 3))
def test_min_max_partition_equals_brute_force(times, stages):
    if stages > len(times):
        return
    graph = chain_graph([t * 1e-3 for t in times], [0] * len(times))
    result = partition_graph(graph, Plan(pp=stages, gbs=4 * stages), load_cluster(f"cpu:{stages}"), 1e12)
    assert max(s.time_s for s in result.stages) == pytest.approx(brute_force([t * 1e-3 for t in times], stages))
    assert sum(result.partition) == len(times)


@settings(max_examples=40, deadline=None)
@given(times=st.lists(st.integers(1, 50), min_size=4, max_size=8), params=st.lists(st.integers(0, 9), min_size=8,
                                                                                     max_size=8))
def test_min_max_partition_respects_memory_limits_and_stays_optimal(times, params):
    stages, n = 2, len(times)
    params = params[:n]
    per_param = 16.0      # fp32 param + grad + Adam m, v (Megatron-LM state bytes)
    limit = per_param * (sum(params) * 0.6 + 1)
    graph = chain_graph([t * 1e-3 for t in times], params)
    plan = Plan(pp=stages, gbs=8, dtype="fp32")
    # model states and the heavier of: the largest weight's gradient while it is built
    # (StageCoster._working) with, on the first stage, the 1-byte output of its 2 microbatches in
    # flight (1F1B); the optimizer step's two fp32 copies of a weight beside the one stepped
    # before it on the stage (the torch stack's eager AdamW, footprint.step_window)
    window = lambda a, b: max(2 * params[i] + (params[i - 1] if i > a else 0) for i in range(a, b))   # noqa: E731
    fits = lambda a, b, k: (per_param * sum(params[a:b])   # noqa: E731
                            + max(4.0 * max(params[a:b]) + (2.0 if k == 0 else 0.0), 4.0 * window(a, b))
                            ) <= limit
    expected = brute_force([t * 1e-3 for t in times], stages, fits)
    if expected is None:
        with pytest.raises(SpecError) as err:
            partition_graph(graph, plan, load_cluster("cpu:2"), limit)
        assert err.value.field == "memory_limit"
        return
    result = partition_graph(graph, plan, load_cluster("cpu:2"), limit)
    assert all(s.memory_bytes <= limit for s in result.stages)
    assert max(s.time_s for s in result.stages) == pytest.approx(expected)


def test_heavy_output_layer_moves_layers_to_the_first_stage_and_beats_uniform():
    result = partition(HEAVY_HEAD, "pp=2 gbs=8 dtype=fp32", CPU2, graph="analytic")
    assert result.uniform_partition == (4, 4)
    assert sum(result.partition) == 8 and result.partition[0] > result.partition[1]
    assert max(s.time_s for s in result.stages) < max(s.time_s for s in result.uniform_stages)
    assert result.speedup_vs_uniform > 1.1
    assert result.boundaries == (f"layers.{result.partition[0]}",)
    # the answer is a legal plan partition
    validate(HEAVY_HEAD, CPU2, Plan(pp=2, gbs=8, dtype="fp32", partition=result.partition))


def test_equal_layers_and_a_free_head_keep_the_uniform_split():
    model = ModelSpec(name="flat", layers=8, hidden=512, heads=8, vocab=128, seq_len=128, dropout=False)
    result = partition(model, "pp=4 gbs=16 dtype=fp32", "cpu:4", graph="analytic")
    assert result.partition == (2, 2, 2, 2)
    assert result.speedup_vs_uniform == pytest.approx(1.0)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_analytic_stage_memory_equals_memory_by_stage(recompute):
    model = ModelSpec(name="m", layers=12, hidden=1024, heads=16, vocab=51200, seq_len=1024)
    cluster = load_cluster("a100-80g:4")
    plan = Plan(pp=4, mbs=2, gbs=32, recompute=recompute)
    result = partition(model, plan, cluster, graph="analytic")
    expected = memory_by_stage(model, plan.replace(partition=result.partition), cluster)
    assert [s.memory_bytes for s in result.stages] == pytest.approx([m.total for m in expected], rel=1e-12)


def test_stage_aware_partition_recomputes_the_fewest_layers_that_fit():
    model = ModelSpec(name="m", layers=24, hidden=2048, heads=16, vocab=51200, seq_len=2048)
    cluster = load_cluster("a100-80g:4")
    plan = Plan(pp=4, mbs=4, gbs=64, recompute="stage-aware", stack="torch")   # the model's unfused attention
    limit = 40e9
    result = partition(model, plan, cluster, memory_limit=limit, graph="analytic")
    chosen = plan.replace(partition=result.partition)
    assert result.recompute_layers == stage_aware_recompute_layers(model, chosen, cluster, limit)
    mem = memory_by_stage(model, chosen.replace(recompute_layers=result.recompute_layers), cluster)
    assert all(m.total <= limit for m in mem)
    assert result.recompute_layers[0] > result.recompute_layers[-1]
    # recomputation costs time: the partition gives the recomputing first stage fewer layers
    assert result.partition[0] <= result.partition[-1] + 1
    full = partition(model, plan.replace(recompute="full"), cluster, memory_limit=limit, graph="analytic")
    assert result.step_time_s < full.step_time_s


def test_shifted_critical_path_never_recomputes_on_the_last_rank():
    model = ModelSpec(name="m", layers=16, hidden=1024, heads=16, vocab=51200, seq_len=1024)
    plan = Plan(pp=4, mbs=2, gbs=32, recompute="full", shifted_critical_path=True)
    result = partition(model, plan, "a100-80g:4", graph="analytic")
    assert result.recompute_layers[-1] == 0
    assert all(r == n for r, n in zip(result.recompute_layers[:-1], result.partition[:-1]))


def test_interleaved_virtual_stages_are_partitioned():
    plan = Plan(pp=2, vpp=2, gbs=8, schedule="interleaved", dtype="fp32")
    result = partition(HEAVY_HEAD, plan, CPU2, graph="analytic")
    assert len(result.partition) == 4 and sum(result.partition) == 8
    assert result.partition[-1] == min(result.partition)


def test_layered_graph_cuts_only_at_layer_starts():
    graph = analytic_graph(HEAVY_HEAD, Plan(dtype="fp32"), CPU2)
    cuts = candidate_cuts(graph)
    assert [graph.nodes[c].name for c in cuts] == [f"layers.{i}" for i in range(1, 8)]
    segments = build_segments(graph, cuts)
    assert [s.layers for s in segments] == [1] * 8
    assert segments[0].name == "embedding" and graph.nodes[segments[-1].end - 1].name == "head"


def test_uniform_split_gives_the_remainder_to_the_middle_stages():
    assert balanced_counts(10, 4) == [2, 3, 3, 2]
    assert balanced_counts(8, 2) == [4, 4]


def test_pipeline_step_time_equals_dry_run_and_the_1f1b_formula_for_equal_stages():
    plan = Plan(pp=4, gbs=8)
    t = pipeline_step_time(plan, [Fraction(1)] * 4, [Fraction(2)] * 4)
    assert t == dry_run(build_schedule("1f1b", 4, 8), t_f=1, t_b=2).makespan == (8 + 4 - 1) * 3


def test_pipeline_step_time_is_set_by_the_slowest_stage():
    plan = Plan(pp=2, gbs=16)
    even = pipeline_step_time(plan, [1.0, 1.0], [2.0, 2.0])
    skewed = pipeline_step_time(plan, [0.5, 1.5], [1.0, 3.0])
    assert skewed > even
    # the slow stage runs back to back: first F on stage 0, 16 x (F + B) on stage 1, last B on stage 0
    assert skewed == pytest.approx(0.5 + 16 * (1.5 + 3.0) + 1.0, rel=1e-12)


def test_more_stages_than_places_to_cut_is_rejected():
    graph = chain_graph([1e-3] * 3, [0] * 3)
    with pytest.raises(SpecError) as err:
        partition_graph(graph, Plan(pp=4, gbs=8), load_cluster("cpu:4"), 1e12)
    assert err.value.field == "pp*vpp"


def test_bad_inputs_name_their_field():
    with pytest.raises(SpecError) as err:
        partition(HEAVY_HEAD, "pp=2 gbs=8", CPU2, graph="magic")
    assert err.value.field == "graph"
    with pytest.raises(SpecError) as err:
        partition("no-such-model", "pp=2 gbs=8", CPU2)
    assert err.value.field == "model"
    with pytest.raises(SpecError) as err:
        partition(HEAVY_HEAD, "pp=2 gbs=8 dtype=fp32", CPU2, memory_limit=1e6, graph="analytic")
    assert err.value.field == "memory_limit"
    with pytest.raises(SpecError) as err:
        partition(HEAVY_HEAD, "pp=2 gbs=8 dtype=fp32", CPU2, memory_limit=-1, graph="analytic")
    assert err.value.field == "memory_limit"
    with pytest.raises(SpecError) as err:
        partition(HEAVY_HEAD, "pp=2 tp=2 gbs=8", "cpu:4", graph="traced")
    assert err.value.field == "tp"


def shared_host(gemm: float, membound: float):
    """The calibrated 2-rank CPU host with these measured slowdowns for 2 ranks computing at once."""
    from dataclasses import replace

    from parsim.specs import RankCurve
    cluster = load_cluster("cpu:2", profile=CPU_CALIBRATED)
    tables = cluster.device.tables.replace(contention=RankCurve(((2, gemm),)),
                                           contention_membound=RankCurve(((2, membound),)))
    return replace(cluster, device=replace(cluster.device, tables=tables))


def test_stage_times_without_a_shared_host_are_the_solo_times_and_the_list_scheduled_step():
    from parsim.costs.timing import p2p_time

    plan = Plan(pp=2, gbs=8)
    for cluster in (CPU2, load_cluster("h100-sxm:2")):
        result = partition(HEAVY_HEAD, plan, cluster, graph="analytic")
        for stages, step in ((result.stages, result.step_time_s), (result.uniform_stages, result.uniform_step_time_s)):
            for s in stages:
                assert s.time_s == pytest.approx(s.solo_s, rel=1e-12)
                assert s.time_s == pytest.approx(s.fwd_s + s.bwd_s, rel=1e-12)
            sends = [p2p_time(cluster, stages[0].send_bytes, 0, 1), 0.0]
            assert sends[0] > 0
            assert step == pytest.approx(pipeline_step_time(plan, [s.fwd_s for s in stages],
                                                            [s.bwd_s for s in stages], sends), rel=1e-12)


def test_on_a_shared_cpu_host_a_light_stage_slows_more_than_a_heavy_one():
    """Both pipeline ranks share the host's cores: a stage runs at the contended speed only while
    the other computes too. In the equal split of a heavy-head model the light first stage always
    overlaps the heavy last one, which computes alone about half the time. Each stage's time lies
    between its solo time and its solo time at the full contention, and the cut does not move."""
    plan = Plan(pp=2, gbs=8, dtype="fp32")
    shared = partition(HEAVY_HEAD, plan, shared_host(1.2, 1.6), graph="analytic")
    alone = partition(HEAVY_HEAD, plan, shared_host(1.0, 1.0), graph="analytic")
    assert shared.partition == alone.partition
    for s, a in zip(shared.uniform_stages + shared.stages, alone.uniform_stages + alone.stages):
        assert s.solo_s == pytest.approx(a.solo_s) and a.time_s == pytest.approx(a.solo_s)
        assert s.solo_s < s.time_s <= s.solo_s * 1.6
        assert s.memory_bytes == a.memory_bytes
    light, heavy = shared.uniform_stages
    assert light.solo_s < heavy.solo_s
    assert light.time_s / light.solo_s > heavy.time_s / heavy.solo_s + 0.05
    assert shared.uniform_step_time_s > alone.uniform_step_time_s


def test_partitioner_stage_times_equal_the_simpy_engines_per_stage_busy_time_on_a_shared_host():
    """The partitioner replays the schedule on the engine's processor-sharing host, so on the
    analytic graph its stage times are what ``parsim simulate`` plays (both splits, 2% for the
    p2p sends, which the engine times on its links)."""
    from parsim.sim import simulate

    cluster = shared_host(1.15, 1.7)
    base = Plan(pp=2, gbs=8, dtype="fp32")
    result = partition(HEAVY_HEAD, base, cluster, graph="analytic")
    for split, stages in ((result.partition, result.stages), (result.uniform_partition, result.uniform_stages)):
        trace = simulate(HEAVY_HEAD, cluster, base.replace(partition=split)).trace
        busy: dict[int, float] = {}
        for e in trace.action_events():
            busy[e.stage] = busy.get(e.stage, 0.0) + e.duration
        for s in stages:
            assert s.time_s == pytest.approx(busy[s.stage] / base.num_microbatches, rel=0.02)


def test_the_replay_splits_memory_bound_ops_by_the_cache_as_the_engine_does():
    """On a host with a 4 MiB last-level cache (2 MiB a rank), a
    forward op whose bytes stay in a rank's share takes the GEMM's contention and a backward one
    the memory-bound one (``costs.host.dram_weight``), in the SimPy engine and in the partitioner's
    shared-host replay alike: their stage times agree to 0.2 % (pricing every memory-bound second
    at the memory-bound factor, the replay read 0.9-1.8 % slow with these factors)."""
    from dataclasses import replace

    from parsim.sim import simulate

    cluster = shared_host(1.1, 3.0)
    tables = cluster.device.tables.replace(cache_levels=(2**20, 4 * 2**20))
    cluster = replace(cluster, device=replace(cluster.device, tables=tables))
    base = Plan(pp=2, gbs=8, dtype="fp32")
    result = partition(HEAVY_HEAD, base, cluster, graph="analytic")
    for split, stages in ((result.partition, result.stages), (result.uniform_partition, result.uniform_stages)):
        busy: dict[int, float] = {}
        for e in simulate(HEAVY_HEAD, cluster, base.replace(partition=split)).trace.action_events():
            busy[e.stage] = busy.get(e.stage, 0.0) + e.duration
        for s in stages:
            assert s.time_s == pytest.approx(busy[s.stage] / base.num_microbatches, rel=2e-3)
