"""Checkpoint at a step boundary and resume, under the same plan (bit-identical continuation)
and under other plans (resharded: ZeRO-3 shards -> pipeline stages -> TP shards + ZeRO-1),
within the fp32 parity tolerance of 1e-5."""
from __future__ import annotations

import json

import pytest

from parsim.specs import parse_plan

from test_executor_cases import TINY_GPT, relative_errors

pytestmark = [pytest.mark.slow, pytest.mark.torch]

SAVED_PLAN = "dp=2 zero=3 gbs=4 dtype=fp32"
STEPS, SAVE_AT = 6, 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from parsim.executor import ExecutorConfig, RunSpec, run_plans

    first = str(tmp_path_factory.mktemp("ckpt") / "after3")
    second = str(tmp_path_factory.mktemp("ckpt") / "after5")

    def config(**kw):
        return ExecutorConfig(steps=STEPS, track_memory=False, **kw)

    specs = {
        "uninterrupted": (SAVED_PLAN, config(save_dir=first, save_at=SAVE_AT)),
        "same-plan": (SAVED_PLAN, config(resume_dir=first)),
        "as-pipeline": ("pp=2 gbs=4 dtype=fp32", config(resume_dir=first)),
        "as-tp-sp-zero1": ("tp=2 sp=true zero=1 gbs=4 dtype=fp32", config(resume_dir=first, save_dir=second, save_at=5)),
        "as-dp-again": ("dp=2 gbs=4 dtype=fp32", config(resume_dir=second)),
    }
    results = run_plans([RunSpec(TINY_GPT, parse_plan(plan), cfg) for plan, cfg in specs.values()])
    return dict(zip(specs, results)), first


def test_checkpoint_records_the_step_and_the_plan(runs):
    _, path = runs
    with open(f"{path}/meta.json") as f:
        meta = json.load(f)
    assert meta["step"] == SAVE_AT and meta["optim_step"] == SAVE_AT
    assert parse_plan(meta["plan"]).zero == 3


def test_resuming_under_the_same_plan_continues_with_identical_losses(runs):
    results, _ = runs
    full, resumed = results["uninterrupted"], results["same-plan"]
    assert resumed.steps == [3, 4, 5]
    assert resumed.losses == full.losses[SAVE_AT:]


@pytest.mark.parametrize("name", ["as-pipeline", "as-tp-sp-zero1"])
def test_resuming_under_another_plan_continues_the_same_training(runs, name):
    results, _ = runs
    full, resumed = results["uninterrupted"], results[name]
    assert resumed.steps == [3, 4, 5]
    assert max(relative_errors(resumed.losses, full.losses[SAVE_AT:])) <= 1e-5


def test_a_resumed_run_can_checkpoint_again_for_a_third_plan(runs):
    results, _ = runs
    assert results["as-dp-again"].steps == [5]
    assert relative_errors(results["as-dp-again"].losses, results["uninterrupted"].losses[5:])[0] <= 1e-5


def test_the_trace_of_a_resumed_run_lists_each_ranks_ir_actions(runs):
    from parsim.schedules import build_schedule

    results, _ = runs
    trace = results["as-pipeline"].trace
    schedule = build_schedule("1f1b", 2, 4)
    for rank in (0, 1):
        assert [e.name for e in trace.action_events(rank)] == [str(a) for a in schedule.actions[rank]]
