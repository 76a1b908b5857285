"""Calibrated tables are typed (``parsim.specs.CalibratedTables``, ``CollectiveTables``): every
profile on disk reads back to the same mapping, bad keys are a SpecError naming them, and the
host model (``parsim.costs.host``) is the identity on GPUs."""
import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from parsim.costs.host import ComputeLedger, ComputeScale, HostModel
from parsim.specs import (CalibratedTables, CollectiveTables, RankCurve, SpecError, load_cluster, load_model,
                          load_profile_dict, parse_plan, profile_tables)

ROOT = Path(__file__).resolve().parents[1]
PROFILES = sorted(p for p in [*ROOT.glob("calibration/profiles/*.yaml"), *ROOT.glob("studies/**/*.yaml")]
                  if "peak_flops" in p.read_text())


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_profile_on_disk_reads_back_to_the_same_mapping_keys_order_and_number_types(path):
    data = yaml.safe_load(path.read_text())
    extra = data["device"].get("extra", {})
    assert json.dumps(CalibratedTables.from_dict(extra).to_dict()) == json.dumps(extra)
    collectives = data["network"].get("collectives", {})
    assert json.dumps(CollectiveTables.from_dict(collectives).to_dict()) == json.dumps(collectives)


def test_an_unknown_or_malformed_calibrated_table_is_a_spec_error_naming_the_key():
    data = load_profile_dict("cpu-calibrated")
    data["device"]["extra"]["contention_typo"] = {"2": 1.5}
    with pytest.raises(SpecError) as e:
        profile_tables(data)
    assert e.value.field == "profile.device.extra.contention_typo" and "contention_membound" in e.value.allowed
    data = load_profile_dict("cpu-calibrated")
    data["device"]["extra"]["contention"] = {"two": 1.5}
    with pytest.raises(SpecError) as e:
        profile_tables(data)
    assert e.value.field == "profile.device.extra.contention"
    for bad in ([64 * 2**20, 2**20], [0], [], "32M"):       # smallest level first, bytes > 0
        data = load_profile_dict("cpu-calibrated")
        data["device"]["extra"]["cache_levels"] = bad
        with pytest.raises(SpecError) as e:
            profile_tables(data)
        assert e.value.field == "profile.device.extra.cache_levels" and "smallest level first" in e.value.allowed
    data = load_profile_dict("cpu-calibrated")
    del data["network"]["collectives"]["all_reduce"]["2"]["beta"]
    with pytest.raises(SpecError) as e:
        CollectiveTables.from_dict(data["network"]["collectives"])
    assert e.value.field == "profile.network.collectives.all_reduce.2.beta"


def test_a_collective_fit_is_the_measured_size_else_the_next_larger_else_the_largest():
    fits = CollectiveTables.from_dict({"all_reduce": {n: {"alpha": float(n), "beta": 0.0} for n in ("2", "8")}})
    assert [fits.fit("all_reduce", n).alpha for n in (2, 3, 8, 64)] == [2.0, 8.0, 8.0, 8.0]
    assert fits.fit("all_gather", 2) is None and not CollectiveTables()


def test_in_situ_latency_replaces_alpha_and_the_shared_one_applies_only_beyond_the_group():
    fit = CollectiveTables.from_dict({"all_reduce": {"2": {
        "alpha": 1e-3, "beta": 1e-9, "alpha_insitu": 2e-3, "alpha_insitu_shared": {"4": 5e-3}}}}).fit("all_reduce", 2)
    x = 1e6
    assert fit.seconds(x) == pytest.approx(1e-3 + 1e-9 * x)
    assert fit.seconds(x, in_situ=True) == pytest.approx(2e-3 + 1e-9 * x)
    assert fit.seconds(x, in_situ=True, host_ranks=4, group=2) == pytest.approx(5e-3 + 1e-9 * x)
    assert fit.seconds(x, in_situ=True, host_ranks=2, group=2) == pytest.approx(2e-3 + 1e-9 * x)
    assert fit.seconds(x, in_situ=True, host_ranks=8, group=2) == pytest.approx(2e-3 + 1e-9 * x)   # not measured


def test_the_shared_latency_scales_with_the_compute_before_the_call_against_the_probes_block():
    entry = {"alpha": 1e-3, "beta": 1e-9, "alpha_insitu": 2e-3, "alpha_insitu_shared": {"4": 5e-3},
             "insitu_block_s": 4e-3}
    fit = CollectiveTables.from_dict({"all_reduce": {"2": entry}}).fit("all_reduce", 2)
    x = 1e6

    def shared(block):
        return fit.seconds(x, in_situ=True, host_ranks=4, group=2, block_s=block) - 1e-9 * x
    # none after no compute, the probe's whole premium (3 ms) at its block and beyond, linear between
    assert [shared(b) for b in (0.0, 1e-3, 4e-3, 40e-3)] == pytest.approx([2e-3, 2.75e-3, 5e-3, 5e-3])
    assert shared(None) == pytest.approx(5e-3)                             # no block given: as measured
    assert fit.seconds(x, in_situ=True, block_s=1e-3) == pytest.approx(2e-3 + 1e-9 * x)   # the group alone
    assert CollectiveTables.from_dict({"all_reduce": {"2": entry}}).to_dict()["all_reduce"]["2"] == entry


@pytest.mark.parametrize("bad", [0, -1e-3, "fast"])
def test_a_probe_block_that_is_not_a_positive_number_of_seconds_is_a_spec_error_naming_it(bad):
    entry = {"alpha": 1e-3, "beta": 1e-9, "alpha_insitu_shared": {"4": 5e-3}, "insitu_block_s": bad}
    with pytest.raises(SpecError, match=r"all_reduce\.2\.insitu_block_s"):
        CollectiveTables.from_dict({"all_reduce": {"2": entry}}, where="profile.network.collectives")


def test_compute_before_each_collective_is_the_ops_since_the_previous_one():
    from parsim.costs import layer_ops, tp_collectives_per_layer
    from parsim.costs.timing import compute_before, op_time
    model, plan, dev = load_model("cpu-small"), parse_plan("tp=2 sp=true dtype=fp32"), load_cluster("cpu:2").device
    ops, colls = layer_ops(model, plan), tp_collectives_per_layer(model, plan, "fwd")
    blocks = compute_before(dev, ops, colls, "fwd", "fp32")
    names = [o.name for o in ops]
    cuts = [names.index(c.after) for c in colls]
    starts = [0] + [i + 1 for i in cuts[:-1]]
    assert blocks == pytest.approx([sum(op_time(dev, o, "fwd", "fp32") for o in ops[a:b + 1])
                                    for a, b in zip(starts, cuts)])
    # a collective right after another one (two after one op, or one at the chain's start) has none
    doubled = [colls[0], colls[0]]
    assert compute_before(dev, ops, doubled, "fwd", "fp32")[1] == 0.0


def _cpu_host(n: int) -> HostModel:
    """A CPU host whose ranks slow each other down as measured: GEMMs 1.2x with 2 ranks at
    once, 2x with 4; streaming 1.5x and 2.5x; collectives take 0.6 s of compute per second."""
    cluster = load_cluster(f"cpu:{n}")
    tables = CalibratedTables(contention=RankCurve(((2, 1.2), (4, 2.0))),
                              contention_membound=RankCurve(((2, 1.5), (4, 2.5))),
                              comm_interference=RankCurve(((2, 0.6),)))
    return HostModel(replace(cluster, device=replace(cluster.device, tables=tables)), n)


def test_host_model_is_the_identity_on_gpus_and_shares_a_calibrated_cpu_host():
    gpu = HostModel(load_cluster("a100-80g:64"), 64)
    assert not gpu.shared and gpu.interference == 0.0 and gpu.slowdown(8) == ComputeScale()
    assert gpu.settle(busy_s=64.0, step_s=1.0, now=ComputeScale()) is None
    cpu = _cpu_host(4)
    assert cpu.shared and cpu.interference == pytest.approx(0.6) and cpu.ranks_on_host == 4
    # the optimizer step without a curve of its own: as the memory-bound ops
    assert cpu.slowdown(2) == ComputeScale(1.2, 1.5, 1.5) and cpu.slowdown(3) == ComputeScale(pytest.approx(1.6), 2.0, 2.0)
    # the sharing law of jobs standing for 2 ranks each: n jobs -> the slowdown at 2n ranks
    assert cpu.sharing(2.0)(2) == (2.0, 2.5, 2.5)


def test_mean_field_step_moves_halfway_to_the_slowdown_at_the_ranks_computing_and_stops_within_1_percent():
    cpu = _cpu_host(4)
    target = cpu.slowdown(3.0)
    nxt = cpu.settle(busy_s=3.0, step_s=1.0, now=ComputeScale())
    assert nxt.gemm == pytest.approx(0.5 * (1.0 + target.gemm)) and nxt.membound == pytest.approx(
        0.5 * (1.0 + target.membound))
    assert cpu.settle(busy_s=3.0, step_s=1.0, now=target) is None
    assert cpu.settle(busy_s=3.0, step_s=0.0, now=ComputeScale()) is None


def test_ledger_owes_interference_times_the_compute_a_collective_overlapped():
    ledger = ComputeLedger(interference=0.5)
    ledger.computed(0.0, 1.0)
    ledger.busy_since = 2.0                        # computing again from t = 2
    ledger.collective(0.5, 2.5)                    # overlaps 0.5 s of the first and 0.5 s of the second
    assert ledger.debt == pytest.approx(0.5 * 1.0)
    ledger.owe(0.25)                               # e.g. an FSDP2 copy a side stream left to the compute
    assert ledger.pay() == pytest.approx(0.75) and ledger.debt == 0.0
    assert ComputeLedger(interference=0.0).pay() == 0.0


def test_rank_curve_keeps_the_measured_order_and_replaces_or_appends_a_count():
    curve = RankCurve.from_dict("c", {"1": 1.0, "4": 2.0})
    assert curve.with_value(4, 3.0).to_dict() == {"1": 1.0, "4": 3.0}
    assert curve.with_value(2, 1.5).to_dict() == {"1": 1.0, "4": 2.0, "2": 1.5}
    assert curve.get(2) is None and curve.get(4) == 2.0


def test_the_optimizer_step_slows_down_by_its_own_measured_curve_else_as_memory_bound_ops():
    """``contention_optimizer`` (the executor's AdamW stepped by several ranks at once) prices
    the step on a shared host; a profile measured before it keeps the streaming add's law."""
    from parsim.costs.host import host_contention
    host = _cpu_host(4)
    assert host.slowdown(2) == ComputeScale(1.2, 1.5, 1.5) and host.sharing(1.0)(4) == (2.0, 2.5, 2.5)
    tables = host.cluster.device.tables.replace(contention_optimizer=RankCurve(((2, 1.3), (4, 2.2))))
    measured = HostModel(replace(host.cluster, device=replace(host.cluster.device, tables=tables)), 4)
    assert host_contention(measured.cluster, 3, "optimizer") == pytest.approx(1.75)
    assert measured.slowdown(2) == ComputeScale(1.2, 1.5, 1.3) and measured.sharing(2.0)(2) == (2.0, 2.5, 2.2)
    # the mean-field step moves the optimizer's factor halfway too
    assert measured.settle(busy_s=4.0, step_s=1.0, now=ComputeScale()).optimizer == pytest.approx(0.5 * (1 + 2.2))
    # ... and keeps the fixed point going while only the optimizer's factor is off
    settled = measured.slowdown(4.0)
    assert measured.settle(busy_s=4.0, step_s=1.0, now=settled) is None
    assert measured.settle(busy_s=4.0, step_s=1.0, now=replace(settled, optimizer=1.0)).optimizer == pytest.approx(1.6)


def test_engine_steps_the_optimizer_at_the_measured_adamw_slowdown_on_a_shared_host():
    """Two ranks of dp=2 step their optimizers at once (processor sharing): the step's solo
    seconds times the AdamW curve at 2 ranks, after the compute owed to the last backward's
    overlapped all-reduce (the same every time); the rest of the step does not move."""
    from parsim.costs import stage_params
    from parsim.costs.optimizer import optimizer_step, rank_tensor_sizes, rank_tensors
    from parsim.sim import simulate
    from parsim.specs import parse_plan
    model = load_model("cpu-small")
    base = load_cluster("cpu:2", profile=str(Path(__file__).resolve().parent / "fixtures" / "cpu-calibrated.yaml"))
    tables = base.device.tables
    plan = parse_plan("dp=2 gbs=8 dtype=fp32")
    solo = optimizer_step(base, plan, stage_params(model, plan)[0], rank_tensors(base, model, plan)[0],
                          rank_tensor_sizes(base, model, plan)[0]).step_s

    def optimizer_seconds(curve):
        cluster = replace(base, device=replace(base.device, tables=tables.replace(contention_optimizer=curve)))
        res = simulate(model, cluster, plan, record_events=True)
        steps = [e for e in res.trace.events if e.kind == "optimizer"]
        assert steps                     # one device stands for both DP ranks, a job for two ranks
        return steps[0].end - steps[0].start, res

    m2 = tables.contention_membound.get(2)
    as_membound, before = optimizer_seconds(None)
    for o2 in (1.0, 0.5 * (1.0 + m2), 2.0 * m2):
        seconds, after = optimizer_seconds(RankCurve(((2, o2),)))
        assert as_membound - seconds == pytest.approx(solo * (m2 - o2), rel=1e-6)
        assert after.step_time_s - before.step_time_s == pytest.approx(seconds - as_membound, rel=1e-6)
