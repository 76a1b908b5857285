"""The fast path on the schedules it times by their action graph (``fast.dag``,
``fast.split_timing``): against the SimPy engine, and its shortcut -- a long step played at
``canonical_microbatches`` and extended at the steady-state period -- against the whole step."""
import pytest

from parsim.costs.inflight import schedule_moments
from parsim.fast import PlanTable, evaluate
from parsim.fast.dag import canonical_microbatches
from parsim.schedules import build_schedule
from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

# gpt3-2.7b (32 layers) on one 8-GPU node; m up to 25 pipeline depths (the shortcut applies)
PLANS = [
    "dp=2 pp=4 gbs=32 schedule=zb-h1", "dp=2 pp=4 gbs=64 schedule=zb-h2", "pp=8 gbs=200 schedule=zbv",
    "dp=2 pp=4 gbs=64 schedule=dualpipev", "pp=8 gbs=256 schedule=interleaved-zb vpp=4",
    "dp=2 pp=4 gbs=32 schedule=looped-bfs vpp=2", "tp=2 pp=4 gbs=64 schedule=dualpipev",
    "tp=2 pp=4 gbs=64 schedule=zbv sp=true", "tp=2 pp=4 gbs=16 schedule=zb-h1 recompute=full",
    "pp=8 gbs=64 schedule=zb-h2 recompute=full", "dp=2 pp=4 gbs=64 schedule=zbv zero=1",
    "dp=2 pp=4 gbs=64 schedule=zb-h1 zero=2", "dp=2 tp=2 pp=2 gbs=64 schedule=dualpipev recompute=selective sp=true",
]


def _agree(plans, rel_step, abs_bubble=0.005):
    model, cluster = load_model("gpt3-2.7b"), load_cluster("a100-80g:8")
    # the profile's own numbers (stack=torch), as tests/test_fast_vs_sim.py; under the GPU
    # stacks: tests/test_stack.py
    ps = [parse_plan(p if "stack=" in p else f"{p} stack=torch") for p in plans]
    fast = evaluate(model, cluster, PlanTable.from_plans(ps))
    for i, p in enumerate(ps):
        sim = simulate(model, cluster, p, record_events=False)
        assert fast.step_time_s[i] == pytest.approx(sim.step_time_s, rel=rel_step), p.to_string()
        assert fast.peak_memory_bytes[i] == pytest.approx(sim.peak_memory_bytes, rel=1e-9), p.to_string()
        assert fast.bubble_fraction[i] == pytest.approx(sim.bubble_fraction, abs=abs_bubble), p.to_string()


def test_graph_timed_plans_agree_with_the_simpy_engine_within_half_a_percent():
    _agree(PLANS, 0.005)


def test_dualpipev_with_zero3_agrees_within_seven_percent():
    # the SimPy engine plays an overlapped slot's two chains and their ZeRO-3 gathers on shared
    # streams; the fast path's bound (costs.split_backward.overlapped_time) treats the waits as
    # communication the other pass hides. With the profiles fitted to the public runs (issue 19)
    # the fast path is 5.1 % above the engine under the profile's own numbers (stack=torch) and
    # 6.1 % under its default stack, megatron-core (4.4 % with the profile before that fit)
    for stack in ("torch", "auto"):             # one stack per fast-path table
        _agree([f"dp=2 pp=4 gbs=64 schedule=dualpipev zero=3 stack={stack}"], 0.07, abs_bubble=0.05)


@pytest.mark.parametrize("name, vpp", [("zb-h1", 1), ("zb-h2", 1), ("zbv", 2), ("dualpipev", 2),
                                       ("interleaved-zb", 2), ("interleaved-zb", 3)])
@pytest.mark.parametrize("pp", [2, 3, 4])
def test_memory_moments_past_the_canonical_count_repeat(name, vpp, pp):
    for m in range(2 * pp, 8 * pp):
        if name == "interleaved-zb" and m % max(1, m // pp):
            continue
        short = canonical_microbatches(name, pp, m, vpp)
        if short == m:
            continue
        full, cut = build_schedule(name, pp, m, vpp), build_schedule(name, pp, short, vpp)
        for rank in range(pp):
            assert sorted(schedule_moments(full, rank)) == sorted(schedule_moments(cut, rank)), (m, short, rank)


def test_the_played_graph_is_small_for_long_steps():
    assert canonical_microbatches("zbv", 8, 1000, 2) == 24
    assert canonical_microbatches("interleaved-zb", 8, 1000, 2) == 24      # rounds of pp keep their size
    assert canonical_microbatches("interleaved-zb", 8, 54, 2) == 27        # 3 rounds of 9 (54 // 6)
    assert canonical_microbatches("interleaved-zb", 8, 20, 2) == 20        # short steps: played in full
