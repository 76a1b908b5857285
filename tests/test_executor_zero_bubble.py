"""The executor runs the zero-bubble family: the backward split into input gradients (I) and
weight gradients (W) through autograd, DualPipeV's overlapped slots, V-shaped placement (a rank
holding two stages, handing tensors over at the V's turn). Each plan trains exactly like the
single-process reference: losses within 1e-5 relative, first-step gradients within 1e-5
(norm-relative, per tensor), parameters after the steps within 1e-5 absolute (fp32, real gloo
processes)."""
from __future__ import annotations

from dataclasses import replace

import pytest

import test_executor_cases as cases
from parsim.schedules import build_schedule
from parsim.specs import parse_plan

from test_executor_cases import max_abs_difference, reference, relative_errors, worst_tensor_error

# 8 layers: pp = 4 with two stages per rank
cases.MODELS["deep"] = replace(cases.TINY_GPT, name="tiny-deep", layers=8, hidden=32, heads=2, kv_heads=2,
                               ffn_hidden=64, vocab=64, seq_len=16)
STEPS = 3
PLANS = [   # all on four ranks: each schedule at pp = 2 beside DP or TP, and at pp = 4
    ("gpt", "dp=2 pp=2 gbs=8 schedule=zb-h1"),
    ("llama", "tp=2 pp=2 gbs=4 schedule=zbv"),
    ("gpt", "dp=2 pp=2 gbs=8 schedule=dualpipev"),
    ("deep", "pp=4 gbs=4 schedule=zb-h1"),
    ("deep", "pp=4 gbs=4 schedule=zbv"),
    ("deep", "pp=4 gbs=8 schedule=dualpipev"),
]


def test_a_v_turn_is_handed_over_on_the_rank_not_sent():
    from parsim.executor.pp_communications import Message, outgoing_messages

    schedule = build_schedule("zbv", 2, 3, vpp=2)          # rank 1 holds stages 1 and 2
    sent = outgoing_messages(schedule, 1)
    assert Message("act", 1, 0) not in sent and Message("grad", 2, 0) not in sent
    assert Message("act", 2, 0) in sent and Message("grad", 1, 0) in sent
    overlapped = build_schedule("dualpipev", 2, 4, vpp=2)
    assert len(outgoing_messages(overlapped, 0)) == len(outgoing_messages(overlapped, 1)) == 2 * 4


@pytest.fixture(scope="module")
def results():
    from parsim.executor import ExecutorConfig, RunSpec, run_plans
    config = ExecutorConfig(steps=STEPS, warmup=1, collect_params=True, collect_grads=True, track_memory=False)
    runs = [RunSpec(cases.MODELS[model], parse_plan(plan + " dtype=fp32"), config) for model, plan in PLANS]
    return dict(zip(PLANS, run_plans(runs)))


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.timeout(600)
@pytest.mark.parametrize("model, plan", PLANS, ids=[p for _, p in PLANS])
def test_zero_bubble_plan_matches_single_process_reference(results, model, plan):
    result = results[(model, plan)]
    ref = reference(model, plan + " dtype=fp32", steps=STEPS)
    assert result.steps == list(range(STEPS))
    assert max(relative_errors(result.losses, ref.losses)) <= 1e-5, (result.losses, ref.losses)
    assert worst_tensor_error(result.grads, ref.grads) <= 1e-5
    assert max_abs_difference(result.params, ref.params) <= 1e-5


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.timeout(600)
@pytest.mark.parametrize("model, plan", PLANS, ids=[p for _, p in PLANS])
def test_each_rank_runs_the_ir_in_order_and_its_bubble_is_measured(results, model, plan):
    """The traced step's compute actions per rank are the schedule's, in its order (an
    overlapped slot as its F then its B/I), and every rank's idle share is measured."""
    from parsim.schedules import build_schedule_for_plan
    from parsim.schedules.ir import leaf_actions
    from parsim.trace.metrics import bubble_fraction_by_rank

    result = results[(model, plan)]
    p = parse_plan(plan + " dtype=fp32")
    schedule = build_schedule_for_plan(p)
    pp_rank = {r: r // (p.dp * p.tp) for r in range(p.world_size)}      # rank = (pp_rank * dp + dp_rank) * tp + tp_rank
    for rank in range(p.world_size):
        traced = sorted((e for e in result.trace.events if e.rank == rank and e.stream == "compute"
                         and e.layer == -1 and e.kind in ("F", "B", "I", "W")), key=lambda e: (e.start, e.end))
        expected = [(a.kind, a.stage, a.microbatch) for a in leaf_actions(schedule.actions[pp_rank[rank]])]
        assert [(e.kind, e.stage, e.microbatch) for e in traced] == expected, rank
    bubbles = bubble_fraction_by_rank(result.trace)
    assert sorted(bubbles) == list(range(p.world_size))
    assert all(0.0 <= b < 1.0 for b in bubbles.values())
