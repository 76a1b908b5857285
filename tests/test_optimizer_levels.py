"""The optimizer's rate by cache level (issue 20): the executor's AdamW runs ~9 elementwise ops
tensor by tensor, so a tensor whose working set fits a cache streams faster than one that does
not. The calibration fits one rate per level of the host's caches (and a step capacity), the
profile keeps them as ``OptimizerLevels``, and both engines price every tensor a rank steps at
its level's rate."""
import dataclasses
import math

import numpy as np
import pytest

from parsim.calibration.grid import adamw_grid
from parsim.calibration.optimizer_fit import fit_optimizer_levels
from parsim.costs import optimizer_tensor_sizes
from parsim.costs.timing import OPTIMIZER_WORKING_SET_BYTES, optimizer_time
from parsim.fast import PlanTable, evaluate
from parsim.sim import simulate
from parsim.specs import CalibratedTables, OptimizerLevels, SpecError, load_cluster, load_model, parse_plan

CAPS = (2.0 * 2**20, 64.0 * 2**20)           # a 2 MiB L2, a 64 MiB L3
LEVELS = OptimizerLevels(CAPS, (12e9, 8e9, 4e9))
MODEL = "studies/validation_cpu/heldout/model_deep.yaml"


def _with_levels(cluster, levels=LEVELS, tau=20e-6):
    tables = cluster.device.tables.replace(optimizer_levels=levels, optimizer_per_tensor_s=tau)
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))


def test_a_tensor_streams_at_the_rate_of_the_level_its_working_set_fits():
    small, mid, big = 1e5, 1e6, 1e7          # 1.6 MB, 16 MB, 160 MB of working set
    assert LEVELS.bandwidth(OPTIMIZER_WORKING_SET_BYTES * small) == 12e9
    assert LEVELS.bandwidth(OPTIMIZER_WORKING_SET_BYTES * mid) == 8e9
    assert LEVELS.bandwidth(OPTIMIZER_WORKING_SET_BYTES * big) == 4e9
    cluster = _with_levels(load_cluster("cpu:2", profile="tests/fixtures/cpu-calibrated.yaml"), tau=0.0)
    sizes = (small, mid, big)
    expected = 28 * (small / 12e9 + mid / 8e9 + big / 4e9)
    assert optimizer_time(cluster, sum(sizes), "fp32", sizes=sizes) == pytest.approx(expected, rel=1e-12)


def test_the_fit_recovers_known_rates_per_level_and_the_per_tensor_cost():
    rng = np.random.default_rng(1)
    steps = [[float(e)] * int(n) for e, n in zip(np.round(2 ** rng.uniform(8, 23, 30)),
                                                np.round(2 ** rng.uniform(0, 5, 30)))]
    tau, overhead = 20e-6, 3e-6
    seconds = [overhead + len(s) * tau + sum(28 * e / LEVELS.bandwidth(16 * e) for e in s) for s in steps]
    seconds = np.array(seconds) * (1 + rng.uniform(-0.01, 0.01, len(steps)))
    fit = fit_optimizer_levels(steps, seconds, overhead, CAPS, 28.0, OPTIMIZER_WORKING_SET_BYTES)
    assert fit is not None and fit.capacities[0] == CAPS[0]
    # the last level: any capacity between the measured working sets around the true one fits alike
    sets = sorted(16 * e for s in steps for e in s)
    assert max(c for c in sets if c <= CAPS[1]) <= fit.capacities[1] < min(c for c in sets if c > CAPS[1])
    assert fit.bandwidths == pytest.approx(LEVELS.bandwidths, rel=0.05)
    assert fit.per_tensor_s == pytest.approx(tau, rel=0.1)
    assert fit.report.median < 0.02


def test_the_fit_finds_the_share_of_the_last_cache_level_the_host_gets():
    # sysfs states a 256 MiB L3; the tensors behave as if 40 MB of it were this host's
    rng = np.random.default_rng(2)
    truth = OptimizerLevels((CAPS[0], 40e6), (12e9, 8e9, 4e9))
    steps = [[float(e)] * int(n) for e, n in zip(np.round(2 ** rng.uniform(8, 23, 40)),
                                                np.round(2 ** rng.uniform(0, 4, 40)))]
    seconds = [len(s) * 20e-6 + sum(28 * e / truth.bandwidth(16 * e) for e in s) for s in steps]
    fit = fit_optimizer_levels(steps, seconds, 0.0, (CAPS[0], 256.0 * 2**20), 28.0, OPTIMIZER_WORKING_SET_BYTES)
    assert fit is not None and fit.report.median < 1e-6
    assert fit.bandwidths == pytest.approx(truth.bandwidths, rel=1e-6)
    # the largest measured working set at or under the true capacity (any up to the next one fits alike)
    assert fit.capacities == (CAPS[0], max(16 * e for s in steps for e in s if 16 * e <= 40e6))


def test_one_level_of_data_is_not_enough_for_a_level_fit():
    steps = [[1000.0] * n for n in (1, 2, 4, 8)]
    assert fit_optimizer_levels(steps, [1e-4, 2e-4, 4e-4, 8e-4], 0.0, CAPS, 28.0, 16.0) is None


def test_the_cpu_grid_spreads_tensor_sizes_over_the_cache_levels():
    points = adamw_grid("cpu", "fp32", 24)
    sizes = [math.prod(p.tensors[0]) for p in points]
    ws = OPTIMIZER_WORKING_SET_BYTES * np.array(sizes)
    assert (ws <= 2 * 2**20).sum() >= 6 and (ws > 2 * 2**20).sum() >= 6
    # matrices, as weights are: the executor's AdamW decays every tensor of 2+ dimensions
    assert all(len(shape) == 2 for p in points for shape in p.tensors)
    assert all(p.fwd_bytes == 28.0 * sum(math.prod(s) for s in p.tensors) for p in points)


def test_levels_read_back_and_bad_levels_are_refused():
    raw = {"optimizer_levels": {"capacities": [2097152, 272629760], "bandwidths": [1.2e10, 9e9, 5e9]}}
    tables = CalibratedTables.from_dict(raw)
    assert tables.optimizer_levels == OptimizerLevels((2097152, 272629760), (1.2e10, 9e9, 5e9))
    assert tables.to_dict() == raw
    for bad in ({"capacities": [4, 2], "bandwidths": [1, 1, 1]}, {"capacities": [2], "bandwidths": [1]},
                {"capacities": [2], "bandwidths": [1, -1]}, {"capacities": [2], "bandwidths": [1, 1], "x": 1}):
        with pytest.raises(SpecError) as e:
            CalibratedTables.from_dict({"optimizer_levels": bad})
        assert "optimizer_levels" in str(e.value)


@pytest.mark.parametrize("plan_text", ["dp=2 gbs=8", "pp=2 gbs=8", "dp=2 zero=3 gbs=8", "dp=2 zero=1 gbs=8"])
def test_both_engines_price_the_rank_tensors_at_their_levels(plan_text):
    # devices that do not share a host: the step's optimizer event is its price, unstretched
    model, plan = load_model(MODEL), parse_plan(plan_text + " dtype=fp32")
    base = load_cluster(f"a100-80g:{plan.world_size}")
    cluster = _with_levels(base)
    res = simulate(model, cluster, plan)
    sizes = optimizer_tensor_sizes(model, plan)
    shard = [tuple(x / plan.dp for x in s) if plan.zero >= 2 else tuple(s) for s in sizes]
    priced = sorted(optimizer_time(cluster, sum(s), "fp32", tensors=len(s), sizes=s) for s in shard)
    measured = sorted({round(e.end - e.start, 12) for e in res.trace.events if e.kind == "optimizer"})
    assert measured == pytest.approx(priced, rel=1e-9)
    fast = evaluate(model, cluster, PlanTable.from_plans([plan])).step_time_s[0]
    assert fast == pytest.approx(res.step_time_s, rel=0.02)
    # without levels the same bytes go at the profile's one AdamW rate: another step time
    assert simulate(model, base, plan, record_events=False).step_time_s != pytest.approx(res.step_time_s, rel=1e-3)


def test_dtensor_parameters_add_their_measured_seconds_per_tensor_under_zero_2_and_3():
    from parsim.calibration.sharded import dtensor_per_tensor_s
    ranks = [{"dtensor_optimizer": [(16, 2.8e-3, 0.5e-3), (64, 10.2e-3, 2.0e-3)]},
             {"dtensor_optimizer": [(16, 2.7e-3, 0.6e-3), (64, 10.0e-3, 2.1e-3)]}]
    extra = dtensor_per_tensor_s(ranks)
    assert extra == pytest.approx(sorted([2.3e-3 / 16, 8.2e-3 / 64, 2.1e-3 / 16, 7.9e-3 / 64])[2])
    assert dtensor_per_tensor_s([{}]) is None
    model = load_model(MODEL)
    base = _with_levels(load_cluster("a100-80g:2"))
    tables = base.device.tables.replace(optimizer_sharded_per_tensor_s=1e-3)
    cluster = dataclasses.replace(base, device=dataclasses.replace(base.device, tables=tables))
    for zero, added in ((1, False), (2, True), (3, True)):
        plan = parse_plan(f"dp=2 zero={zero} gbs=8 dtype=fp32")
        tensors = len(optimizer_tensor_sizes(model, plan)[0])
        before, after = (simulate(model, c, plan, record_events=False).step_time_s for c in (base, cluster))
        assert after - before == pytest.approx(tensors * 1e-3 if added else 0.0, abs=1e-9)
        fast = [evaluate(model, c, PlanTable.from_plans([plan])).step_time_s[0] for c in (base, cluster)]
        assert fast[1] - fast[0] == pytest.approx(after - before, rel=0.02, abs=1e-9)
