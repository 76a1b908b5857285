"""Monte-Carlo of step time under variability and faults; local pool and Dask cluster."""
from __future__ import annotations

import numpy as np
import pytest

from parsim.sim import simulate
from parsim.specs import SpecError
from parsim.study.faults import Faults, Variability
from parsim.study.montecarlo import monte_carlo, replica_estimates

MODEL, CLUSTER, PLAN = "gpt3-1.3b", "a100-80g:16", "dp=2 tp=2 pp=4 gbs=16"


def test_representative_refinement_matches_full_mode_step_by_step():
    """Exact where every TP collective waits for the group's slowest member (stack=torch)."""
    kw = dict(steps=6, variability="lognormal:0.08", seed=3, workers=1)
    rep = monte_carlo(MODEL, CLUSTER, f"{PLAN} stack=torch", **kw)
    full = monte_carlo(MODEL, CLUSTER, f"{PLAN} stack=torch", mode="full", **kw)
    assert np.allclose(rep.step_times, full.step_times, rtol=0.01)
    assert [s.critical_rank for s in rep.samples] == [s.critical_rank for s in full.samples]


def test_representative_refinement_is_an_upper_bound_under_async_tp_backward():
    """megatron-core hides backward TP collectives behind the weight-gradient GEMM: a TP group
    is no longer gated at every collective by its slowest member, so the representative
    refinement (the whole group at that member's pace) errs high, by a few percent."""
    kw = dict(steps=6, variability="lognormal:0.08", seed=3, workers=1)
    rep = monte_carlo(MODEL, CLUSTER, f"{PLAN} stack=megatron-core", **kw)
    full = monte_carlo(MODEL, CLUSTER, f"{PLAN} stack=megatron-core", mode="full", **kw)
    assert np.all(rep.step_times >= full.step_times * (1 - 1e-3))
    assert np.allclose(rep.step_times, full.step_times, rtol=0.03)


def test_same_seed_same_steps_whatever_runs_them():
    kw = dict(steps=8, variability="normal:0.05", seed=11)
    one = monte_carlo(MODEL, CLUSTER, PLAN, workers=1, **kw)
    two = monte_carlo(MODEL, CLUSTER, PLAN, workers=2, **kw)
    other = monte_carlo(MODEL, CLUSTER, PLAN, workers=1, steps=8, variability="normal:0.05", seed=12)
    assert one.step_times.tolist() == two.step_times.tolist()
    assert one.step_times.tolist() != other.step_times.tolist()


def test_variability_makes_steps_slower_on_average_and_quantiles_are_ordered():
    res = monte_carlo(MODEL, CLUSTER, PLAN, steps=12, variability="lognormal:0.1", seed=0, workers=1)
    q = res.quantiles()
    assert q["min"] <= q["p50"] <= q["p90"] <= q["p99"] <= q["max"]
    # synchronous training waits for the slowest of 16 draws: slower than the clean step
    assert q["p50"] > res.clean_step_time_s
    assert sum(res.critical_rank_share().values()) == pytest.approx(1.0)


def test_no_variability_reproduces_the_clean_step():
    res = monte_carlo(MODEL, CLUSTER, PLAN, steps=3, workers=1)
    assert res.step_times.tolist() == [res.clean_step_time_s] * 3


def test_a_slow_node_is_the_critical_path_and_costs_what_simulate_says():
    # node 1 holds ranks 8..15: pipeline ranks 2 and 3 of both replicas
    res = monte_carlo(MODEL, CLUSTER, PLAN, steps=2, faults=Faults.parse(slow_nodes="1=1.5"), workers=1)
    slowed = simulate(MODEL, CLUSTER, PLAN, mode="full", slowdown={r: 1.5 for r in range(8, 16)}).step_time_s
    assert res.step_times == pytest.approx([slowed] * 2, rel=1e-9)
    assert all(8 <= s.critical_rank < 16 for s in res.samples)


def test_a_degraded_nic_slows_the_step_through_its_replica():
    # pp=4 over 2 nodes: pipeline ranks 1 -> 2 cross the NIC
    clean = monte_carlo(MODEL, CLUSTER, PLAN, steps=1, workers=1).step_times[0]
    slow = monte_carlo(MODEL, CLUSTER, PLAN, steps=1, faults=Faults.parse(degraded_nics="1=20"), workers=1)
    full = simulate(MODEL, CLUSTER, PLAN, mode="full", link_slowdown={r: 20.0 for r in range(8, 16)}).step_time_s
    assert slow.step_times[0] > clean
    assert slow.step_times[0] == pytest.approx(full, rel=0.01)


def test_replica_estimate_is_the_pipeline_formula():
    s = np.array([[1.0, 2.0], [1.0, 1.0]])
    est = replica_estimates(s, np.array([1.0, 1.0]), microbatches=4)
    assert est.tolist() == [2 + 3 * 1, 3 + 3 * 2]


@pytest.mark.parametrize("text, field", [("gamma:0.1", "variability"), ("lognormal:x", "variability"),
                                         ("normal:-1", "variability")])
def test_bad_variability_names_the_field(text, field):
    with pytest.raises(SpecError) as err:
        Variability.parse(text)
    assert err.value.field == field


def test_faults_outside_the_cluster_are_rejected():
    with pytest.raises(SpecError, match="a node in 0..1"):
        monte_carlo(MODEL, CLUSTER, PLAN, steps=1, faults=Faults.parse(slow_nodes="5=2"), workers=1)
    with pytest.raises(SpecError):
        Faults.parse(slow_ranks="3:2")


@pytest.fixture(scope="module")
def dask_address():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        with distributed.Client(cluster.scheduler_address) as client:
            assert len(client.scheduler_info()["workers"]) == 2
        yield cluster.scheduler_address


@pytest.mark.timeout(240)
def test_runs_on_a_local_dask_cluster_of_two_workers_with_the_same_numbers(dask_address):
    kw = dict(steps=4, variability="lognormal:0.05", seed=5)
    here = monte_carlo(MODEL, CLUSTER, PLAN, workers=1, **kw)
    there = monte_carlo(MODEL, CLUSTER, PLAN, address=dask_address, **kw)
    assert there.step_times.tolist() == here.step_times.tolist()


@pytest.mark.timeout(240)
def test_sweep_resimulates_on_the_dask_cluster_named_by_the_environment(dask_address, monkeypatch):
    from parsim.api import sweep
    here = sweep(MODEL, "a100-80g:8", gbs=16, fix="tp=1,2 mbs=1", resimulate=3, workers=1).rows(5)
    monkeypatch.setenv("PARSIM_DASK_SCHEDULER", dask_address)
    there = sweep(MODEL, "a100-80g:8", gbs=16, fix="tp=1,2 mbs=1", resimulate=3).rows(5)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "sim_wall_s"} for r in rows]   # noqa: E731
    assert strip(there) == strip(here)
    # the top 3 and any approximate row that could reach them (parsim.fast.honesty) carry SimPy's numbers
    assert all(r["source"] == "sim" for r in there[:3])


def test_an_unreachable_scheduler_is_a_spec_error():
    pytest.importorskip("distributed")
    with pytest.raises(SpecError) as err:
        monte_carlo(MODEL, CLUSTER, PLAN, steps=1, address="tcp://127.0.0.1:9")
    assert err.value.field == "cluster_address"
