"""Goodput under failures: Daly's model, the numeric optimum against Young/Daly, time-to-train."""
from __future__ import annotations

import math

import pytest

from parsim.costs.goodput import (Reliability, best_interval, checkpoint_bytes, daly_interval, estimate_run, goodput,
                                  system_mtbf, young_interval)

HOUR = 3600.0


def test_failure_rates_of_devices_and_nodes_add():
    m = system_mtbf(16384, 2048, 1e7, 4e7)
    assert m == pytest.approx(1.0 / (16384 / 1e7 + 2048 / 4e7))
    assert system_mtbf(8, 1, math.inf, math.inf) == math.inf


@pytest.mark.parametrize("delta, mtbf", [(30.0, 3 * HOUR), (60.0, 3 * HOUR), (120.0, 24 * HOUR), (10.0, 0.5 * HOUR)])
def test_numeric_optimum_is_within_10_percent_of_young_where_delta_is_small(delta, mtbf):
    best = best_interval(delta, 300.0, mtbf)
    assert delta / mtbf < 0.01                         # Young's assumption: checkpoints much shorter than M
    assert best == pytest.approx(young_interval(delta, mtbf), rel=0.10)
    assert best == pytest.approx(daly_interval(delta, mtbf), rel=0.01)


def test_optimum_is_a_maximum_of_goodput():
    delta, restart, mtbf = 90.0, 600.0, 2 * HOUR
    best = best_interval(delta, restart, mtbf)
    top = goodput(best, delta, restart, mtbf)
    for f in (0.5, 0.8, 1.25, 2.0):
        assert goodput(best * f, delta, restart, mtbf) < top


def test_young_drifts_from_the_optimum_when_checkpoints_are_long():
    # delta / M = 0.25: far outside Young's first-order regime; Daly's higher order tracks it better
    delta, mtbf = 900.0, 1 * HOUR
    best = best_interval(delta, 0.0, mtbf)
    assert abs(daly_interval(delta, mtbf) - best) < abs(young_interval(delta, mtbf) - best)


def test_no_failures_means_goodput_is_work_over_work_plus_checkpoints():
    assert goodput(900.0, 100.0, 50.0, math.inf) == pytest.approx(0.9)


def test_time_to_train_adds_up():
    rel = Reliability(device_mtbf_s=5e7, node_mtbf_s=1e8, write_bandwidth=1e11, read_bandwidth=2e11, restart_s=600.0)
    ckpt = checkpoint_bytes(405e9, 2.0, 12.0)
    run = estimate_run(15e12, 16e6, 10.0, 16384, 2048, ckpt, rel, usd_per_gpu_hour=2.0, power_w=700.0)
    assert run.checkpoint_bytes == pytest.approx(405e9 * 14)
    assert run.checkpoint_write_s == pytest.approx(ckpt / 1e11)
    assert run.steps == pytest.approx(15e12 / 16e6)
    assert run.compute_s == pytest.approx(run.steps * 10.0)
    assert 0.5 < run.goodput < 1.0
    assert run.wall_s == pytest.approx(run.compute_s / run.goodput)
    assert run.gpu_hours == pytest.approx(run.wall_s * 16384 / 3600)
    assert run.cost_usd == pytest.approx(2.0 * run.gpu_hours)
    assert run.energy_j == pytest.approx(16384 * 700.0 * run.wall_s)
    # whole steps: the rounded interval is no worse than its neighbours
    tau = run.interval_steps * 10.0
    for k in (run.interval_steps - 1, run.interval_steps + 1):
        assert goodput(k * 10.0, run.checkpoint_write_s, run.restart_s, run.mtbf_s) <= run.goodput + 1e-12
    assert tau == pytest.approx(run.interval_s, abs=10.0)


def test_goodput_in_logs_matches_the_closed_form_and_reaches_zero_without_overflow():
    # where e^(R/M) is representable, the log form is Daly's eq. 13 itself
    for tau, delta, restart, m in ((3600.0, 60.0, 600.0, 1e5), (10.0, 1.0, 5.0, 3.0), (1e-3, 1e-4, 0.0, 1e7)):
        exact = tau / (m * math.exp(restart / m) * math.expm1((tau + delta) / m))
        assert goodput(tau, delta, restart, m) == pytest.approx(exact, rel=1e-12)
    # a restart of 1,000s of MTBFs, or a checkpoint that never ends, keeps nothing (no OverflowError)
    assert goodput(10.0, 1.0, 600.0, 0.45) == 0.0
    assert goodput(10.0, math.inf, 1.0, 100.0) == 0.0 and goodput(10.0, 1.0, math.inf, 100.0) == 0.0
    rel = Reliability(device_mtbf_s=3.6, node_mtbf_s=1e8, write_bandwidth=1e11, read_bandwidth=1e-300, restart_s=600.0)
    run = estimate_run(1e12, 16e6, 10.0, 8, 1, checkpoint_bytes(1e9, 2.0, 12.0), rel, 2.0, 700.0)
    assert run.goodput == 0.0 and run.wall_s == math.inf


@pytest.mark.parametrize("stack, per_param", [("auto", 14.0), ("megatron-core", 14.0), ("torch", 12.0)])
def test_checkpoint_holds_the_states_of_the_stack_that_runs_the_plan(stack, per_param):
    """An ``auto`` plan on a GPU profile runs its default stack (megatron-core: bf16 parameters +
    fp32 Adam, 14 bytes a parameter); read as the torch executor's autocast (fp32 parameters, 12)
    the checkpoint of Llama 3 405B came out 4.87 TB instead of 5.68."""
    from parsim.api.run import Reliability as RunReliability
    from parsim.api.run import run_estimate
    from parsim.costs import total_params
    from parsim.specs import load_cluster, load_model, parse_plan

    model, cluster = load_model("llama2-7b"), load_cluster("h100-sxm:64")
    plan = parse_plan(f"dp=8 tp=8 mbs=1 gbs=64 dtype=bf16 stack={stack}")
    run = run_estimate(model, cluster, plan, 1e12, 5.0, RunReliability(), "given")
    assert run.estimate.checkpoint_bytes == pytest.approx(per_param * total_params(model))
