"""The machine calibration's fitting (``calibration.surface_fit``, ``machine_fit``), its grid and
the surfaces' pricing (``specs.surfaces``, ``costs.timing``): synthetic data with known answers,
and the grids measured on a quiet 16-core CPU and on an H100 (``tests/fixtures/grid_*.json``,
raw medians from ``parsim calibrate``'s machine grid)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from parsim.calibration.fit import Summary
from parsim.calibration.grid import STAGES, attention_grid, gemm_grid, membound_grid, reference_layer
from parsim.calibration.machine_bench import GridResults
from parsim.calibration.machine_fit import fit_surfaces
from parsim.calibration.shapes import AttentionPoint, GemmPoint, MemboundPoint
from parsim.calibration.surface_fit import Points, fit_composition, fit_membound, roofline_with_report
from parsim.costs.ops import Op, layer_ops
from parsim.costs.timing import gemm_time, op_time
from parsim.specs import CalibratedTables, DeviceProfile, GemmTable, LayerComposition, Plan, SpecError, load_model
from parsim.specs.surfaces import MemboundFit, RooflineFit

FIXTURES = Path(__file__).parent / "fixtures"
H100_BF16_DATASHEET = 989e12       # dense BF16 FLOP/s, NVIDIA H100 SXM datasheet


def _gemm_points(fit: RooflineFit, n: int, lo: float, hi: float, noise: float, seed: int = 1) -> Points:
    rng = np.random.default_rng(seed)
    dims = np.exp(rng.uniform(math.log(lo), math.log(hi), (n, 3))).round()
    work = 2 * dims.prod(axis=1)
    t = np.array([fit.seconds(w, tuple(d)) for w, d in zip(work, dims)]) * np.exp(rng.normal(0, noise, n))
    return Points.of(work, dims, t)


def load_grid(name: str) -> GridResults:
    """A fixture's raw grid as ``machine_bench.GridResults`` (medians; p10/p90 where kept)."""
    d = json.loads((FIXTURES / name).read_text())
    one = lambda x: Summary(x, x, x, 1)   # noqa: E731
    g = GridResults()
    g.gemm = {dt: [(GemmPoint(tuple(r[:3]), r[3], r[4], "grid"), Summary(r[5], r[6], r[7], 5)) for r in rows]
              for dt, rows in d["gemm"].items()}
    g.attention = [(AttentionPoint(*r[:5]), one(r[5]), one(r[6])) for r in d["attention"]]
    g.membound = [(MemboundPoint(r[0], tuple(r[1]), r[2], r[3], r[6]), one(r[4]), one(r[5]) if r[5] else None)
                  for r in d["membound"]]
    return g


# ----------------------------------------------------------------------------- fitting, synthetic

def test_roofline_fit_recovers_a_known_cpu_surface_and_predicts_left_out_points_within_the_noise():
    true = RooflineFit(peak=9e10, half=(12.0, 40.0, 25.0), overhead_s=4e-6)
    fit, report = roofline_with_report(_gemm_points(true, 60, 32, 4096, noise=0.03))
    assert fit.peak == pytest.approx(true.peak, rel=0.05)
    assert report.points == 60 and report.folds == 5
    assert report.median < 0.04 and report.max < 0.15       # 3% noise: left-out errors of that size


def test_leave_out_error_exposes_a_surface_the_form_cannot_express():
    """Times with a 3x cliff at k = 512 (a cache edge) no saturating curve follows: the
    report must say so rather than the in-sample fit hiding it."""
    rng = np.random.default_rng(2)
    dims = np.exp(rng.uniform(math.log(64), math.log(4096), (60, 3))).round()
    work = 2 * dims.prod(axis=1)
    t = work / 1e11 * np.where(dims[:, 2] > 512, 3.0, 1.0)
    _, report = roofline_with_report(Points.of(work, dims, t))
    assert report.median > 0.15


def test_gpu_surface_peak_is_the_asymptote_so_efficiency_never_exceeds_one():
    true = RooflineFit(peak=8e14, half=(200.0, 150.0, 100.0), overhead_s=3e-5, tile=128, sms=132, overlap=True)
    pts = _gemm_points(true, 60, 128, 16384, noise=0.02)
    fit, report = roofline_with_report(pts, sms=132, overlap=True)
    rates = pts.work / pts.seconds
    assert fit.peak == pytest.approx(true.peak, rel=0.08) and fit.tile == 128
    assert rates.max() <= fit.peak * 1.05
    assert all(0 < fit.efficiency(tuple(d)) <= 1.0 for d in pts.dims)
    assert report.median < 0.05


def test_asynchronous_launch_costs_the_larger_of_overhead_and_kernel_not_the_sum():
    fit = RooflineFit(peak=1e12, half=(0.0, 0.0, 0.0), overhead_s=30e-6, overlap=True)
    assert fit.seconds(1e6, (100, 100, 100)) == pytest.approx(30e-6)            # launch-bound: 1 us of work
    assert fit.seconds(1e8, (1000, 1000, 1000)) == pytest.approx(100e-6)        # kernel-bound
    cpu = RooflineFit(peak=1e12, half=(0.0, 0.0, 0.0), overhead_s=30e-6)
    assert cpu.seconds(1e8, (1000, 1000, 1000)) == pytest.approx(130e-6)        # synchronous: the sum


def test_peak_cap_keeps_a_form_below_the_forward_gemm_peak():
    true = RooflineFit(peak=8e14, half=(10.0, 400.0, 400.0), overhead_s=3e-5, overlap=True)
    pts = _gemm_points(true, 40, 64, 2048, noise=0.02)        # mostly far from saturation
    fit, _ = roofline_with_report(pts, overlap=True, peak_cap=6e14)
    assert fit.peak <= 6e14


def test_membound_fit_recovers_latency_and_bandwidth_per_pass():
    x = np.logspace(4, 8, 8)
    fit, report = fit_membound(x, 5e-6 + x / 2e10, 1.5 * x, 8e-6 + 1.5 * x / 1e10)
    assert fit.fwd == pytest.approx((5e-6, 1 / 2e10), rel=1e-6)
    assert fit.bwd == pytest.approx((8e-6, 1 / 1e10), rel=1e-6)
    assert fit.seconds("bwd", 1e6) == pytest.approx(8e-6 + 1e-4) and report.max < 1e-6


def test_membound_fit_takes_a_second_rate_past_the_last_level_cache():
    """An op streaming more than the cache holds runs at the memory's rate past it: the fit
    recovers both rates and the knee, and says the same of left-out sizes."""
    llc, x = 32e6, np.logspace(5, 8.3, 16)
    truth = MemboundFit(fwd=(4e-6, 1 / 1.2e11, 1 / 7e10), knee=llc)
    t = np.array([truth.seconds("fwd", b) for b in x])
    fit, report = fit_membound(x, t, knee=llc)
    assert fit.knee == llc and fit.fwd == pytest.approx(truth.fwd, rel=1e-6) and report.max < 1e-6
    line, line_report = fit_membound(x, t)                # no knee: one rate, which misses
    assert line.knee is None and len(line.fwd) == 2 and line_report.median > 0.05
    # all sizes in the cache: nothing to fit a second rate on, one rate, no knee
    inside, _ = fit_membound(x[x < llc], t[x < llc], knee=llc)
    assert inside.knee is None and inside.fwd == pytest.approx(truth.fwd[:2], rel=1e-6)
    # one size past it would set the second rate alone: one rate
    one_past = np.append(x[x < llc], x[-1])
    single, _ = fit_membound(one_past, [truth.seconds("fwd", b) for b in one_past], knee=llc)
    assert single.knee is None and len(single.fwd) == 2


def test_membound_fit_never_prices_past_the_cache_faster_and_keeps_a_flat_pass_flat():
    x = np.logspace(5, 8.3, 10)
    faster_beyond = MemboundFit(fwd=(4e-6, 1 / 7e10, 1 / 1.2e11), knee=32e6)     # not physical
    fit, _ = fit_membound(x, [faster_beyond.seconds("fwd", b) for b in x], knee=32e6)
    assert fit.knee is None and len(fit.fwd) == 2
    # a residual add's backward passes its gradient on: its time does not grow with its bytes
    fit, report = fit_membound(x, 1e-6 + x / 5e10, 1.5 * x, np.full(len(x), 1.2e-5), knee=32e6)
    assert fit.bwd == pytest.approx((1.2e-5, 0.0), abs=1e-12) and report.max < 1e-6


def test_a_membound_fit_round_trips_its_knee_and_refuses_a_third_number_without_one():
    fit = MemboundFit(fwd=(4e-6, 1e-11, 2e-11), bwd=(1e-5, 3e-11), points=8, knee=3.2e7)
    assert MemboundFit.from_dict("m", fit.to_dict()) == fit
    with pytest.raises(SpecError, match=r"m\.knee"):
        MemboundFit.from_dict("m", {"fwd": [4e-6, 1e-11, 2e-11]})
    with pytest.raises(SpecError, match=r"m\.knee"):
        MemboundFit.from_dict("m", {"fwd": [4e-6, 1e-11, 2e-11], "knee": -1})
    with pytest.raises(SpecError, match=r"m\.fwd"):
        MemboundFit.from_dict("m", {"fwd": [4e-6, 1e-11, 2e-11, 1.0], "knee": 3.2e7})


@pytest.mark.parametrize("per_op_s, two_terms", [(0.0, False), (40e-6, True)])
def test_composition_fit_keeps_the_per_op_term_only_where_it_predicts_left_out_stages(per_op_s, two_terms):
    priced = np.array([0.02, 0.05, 0.01, 0.08, 0.03])
    ops = np.array([150, 120, 400, 90, 300])
    fit = fit_composition(priced, ops, 1.15 * priced + per_op_s * ops)
    assert fit.factor == pytest.approx(1.15, rel=1e-3)
    assert (fit.per_op_s > 0) == two_terms and fit.per_op_s == pytest.approx(per_op_s, abs=1e-9)
    assert fit.report.points == 5 and fit.report.max < 1e-6


def test_a_composition_fit_never_keeps_a_factor_that_prices_the_ops_at_under_half_their_time():
    # stages whose measured time follows their op counts, not their ops' prices (a noisy machine):
    # the free two-term fit would price every op at ~0 and all of the stage per op
    priced = np.array([0.02, 0.05, 0.01, 0.08])
    ops = np.array([150, 120, 400, 90])
    measured = 3e-4 * ops
    from parsim.calibration.surface_fit import COMPOSITION_MIN_FACTOR, nonnegative_fit
    free = np.linalg.lstsq(np.stack([priced / measured, ops / measured], axis=1), np.ones(4), rcond=None)[0]
    assert free[0] < COMPOSITION_MIN_FACTOR and free[1] > 0
    assert nonnegative_fit(priced, ops, measured, True, COMPOSITION_MIN_FACTOR)[1] == 0.0   # one term instead
    fit = fit_composition(priced, ops, measured)
    assert fit.per_op_s == 0.0 and fit.factor == pytest.approx(nonnegative_fit(priced, ops, measured, False)[0])


def test_no_per_op_composition_term_over_stages_of_nearly_equal_op_counts():
    # the machine grid's stages' backward on a Zen 3 VM (2026-11-30): priced without composition,
    # op counts, measured (ms). Free, leave-one-out kept 0.684 x priced + 1.13 ms per op: the op
    # counts span 1.44x, too little to tell a per-op term from the factor
    priced = np.array([50.0, 61.8, 44.4, 66.5]) * 1e-3
    ops = np.array([24, 26, 18, 24])
    measured = np.array([59.5, 62.1, 54.4, 68.4]) * 1e-3
    from parsim.calibration.surface_fit import COMPOSITION_OPS_SPAN, nonnegative_fit
    assert ops.max() < COMPOSITION_OPS_SPAN * ops.min()
    assert nonnegative_fit(priced, ops, measured, True, 0.5)[1] > 5e-4      # what the free fit would keep
    fit = fit_composition(priced, ops, measured)
    assert fit.per_op_s == 0.0 and 1.0 < fit.factor < 1.25
    # counts that do span (one stage x3): a per-op term the stages follow is recovered
    spanning = ops * np.array([1, 3, 1, 1])
    spread = fit_composition(priced, spanning, 1.1 * priced + 1e-4 * spanning)
    assert spread.factor == pytest.approx(1.1, rel=1e-3) and spread.per_op_s == pytest.approx(1e-4, rel=1e-3)


# ----------------------------------------------------------------------------- real grids

def test_h100_grid_peaks_are_physical_and_fp16_is_no_longer_a_launch_bound_probe():
    s = fit_surfaces(load_grid("grid_h100.json"), "bf16", sms=132, overlap=True)
    linear = s.gemm["bf16"]["linear"]
    assert linear.peak < H100_BF16_DATASHEET
    for form, fit in s.gemm["bf16"].items():
        assert fit.peak <= linear.peak * (1 + 1e-9), form
    # fp16 and bf16 run the same tensor cores: peaks within 25% (the single-GEMM probe read 3x apart)
    assert s.gemm["fp16"]["linear"].peak == pytest.approx(linear.peak, rel=0.25)
    for dt, per in s.gemm.items():
        for form, fit in per.items():
            for p, summ in load_grid("grid_h100.json").gemm[dt]:
                if p.form == form:
                    assert p.flops / summ.median <= fit.peak * 1.2, (dt, form, p.key)
    assert s.report["gemm.bf16.linear"].median < 0.12


def test_quiet_cpu_grid_predicts_left_out_gemms_within_5_percent_median():
    s = fit_surfaces(load_grid("grid_cpu16_quiet.json"), "fp32")
    assert s.report["gemm.fp32.linear"].median < 0.05
    assert {"linear", "grad_input", "grad_weight", "bmm"} <= set(s.gemm["fp32"])
    assert set(s.gemm) == {"fp32", "bf16", "fp16"}
    assert "adamw" not in s.membound and s.rates["adamw"] > 0      # AdamW keeps the rate form (both engines)
    assert {"layernorm", "rmsnorm", "gelu", "swiglu", "softmax"} <= set(s.membound)


def test_a_cpu_batched_gemm_is_priced_as_batch_gemms_of_the_forward_surface_where_that_predicts_better():
    """Batched products measured as ``batch`` GEMMs of the linear surface plus a per-call and a
    per-element dispatch (torch's CPU bmm): the held form recovers both dispatch terms, and with
    ten points at 8 % noise it predicts the left-out ones better than the free
    5-parameter surface, so the grid's bmm surface is the held one."""
    from parsim.calibration.machine_fit import Surfaces, batched_on_linear, gemm_surfaces
    linear = RooflineFit(peak=1.5e11, half=(20.0, 25.0, 6.0), overhead_s=2e-6)
    lin = _gemm_points(linear, 40, 32, 2048, noise=0.02)

    def batched(n: int, noise: float, seed: int) -> Points:
        rng = np.random.default_rng(seed)
        dims = np.exp(rng.uniform(math.log(16), math.log(256), (n, 3))).round()
        batch = rng.integers(1, 32, n).astype(float)
        work = 2 * dims.prod(axis=1) * batch
        t = np.array([6e-6 + b * 1.5e-7 + w / (linear.peak * linear.efficiency(tuple(d)))
                      for w, d, b in zip(work, dims, batch)]) * np.exp(rng.normal(0, noise, n))
        return Points.of(work, dims, t, batch)
    fit, report = batched_on_linear(batched(24, 0.02, 3), linear)
    assert fit.overhead_s == pytest.approx(6e-6, rel=0.3) and fit.per_batch_s == pytest.approx(1.5e-7, rel=0.3)
    assert (fit.peak, fit.half) == (linear.peak, linear.half) and report.median < 0.03
    bmm = batched(10, 0.08, 7)
    grid = {"fp32": [(GemmPoint(tuple(d), 1, "linear", "g"), Summary(x, x, x, 3))
                     for d, x in zip(lin.dims, lin.seconds)]
            + [(GemmPoint(tuple(d), int(b), "bmm", "g"), Summary(x, x, x, 3))
               for d, b, x in zip(bmm.dims, bmm.batch, bmm.seconds)]}
    out = Surfaces()
    gemm_surfaces(grid, "fp32", None, False, out)
    free = roofline_with_report(bmm, per_batch=True, peak_cap=out.gemm["fp32"]["linear"].peak)[1]
    assert out.gemm["fp32"]["bmm"].half == out.gemm["fp32"]["linear"].half
    assert out.report["gemm.fp32.bmm"].median < free.median


# ----------------------------------------------------------------------------- the grid

def test_gemm_grid_is_seeded_capped_and_spread_over_decades_of_work():
    cap = 100e9 * 0.025
    grid = gemm_grid("cpu", "linear", 48, cap)
    assert grid == gemm_grid("cpu", "linear", 48, cap)
    flops = np.log10([p.flops for p in grid])
    assert len(grid) == 48 and max(flops) <= math.log10(cap) and max(flops) - min(flops) > 3.5
    assert all(p.form == "bmm" and p.batch >= 1 for p in gemm_grid("cuda", "bmm", 12, 3e12))
    assert len(attention_grid("cpu", 12, cap)) == 12
    assert {p.name for p in membound_grid("cpu", "fp32", 3)} >= {"layernorm", "rmsnorm", "adamw", "embedding"}


def test_synthetic_stages_are_none_of_the_held_out_models():
    held_out = [load_model(str(p)) for p in (Path(__file__).parents[1] / "studies/validation_cpu/heldout")
                .glob("model_*.yaml")]
    assert len(held_out) >= 3

    def layer(m):
        return (m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.seq_len, m.activation, m.norm)
    for device in ("cpu", "cuda"):
        for spec, _ in STAGES[device]:
            assert all(layer(spec) != layer(h) for h in held_out), spec.name
        assert reference_layer(device)[0].layers >= 1


# ----------------------------------------------------------------------------- pricing with the surfaces

def _device(**tables) -> DeviceProfile:
    return DeviceProfile("t", {"fp32": 1e11}, 1e10, 1e10, kernel_overhead_s=1e-6, tables=CalibratedTables(**tables))


def test_gemm_time_prices_unmeasured_shapes_on_the_surface_and_measured_ones_exactly():
    fit = RooflineFit(peak=1e11, half=(16.0, 16.0, 16.0), overhead_s=5e-6)
    dev = _device(gemm_surface={"fp32": {"linear": fit}}, gemm={"fp32": GemmTable(((128, 512, 512, 4e10),))})
    assert gemm_time(dev, 300, 700, 900, "fp32") == pytest.approx(fit.seconds(2 * 300 * 700 * 900, (300, 700, 900)))
    assert gemm_time(dev, 128, 512, 512, "fp32") == pytest.approx(2 * 128 * 512 * 512 / 4e10 + 1e-6)
    # a form without its own surface takes the linear one; batched products the bmm one
    assert gemm_time(dev, 64, 64, 64, "fp32", form="grad_weight") == pytest.approx(fit.seconds(2 * 64**3, (64,) * 3))


def test_norm_ops_are_priced_by_their_kernel_and_composition_adds_seconds_per_op_that_runs():
    ln, rms = MemboundFit(fwd=(1e-6, 1e-10), bwd=(2e-6, 2e-10)), MemboundFit(fwd=(9e-6, 3e-10), bwd=(9e-6, 6e-10))
    dev = _device(membound_surface={"layernorm": ln, "rmsnorm": rms})
    for model, fit in (("cpu-small", ln), ("llama2-7b", rms)):
        op = next(o for o in layer_ops(load_model(model), Plan(dtype="fp32")) if o.name == "input_norm")
        assert op_time(dev, op, "fwd", "fp32") == pytest.approx(fit.seconds("fwd", op.fwd_bytes))
        assert op_time(dev, op, "bwd", "fp32") == pytest.approx(fit.seconds("bwd", op.bwd_bytes))
    composed = _device(membound_surface={"layernorm": ln},
                       layer_composition=LayerComposition(1.1, 1.2, per_op_fwd_s=5e-5, per_op_bwd_s=7e-5))
    op = Op("input_norm", "membound", 0, 0, 0, fwd_bytes=1e6, bwd_bytes=1.5e6, impl="layernorm")
    assert op_time(composed, op, "fwd", "fp32") == pytest.approx(1.1 * ln.seconds("fwd", 1e6) + 5e-5)
    assert op_time(composed, op, "bwd", "fp32") == pytest.approx(1.2 * ln.seconds("bwd", 1.5e6) + 7e-5)
    assert op_time(composed, op, "bwd_weight", "fp32") == 0.0       # nothing runs: no per-op seconds


def test_surfaces_round_trip_through_a_profile_and_malformed_ones_are_spec_errors():
    tables = CalibratedTables(
        gemm_surface={"fp32": {"linear": RooflineFit(1e11, (1.0, 2.0, 3.0), 1e-6, tile=128, sms=132, overlap=True,
                                                     points=40)}},
        membound_surface={"gelu": MemboundFit((1e-6, 1e-10), (2e-6, 2e-10), points=8)},
        layer_composition=LayerComposition(1.1, 1.05, per_op_fwd_s=2e-5))
    assert CalibratedTables.from_dict(tables.to_dict()) == tables
    with pytest.raises(SpecError, match="gemm_surface.fp32.linear"):
        CalibratedTables.from_dict({"gemm_surface": {"fp32": {"linear": {"peak": -1, "half": [1], "overhead_s": 0}}}})
    with pytest.raises(SpecError, match="membound_surface.gelu.fwd"):
        CalibratedTables.from_dict({"membound_surface": {"gelu": {"bwd": [1, 2]}}})


def test_host_id_tells_apart_two_boots_of_one_cloned_vm(monkeypatch):
    from parsim.calibration import machine
    files = {"/etc/machine-id": "same-image", "/proc/sys/kernel/random/boot_id": "boot-a"}
    monkeypatch.setattr(machine, "_read", lambda path: files[path])
    a = machine.host_id()
    assert a == machine.host_id()
    files["/proc/sys/kernel/random/boot_id"] = "boot-b"
    assert machine.host_id() != a


def test_a_calibration_that_shared_the_cpu_warns_and_an_idle_one_does_not():
    import warnings

    from parsim.calibration.machine import BusyMachineWarning, warn_if_busy
    with pytest.warns(BusyMachineWarning, match="1.20 of .* cores busy"):
        warn_if_busy({"other_cores_busy": 1.2, "steal_fraction": 0.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_busy({"other_cores_busy": 0.1, "steal_fraction": 0.0})
        warn_if_busy(None)
