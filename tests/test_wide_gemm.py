"""A CPU GEMM's rate falling with its output's width (``RooflineFit.wide``): the factor, its
fit from synthetic points, a CPU calibration fitting it (a GPU's never), points without the fall
priced as before, its round trip through a profile and the pricing of a wide GEMM by it."""
from __future__ import annotations

import numpy as np
import pytest

from parsim.calibration.fit import Summary
from parsim.calibration.machine_fit import Surfaces, gemm_surfaces
from parsim.calibration.shapes import GemmPoint
from parsim.calibration.surface_fit import Points, roofline_with_report
from parsim.costs.timing import gemm_time
from parsim.specs import CalibratedTables, DeviceProfile, SpecError
from parsim.specs.surfaces import RooflineFit

PLAIN = RooflineFit(peak=7e10, half=(18.0, 14.0, 16.0), overhead_s=5e-6)
WIDE = RooflineFit(peak=7e10, half=(18.0, 14.0, 16.0), overhead_s=5e-6, wide=25000.0)


def _dims(n: int, seed: int) -> np.ndarray:
    """(m, n, k) log-uniform over 32..4096 tokens and 32..32768 widths (the CPU grid's ranges)."""
    rng = np.random.default_rng(seed)
    lo, hi = np.log([32, 32, 32]), np.log([4096, 32768, 32768])
    return np.exp(rng.uniform(lo, hi, (n, 3))).round()


def _points(true: RooflineFit, n: int, noise: float, seed: int = 3) -> Points:
    dims = _dims(n, seed)
    work = 2 * dims.prod(axis=1)
    t = np.array([true.seconds(w, tuple(d)) for w, d in zip(work, dims)])
    return Points.of(work, dims, t * np.exp(np.random.default_rng(seed + 1).normal(0, noise, n)))


def test_the_rate_halves_at_the_wide_width_and_only_n_moves_it():
    dims = (256.0, 2000.0, 512.0)
    assert WIDE.efficiency(dims) == pytest.approx(PLAIN.efficiency(dims) / (1 + 2000 / 25000))
    assert WIDE.efficiency((256.0, 25000.0, 512.0)) == pytest.approx(PLAIN.efficiency((256.0, 25000.0, 512.0)) / 2)
    # m and k as wide as n leave the factor where n puts it
    assert WIDE.efficiency((25000.0, 2000.0, 25000.0)) / PLAIN.efficiency((25000.0, 2000.0, 25000.0)) \
        == pytest.approx(1 / (1 + 2000 / 25000))
    assert WIDE.seconds(1e9, (128.0, 16384.0, 256.0)) > PLAIN.seconds(1e9, (128.0, 16384.0, 256.0)) * 1.5


def test_the_fit_recovers_the_width_and_predicts_left_out_points_the_plain_form_misses():
    pts = _points(WIDE, 60, noise=0.03)
    wide, wide_report = roofline_with_report(pts, wide=True)
    plain, plain_report = roofline_with_report(pts)
    assert wide.wide == pytest.approx(25000, rel=0.3)
    assert wide.peak == pytest.approx(7e10, rel=0.1)
    assert wide_report.median < 0.04                      # 3 % noise
    assert plain_report.median > 1.5 * wide_report.median and plain.wide is None


def _grid(true: RooflineFit, seed: int) -> dict[str, list]:
    pts = _points(true, 48, noise=0.03, seed=seed)
    return {"fp32": [(GemmPoint(tuple(int(x) for x in d), 1, "linear", "grid"), Summary(float(t), float(t), float(t), 5))
                     for d, t in zip(pts.dims, pts.seconds)]}


def test_a_cpu_calibration_keeps_the_width_where_its_points_fall_with_it_and_a_gpu_never_fits_one():
    out = Surfaces()
    gemm_surfaces(_grid(WIDE, 5), "fp32", None, False, out)
    assert out.gemm["fp32"]["linear"].wide == pytest.approx(25000, rel=0.3)
    gpu = Surfaces()
    gemm_surfaces(_grid(WIDE, 5), "fp32", 132, True, gpu)
    assert gpu.gemm["fp32"]["linear"].wide is None


def test_points_without_the_fall_are_priced_as_the_plain_form_prices_them():
    """Where nothing falls with n the fitted width lies so far past the widest point that no
    price moves from the plain form's."""
    out = Surfaces()
    grid = _grid(PLAIN, 7)
    gemm_surfaces(grid, "fp32", None, False, out)
    kept = out.gemm["fp32"]["linear"]
    plain, _ = roofline_with_report(_points(PLAIN, 48, noise=0.03, seed=7))
    for p, _s in grid["fp32"]:
        assert kept.seconds(p.flops, p.key) == pytest.approx(plain.seconds(p.flops, p.key), rel=0.03)


def test_the_width_round_trips_through_a_profile_and_a_bad_one_is_named():
    tables = CalibratedTables(gemm_surface={"fp32": {"linear": WIDE}})
    assert CalibratedTables.from_dict(tables.to_dict()) == tables
    assert "wide" not in CalibratedTables(gemm_surface={"fp32": {"linear": PLAIN}}).to_dict()["gemm_surface"]["fp32"]["linear"]
    for bad in (0, -5):
        with pytest.raises(SpecError, match=r"gemm_surface\.fp32\.linear\.wide"):
            CalibratedTables.from_dict({"gemm_surface": {"fp32": {"linear": {
                "peak": 1e11, "half": [1, 2, 3], "overhead_s": 0, "wide": bad}}}})


def test_an_lm_heads_gemm_is_priced_by_the_width_a_layers_barely():
    dev = lambda fit: DeviceProfile("t", {"fp32": 1e11}, 1e10, 1e10, kernel_overhead_s=0.0,   # noqa: E731
                                    tables=CalibratedTables(gemm_surface={"fp32": {"linear": fit}}))
    head = gemm_time(dev(WIDE), 128, 16384, 256, "fp32") / gemm_time(dev(PLAIN), 128, 16384, 256, "fp32")
    layer = gemm_time(dev(WIDE), 128, 768, 256, "fp32") / gemm_time(dev(PLAIN), 128, 768, 256, "fp32")
    assert head == pytest.approx(1 + 16384 / 25000, rel=0.01)
    assert layer == pytest.approx(1 + 768 / 25000, rel=0.01) and layer < 1.04


def test_a_cpu_grid_holds_lm_head_gemms_in_each_unbatched_form_and_a_gpu_grid_none():
    from parsim.calibration.grid import HEAD_SHARE, HEAD_VOCAB, gemm_grid
    cap = 70e9 * 0.025
    for form, vocab_axis in (("linear", 1), ("grad_input", 2), ("grad_weight", 1)):
        grid = gemm_grid("cpu", form, 48, cap)
        heads = [p for p in grid if p.source.endswith("head")]
        assert len(grid) == 48 and len(heads) == 48 // HEAD_SHARE
        assert all(p.key[vocab_axis] >= HEAD_VOCAB[0] and p.flops <= cap for p in heads)
        assert len({p.key for p in heads}) == len(heads)
    assert not [p for p in gemm_grid("cpu", "bmm", 24, cap) if p.source.endswith("head")]
    assert not [p for p in gemm_grid("cuda", "linear", 48, 1e12) if p.source.endswith("head")]
