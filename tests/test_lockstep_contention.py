"""Memory-bound contention only between ranks that run in step (``costs.host.lockstep``): the
streaming probe's slowdown applies to TP groups and ZeRO-3 replicas, not to DP replicas or
pipeline stages at up to one rank per core; past the cores the measured curve holds."""
import dataclasses

import pytest

from parsim.costs.host import HostModel, host_contention, lockstep
from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan
from parsim.specs.tables import RankCurve

FIXTURE = "tests/fixtures/cpu-calibrated.yaml"     # 2 cores; GEMM 1.0 / membound 1.51 at 2 ranks


def _with_membound(cluster, at_two: float):
    """``cluster`` with the streaming probe's slowdown at 2 ranks set to ``at_two`` (4 kept), the
    optimizer's kept as it was (without a curve of its own it reads the probe's)."""
    tables = cluster.device.tables
    curve = RankCurve(tuple((k, at_two if int(k) == 2 else v) for k, v in tables.contention_membound.values))
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables.replace(
        contention_membound=curve, contention_optimizer=tables.contention_optimizer or tables.contention_membound)))


@pytest.mark.parametrize("plan, together", [
    ("tp=2 gbs=8", True), ("tp=2 sp=true gbs=8", True), ("dp=2 tp=2 gbs=8", True), ("tp=2 pp=2 gbs=8", True),
    ("dp=2 zero=3 gbs=8", True), ("dp=2 gbs=8", False), ("dp=2 zero=1 gbs=8", False), ("dp=2 zero=2 gbs=8", False),
    ("pp=2 gbs=8", False), ("dp=2 pp=2 gbs=8", False), ("pp=4 vpp=2 gbs=8 schedule=interleaved", False),
])
def test_tp_groups_and_zero3_replicas_run_in_step(plan, together):
    assert lockstep(parse_plan(plan)) is together


def test_independent_ranks_take_the_gemm_slowdown_up_to_the_cores_and_the_curve_past_them():
    cluster = load_cluster("cpu:4", profile=FIXTURE)
    tables = cluster.device.tables
    assert tables.cores == 2
    gemm2, mem2, mem4 = (host_contention(cluster, 2), host_contention(cluster, 2, "membound"),
                         host_contention(cluster, 4, "membound"))
    assert mem2 > gemm2 * 1.2                      # the probe: DRAM shared by two streaming ranks
    assert host_contention(cluster, 2, "membound", in_step=False) == pytest.approx(gemm2)
    assert host_contention(cluster, 1.5, "membound", in_step=False) == pytest.approx(gemm2 * 0.5 + 0.5)
    assert host_contention(cluster, 4, "membound", in_step=False) == pytest.approx(mem4)
    # between the cores and the next measured count: from the GEMM's value to the curve's
    assert gemm2 < host_contention(cluster, 3, "membound", in_step=False) < host_contention(cluster, 3, "membound")
    # the optimizer (every replica steps at once, after the sync) and the GEMM do not move
    for kind in ("gemm", "optimizer"):
        assert host_contention(cluster, 2, kind, in_step=False) == host_contention(cluster, 2, kind)
    # the host is shared either way: the engine takes the same path
    assert HostModel(cluster, 2, in_step=False).shared and HostModel(cluster, 2).shared


def test_the_engine_prices_independent_ranks_without_the_probe_and_tp_with_it():
    model = load_model("tiny")
    base = load_cluster("cpu:2", profile=FIXTURE)
    doubled = _with_membound(base, 3.0)
    for plan, moves in (("dp=2 gbs=8 dtype=fp32", False), ("pp=2 gbs=8 schedule=1f1b dtype=fp32", False),
                        ("tp=2 gbs=8 dtype=fp32", True), ("dp=2 zero=3 gbs=8 dtype=fp32", True)):
        p = parse_plan(plan)
        t0, t1 = (simulate(model, c, p, record_events=False).step_time_s for c in (base, doubled))
        if moves:
            assert t1 > t0 * 1.005, plan
        else:
            assert t1 == pytest.approx(t0, rel=1e-9), plan
