"""parsim calibrate: a --quick run on real gloo processes writes a profile the simulator loads
and whose numbers are positive and self-consistent (the pure fits: ``test_calibration_fits.py``;
bad input: ``test_calibration_inputs.py``)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parsim.calibration.machine import host_id
from parsim.specs import Plan, load_cluster, load_model, profile_tables

from test_host_profile import profile_of

# The real --quick calibration below times this machine, and so does the overlap probe of
# test_list_forms...: the tests that read them are marked `alone`, and `make test` runs them after
# the others with nothing beside them. The rest of the file asserts no timing and runs with the others.
ALONE = pytest.mark.alone

GLOO_ALL_REDUCE_BYTES_PER_S = 0.9e9     # what gloo all-reduce reaches on this machine (2 ranks)


# ----------------------------------------------------------------------------- a real --quick run

# a newcomer's first `make demo`, in a fresh interpreter as the demo runs it
_FIRST_DEMO = """
import json, sys
from parsim.api.hardware import host_profile
said = []
first = host_profile(sys.argv[1], progress=False, say=said.append)
again = host_profile(sys.argv[1], say=said.append)
print(json.dumps(dict(path=str(first.path), calibrated=first.calibrated, again=str(again.path),
                      again_calibrated=again.calibrated, said=said)))
"""


def _unsteady(path: Path) -> bool:
    """Did the machine move while this profile was calibrated (``api.hardware.UNSTEADY``)?"""
    from parsim.api.hardware import UNSTEADY, probe_drift
    from parsim.specs import load_profile_dict
    return probe_drift(load_profile_dict(str(path))) > UNSTEADY


@pytest.fixture(scope="module")
def quick_profile(tmp_path_factory):
    """The one real --quick calibration of the suite, taken the way a newcomer's ``make demo``
    takes it (issue 20): the shipped profile names another host and none of this host is kept, so
    ``host_profile`` runs ``parsim calibrate --quick`` on 2 gloo ranks, says so and keeps the
    profile for this host; a second call reuses it. In its own interpreter, as the demo and
    ``parsim calibrate`` run (measured in the test process, the quick all-reduce fit lost its
    slope in 4 of 9 runs: 15-20x the gloo reference below; in a fresh one it never has)."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("calib")
    shipped = profile_of("another-host-0000", tmp / "shipped.yaml")
    # the system allocator, as `parsim calibrate` without the variable: the reference's policy
    env = {**os.environ, "PARSIM_CACHE_DIR": str(tmp / "cache"), "PARSIM_HOST_MEMORY": "system"}
    proc = subprocess.run([sys.executable, "-c", _FIRST_DEMO, str(shipped)], env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    return Path(out["path"]), (out, tmp / "cache" / "profiles" / f"cpu-{host_id()}.yaml")


@ALONE
@pytest.mark.slow
def test_without_a_profile_of_this_host_a_quick_one_is_calibrated_said_so_kept_and_reused(quick_profile):
    path, (out, kept) = quick_profile
    assert out["calibrated"] and path == kept
    said = out["said"]
    assert "measured on another host" in said[0] and "calibrating a quick profile" in said[0]
    # a block of the layer probe > 30 % slower than another (a noisy minute of a shared VM: seen
    # at 15-35 % on a quiet one) takes the calibration once more, and says so
    assert len(said) == 1 or ("unsteady" in said[1] and "calibrating once more" in said[1])
    assert out["again"] == str(path)
    if len(said) <= 2 and not _unsteady(path):
        assert not out["again_calibrated"]          # a steady profile kept for this host is reused
    else:
        # still unsteady after the second try (seen once on this VM: 37 %): the kept profile is
        # refused the next time, which says why and calibrates again
        assert out["again_calibrated"] and "the machine was busy then" in said[2] and len(said) <= 4


@ALONE
@pytest.mark.slow
def test_quick_profile_loads_as_a_cluster_with_positive_numbers(quick_profile):
    path, _ = quick_profile
    cluster = load_cluster("cpu:2", profile=path)
    dev, net = cluster.device, cluster.network
    assert cluster.num_devices == 2 and cluster.name == f"cpu-{host_id()}"
    assert all(v > 0 for v in dev.peak_flops.values()) and set(dev.peak_flops) == {"fp32", "bf16", "fp16"}
    assert dev.memory_bandwidth > 0 and dev.memory_bytes > 0 and dev.kernel_overhead_s > 0
    assert 0 < dev.gemm.max_efficiency and dev.gemm.half_dim > 0 and dev.attention_efficiency > 0
    assert net.intra_node.bandwidth > 0 and net.intra_node.latency >= 0 and net.host_link.bandwidth > 0
    # the peak is the fitted asymptote of the forward GEMM surface: efficiency is at most 1, and
    # no measured grid GEMM is far above it (a noisy 2-core VM: single medians scatter)
    assert dev.gemm.max_efficiency == 1.0
    surface = dev.tables.gemm_fit("fp32", "linear")
    assert dev.flops("fp32") == pytest.approx(surface.peak, rel=1e-5)
    for dtype, fits in dev.tables.gemm_surface.items():
        assert all(0 < f.efficiency((256, 256, 256)) <= 1.0 for f in fits.values()), dtype
    # AdamW: time per tensor, more for FSDP2's DTensors; rates per cache level never rise with it
    assert dev.tables.optimizer_per_tensor_s > 0 and dev.tables.optimizer_sharded_per_tensor_s > 0
    # FSDP2's host work per unit around an all-gather (calibration.sharded.measure_fsdp_units)
    assert dev.tables.fsdp_gather_host_s > 0 and dev.tables.fsdp_scatter_host_s >= 0
    levels = dev.tables.optimizer_levels
    assert levels is None or list(levels.bandwidths) == sorted(levels.bandwidths, reverse=True)


@ALONE
@pytest.mark.slow
def test_quick_profile_collectives_grow_with_message_size(quick_profile):
    path, _ = quick_profile
    net = load_cluster("cpu:2", profile=path).network
    assert set(net.collectives.ops) == {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}
    for op, per_group in net.collectives.ops.items():
        entry = per_group[2]
        assert entry.alpha >= 0 and entry.beta > 0, op
        points = entry.points             # (nbytes, median, p10, p90), log-spaced sizes
        assert points[-1][0] >= 256 * points[0][0]
        # the largest message's median beats the smallest one's fastest decile (robust to load spikes)
        assert points[-1][1] > points[0][2], (op, points)
        assert all(p10 <= med <= p90 for _, med, p10, p90 in points)


@ALONE
@pytest.mark.slow
def test_quick_profile_all_reduce_bandwidth_is_near_what_gloo_reaches_here(quick_profile):
    # the rate its largest message (4 MiB) is priced at, latency in: 1/beta alone rests on two noisy sizes
    entry = load_cluster("cpu:2", profile=quick_profile[0]).network.collectives.fit("all_reduce", 2)
    ratio = entry.points[-1][0] / entry.seconds(entry.points[-1][0]) / GLOO_ALL_REDUCE_BYTES_PER_S
    assert 1 / 6 < ratio < 6, ratio


@ALONE
@pytest.mark.slow
def test_simulator_timing_reads_the_fitted_surfaces(quick_profile):
    from parsim.costs import layer_ops
    from parsim.costs.timing import collective_time, gemm_time, membound_time, op_time

    path, _ = quick_profile
    cluster = load_cluster("cpu:2", profile=path)
    dev = cluster.device
    tables = dev.tables
    assert tables.gemm_table("fp32") is None                 # no model's shapes were measured
    composed = tables.layer_composition
    for op in layer_ops(load_model("gpt3-125m"), Plan(tp=2, mbs=1, dtype="fp32")):   # a model never measured
        if op.kind == "gemm" and op.batch == 1:
            m, n, k = op.shape
            fit = tables.gemm_fit("fp32", "grad_weight")
            assert gemm_time(dev, k, n, m, "fp32", form="grad_weight") == pytest.approx(
                fit.seconds(2 * m * n * k, (k, n, m)))
        if op.grad_accumulation:
            # the executor's autograd accumulates gradients with a separate kernel: priced on the
            # grad += new fit, in the weight-gradient pass only
            fit = tables.membound_fit("grad_accumulate")
            assert op_time(dev, op, "bwd_weight", "fp32") == pytest.approx(
                fit.seconds("fwd", op.bwd_bytes) * composed.bwd)
            assert op_time(dev, op, "bwd_input", "fp32") == 0.0
        elif op.kind == "membound":
            from parsim.costs.timing import SURFACE_OPS
            assert tables.membound_fit(op.impl or SURFACE_OPS.get(op.name, op.name)), op.name
    ab = cluster.network.collectives.fit("all_reduce", 2)
    assert collective_time(cluster, "all_reduce", 2**20, [0, 1]) == pytest.approx(ab.alpha + ab.beta * 2**20)
    assert membound_time(dev, 1e6, "adamw") > membound_time(dev, 1e3, "adamw")


@ALONE
@pytest.mark.slow
def test_quick_profile_records_provenance_and_contention(quick_profile):
    path, _ = quick_profile
    import yaml
    data = yaml.safe_load(path.read_text())
    prov = data["provenance"]
    for key in ("host", "host_id", "cpu", "cores", "torch", "backend", "date", "duration_s", "repeats", "spread"):
        assert key in prov, key
    assert prov["backend"] == "gloo" and prov["cores"] >= 1 and prov["duration_s"] > 0
    assert prov["shapes"] == "machine grid" and prov["model"] == "probe-reference"   # no --model: the machine
    assert prov["host_id"] == host_id()
    from parsim.calibration.profile_io import FORMAT
    assert prov["format"] == FORMAT          # a kept quick profile of today's code is reused (test_host_profile)
    tables = profile_tables(data)
    assert tables.contention.get(1) == 1.0 and tables.contention.get(2) > 0
    assert tables.comm_interference.get(2) >= 0
    assert tables.attention_fit("fp32", "fwd") is not None and tables.attention_table("fp32") is None
    # every fitted table reports its leave-out error over the points it was fitted on
    assert {"gemm.fp32.linear", "attention.fp32.fwd", "membound.layernorm", "composition.fwd"} <= set(tables.fit_report)
    assert all(r.points >= 3 and 0 <= r.median <= r.max for r in tables.fit_report.values())


@ALONE
@pytest.mark.slow
def test_the_sequence_parallel_collectives_the_executor_calls_run_on_a_real_gloo_group():
    pytest.importorskip("torch")
    from parsim.calibration.comm import CommJob, run_comm_job

    tp_forms = ("all_gather", "reduce_scatter")        # the tensor forms (executor.tp_communications)
    job = CommJob(world=2, device_type="cpu", sizes=(4096, 2**18), ops=tp_forms, repeats=3,
                  point_budget_s=0.05, min_sample_s=1e-3, contention_gemm=(64, 64, 64),
                  contention_dtype="fp32", contention_s=0.05, rounds=2, fsdp2=False, contention_blocks=1)
    ranks = run_comm_job(job)
    assert len(ranks) == 2 and all(c > 0 for r in ranks for key in ("gemm_rounds", "stream_rounds")
                                   for _, c in r[key])
    # compute lost per second of overlapped all-reduce: 3 finite samples, never negative (a
    # timing: another process's burst inside the overlapped window breaks the bound, hence `alone`)
    assert all(len(r["interference"]) == 3 and all(0 <= x < 10 for x in r["interference"]) for r in ranks)
    for r in ranks:
        for op in tp_forms:
            assert set(r["collectives"][op]) == {4096, 2**18}
            assert all(len(v) >= 3 and min(v) > 0 for v in r["collectives"][op].values())


@ALONE
@pytest.mark.slow
def test_composition_terms_reproduce_every_synthetic_stage_within_its_leave_out_error(quick_profile):
    """Each stage's ops priced with the composition terms as fitted give back the stage's
    measured forward and backward seconds, no worse than the stage predicted by the fit of the
    others (least squares: a point's in-sample residual is below its left-out one); the profile
    keeps those terms, raised only where they priced the probe's layer below what it measured
    alone (``layer_terms.at_least_the_layer``), never lowered."""
    from dataclasses import replace

    from parsim.calibration.layer_terms import composition_terms, stage_prices
    from parsim.specs import model_from_dict

    path, _ = quick_profile
    dev = load_cluster("cpu:2", profile=path).device
    tables = dev.tables
    probe = tables.layer_probe
    assert probe.tp == 1 and probe.fwd_s > 0 and probe.bwd_s > probe.fwd_s   # backward ~2x forward
    assert tables.stage_probes.reference == pytest.approx((probe.fwd_s, probe.bwd_s))
    assert len(tables.stage_probes.stages) >= 3
    # timed in two rounds (stages.StageRounds): after the grid and after the 2-rank collectives job
    assert len(tables.stage_probes.rounds) == 2 and min(tables.stage_probes.rounds) > 0
    fit = composition_terms(replace(dev, tables=tables.replace(layer_composition=None)), "fp32").composition
    for pass_ in ("fwd", "bwd"):
        assert tables.layer_composition.factor(pass_) >= fit.factor(pass_) * (1 - 1e-5)
    fitted = replace(dev, tables=tables.replace(layer_composition=fit))
    for stage in tables.stage_probes.stages:
        priced = stage_prices(fitted, "fp32", model_from_dict(stage.spec), int(stage.mbs))
        for pass_, measured in (("fwd", stage.fwd_s), ("bwd", stage.bwd_s)):
            error = abs(priced[pass_][0] / measured - 1)
            assert error <= tables.fit_report[f"composition.{pass_}"].max + 1e-4, (stage.spec["name"], pass_)
    # ops timed alone and composed into a stage: within a factor of 2 on any sane machine (one
    # that held still while calibrating: an unsteady profile is refused for use, ``host_profile``)
    if not _unsteady(path):
        for pass_ in ("fwd", "bwd"):
            assert 0.5 < tables.layer_composition.factor(pass_) < 2.0
    raw = replace(dev, tables=tables.replace(layer_composition=None))
    assert stage_prices(raw, "fp32", model_from_dict(stage.spec), 1)["fwd"][1] > 10    # ops that run


@ALONE
@pytest.mark.slow
def test_gemm_contention_is_fitted_to_the_real_layer_slowdown(quick_profile):
    """Past the cores, c_g(N) (G + M - D) + c_m(N) D = L(N) (G + M): the GEMM contention reproduces
    the real layer's slowdown with N ranks at once, memory-bound ops priced as the simulator
    prices them (D: their seconds from DRAM, ``costs.host.ComputeScale``); up to the cores it is 1
    (``layer_terms.gemm_contention``)."""
    from dataclasses import replace

    from parsim.costs import layer_ops
    from parsim.costs.host import HostModel
    from parsim.costs.timing import op_time

    path, _ = quick_profile
    dev = load_cluster("cpu:2", profile=path).device
    tables = dev.tables
    assert tables.contention_layer.get(1) == 1.0 and tables.contention_layer.get(2) > 0
    assert tables.contention_gemm_probe.get(2) is not None
    raw = replace(dev, tables=tables.replace(layer_composition=None))
    import yaml

    from parsim.calibration.layer_terms import profile_model
    ops = layer_ops(profile_model(yaml.safe_load(path.read_text())), Plan(mbs=tables.layer_probe.mbs, dtype="fp32"))
    g = sum(op_time(raw, op, p, "fp32") for op in ops if op.kind != "membound" for p in ("fwd", "bwd"))
    m = sum(op_time(raw, op, p, "fp32") for op in ops if op.kind == "membound" for p in ("fwd", "bwd"))
    c_g, c_m, slow = tables.contention.get(2), tables.contention_membound.get(2), tables.contention_layer.get(2)
    # the layer's ops priced at 2 ranks as the engine prices them
    scale = HostModel(load_cluster("cpu:2", profile=path), 2).slowdown(2)
    # a measured slowdown below 1 (noise) is taken as 1, by the engine and by the fit alike
    assert tables.last_level_cache > 0 and scale.cache_bytes == tables.last_level_cache / 2
    assert (scale.gemm, scale.membound) == (c_g, max(c_m, 1.0))
    import torch

    from parsim.calibration.cache import cache_levels
    assert tables.cache_levels == (cache_levels(torch.device("cpu")) or None)    # sysfs, as calibrated
    def engine_price(kinds) -> float:
        return sum(op_time(raw, op, p, "fp32") * scale.of(op, p) for op in ops if op.kind in kinds
                   for p in ("fwd", "bwd"))
    priced = engine_price({op.kind for op in ops})
    if 2 <= (tables.cores or 1):     # a core per rank: the GEMMs at their solo speed
        assert c_g == 1.0
        assert engine_price({op.kind for op in ops if op.kind != "membound"}) == pytest.approx(g, rel=1e-9)
    elif c_g > 1.0:                  # fitted to the layer's measured slowdown
        assert priced == pytest.approx(slow * (g + m), rel=1e-5)
    else:                            # clamped at 1: not below what was measured
        assert slow * (g + m) <= priced


@ALONE
@pytest.mark.slow
def test_quick_profile_prices_tp_collectives_in_situ(quick_profile):
    from parsim.costs.timing import collective_time
    path, _ = quick_profile
    cluster = load_cluster("cpu:2", profile=path)
    m = load_model("cpu-small")
    full = m.seq_len * m.hidden * 4                  # the TP buffer of a cpu-small layer, mbs=1, fp32
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        entry = cluster.network.collectives.fit(op, 2)
        assert entry.alpha_insitu >= 0 and entry.insitu_points, op
        x = full / 2 if op == "all_gather" else full
        assert collective_time(cluster, op, full, [0, 1], in_situ=True) == \
            pytest.approx(entry.alpha_insitu + entry.beta * x)


@ALONE
@pytest.mark.slow
def test_refit_rederives_the_layer_terms_and_is_idempotent(quick_profile, tmp_path):
    import shutil

    import yaml

    from parsim.calibration.refit import main as refit_main
    path, _ = quick_profile
    copy = tmp_path / "p.yaml"
    shutil.copy(path, copy)
    def tables():
        return profile_tables(yaml.safe_load(copy.read_text()))
    before = tables()
    assert refit_main([str(copy)]) == 0
    once = tables()
    assert refit_main([str(copy)]) == 0
    twice = tables()
    for k in ("fwd", "bwd"):
        assert once.layer_composition.factor(k) == pytest.approx(before.layer_composition.factor(k), rel=1e-4)
        assert twice.layer_composition.factor(k) == pytest.approx(once.layer_composition.factor(k), rel=1e-6)
    assert once.layer_probe.fwd_s == before.layer_probe.fwd_s      # measurements untouched
    assert refit_main([str(tmp_path / "missing.yaml")]) == 2
