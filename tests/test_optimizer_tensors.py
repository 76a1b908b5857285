"""The optimizer's per-tensor cost (issue 20, "find the missing ~10%"): the executor's AdamW loops
over parameter tensors in Python, so its step costs seconds per tensor besides its bytes. The
cost model counts the tensors as the executor builds them, the calibration fits the term, and
both engines price it only where a profile measured it."""
import dataclasses

import numpy as np
import pytest

from parsim.calibration.optimizer_fit import fit_optimizer
from parsim.costs import optimizer_tensors, stage_params, stage_tensors
from parsim.costs.params import rank_tensor_order, whole_tensor_owners
from parsim.costs.timing import optimizer_time
from parsim.fast import PlanTable, evaluate
from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

HELDOUT = "studies/validation_cpu/heldout/model_{}.yaml"
MODELS = [HELDOUT.format(m) for m in ("gpt", "llama", "deep")] + ["cpu-small"]


def _executor_parameters(model, plan):
    """Per pipeline rank: the parameters of the executor's own stage modules (tp=1), its chunks in
    the order ``executor/build.py`` hands them to the optimizer."""
    torch = pytest.importorskip("torch")
    from parsim.costs.placement import stages_of_rank
    from parsim.executor.model import StageModule
    from parsim.specs import stage_layers

    torch.manual_seed(0)
    layers = stage_layers(model, plan)
    chunks = plan.pp * plan.vpp
    modules = [StageModule(model, sum(layers[:v]), n, is_first=v == 0, is_last=v == chunks - 1)
               for v, n in enumerate(layers)]
    return [[p for v in stages_of_rank(plan, r) for p in modules[v].parameters()] for r in range(plan.pp)]


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("plan_text", ["dp=2", "pp=2", "pp=2 vpp=2 gbs=8 schedule=interleaved",
                                       "pp=2 gbs=8 schedule=zbv"])
def test_tensor_count_is_the_executors_own_parameter_list(model_name, plan_text):
    model, plan = load_model(model_name), parse_plan(plan_text + " dtype=fp32")
    executor = _executor_parameters(model, plan)
    counted = stage_tensors(model, plan)
    assert [len(t) for t in counted] == [len(p) for p in executor]
    assert optimizer_tensors(model, plan) == [float(len(p)) for p in executor]
    # in the optimizer's order, matrices told from vectors (its two groups: footprint.step_window)
    assert rank_tensor_order(model, plan) == [[(float(x.numel()), x.ndim >= 2) for x in p] for p in executor]
    # the parameters the memory model counts, but for Megatron's vocabulary padding (128 rows)
    assert [sum(t) for t in counted] == pytest.approx(stage_params(model, plan), rel=0.01)


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("dp", [2, 4])
def test_zero1_counts_the_most_tensors_the_executors_partition_gives_one_replica(model_name, dp):
    pytest.importorskip("torch")
    from parsim.executor.zero import partition_parameters

    model, plan = load_model(model_name), parse_plan(f"dp={dp} zero=1 dtype=fp32")
    params = _executor_parameters(model, plan)[0]
    owners = partition_parameters(params, dp)
    assert optimizer_tensors(model, plan) == [float(max(owners.count(r) for r in range(dp)))]
    assert whole_tensor_owners(stage_tensors(model, plan)[0], dp) == owners


def test_optimizer_fit_recovers_a_known_per_tensor_cost_and_bandwidth():
    rng = np.random.default_rng(0)
    tensors = np.round(2 ** rng.uniform(0, 8, 16))
    nbytes = 10 ** rng.uniform(5, 8, 16)
    overhead, tau, bw = 12e-6, 90e-6, 8e9
    seconds = (overhead + tau * tensors + nbytes / bw) * (1 + rng.uniform(-0.01, 0.01, 16))
    fit = fit_optimizer(tensors, nbytes, seconds, overhead)
    assert fit.per_tensor_s == pytest.approx(tau, rel=0.05)
    assert fit.bandwidth == pytest.approx(bw, rel=0.05)
    assert fit.report.points == 16 and fit.report.median < 0.02


def _with_per_tensor(cluster, seconds):
    tables = cluster.device.tables.replace(optimizer_per_tensor_s=seconds)
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))


def test_a_profile_without_the_term_prices_the_optimizer_as_before():
    cluster = load_cluster("cpu:2", profile="cpu-calibrated")
    assert cluster.device.tables.optimizer_per_tensor_s is None
    assert optimizer_time(cluster, 1e7, "fp32", tensors=100.0) == optimizer_time(cluster, 1e7, "fp32")


@pytest.mark.parametrize("plan_text", ["dp=8 gbs=32", "dp=8 gbs=32 zero=1", "dp=2 pp=4 gbs=32"])
def test_both_engines_add_the_same_seconds_per_tensor_to_the_step(plan_text):
    model, base = load_model("gpt3-2.7b"), load_cluster("a100-80g:8")
    plan = parse_plan(plan_text)
    tau = 1e-3
    cluster = _with_per_tensor(base, tau)
    added = max(optimizer_tensors(model, plan)) * tau
    before, after = (simulate(model, c, plan, record_events=False).step_time_s for c in (base, cluster))
    assert after - before == pytest.approx(added, rel=0.02)
    fast = [evaluate(model, c, PlanTable.from_plans([plan])).step_time_s[0] for c in (base, cluster)]
    assert fast[1] - fast[0] == pytest.approx(added, rel=0.02)
    assert fast[1] == pytest.approx(after, rel=0.02)
