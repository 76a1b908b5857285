"""Issue 23, item 6: the alpha-beta fit cannot go non-physical. Asserted on the fit itself,
with synthetic measured points (no timing): beta comes from the sizes where bandwidth
dominates, the residual is reported, a non-positive slope there is refused with a warning
and a bound, and whatever the points, alpha >= 0 and beta > 0."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsim.calibration import fit_alpha_beta, fit_gemm_efficiency, summarize
from parsim.calibration.fit import FitWarning, _relative_lstsq, log_spaced_sizes
from parsim.specs import GemmEfficiency

ALPHA, BETA = 5e-5, 1e-9        # 50 us, 1 GB/s


@pytest.mark.parametrize("largest, slow_s", [(2**22, 4e-3), (2**24, 2e-3), (2**26, 4e-3)])
def test_small_messages_slower_than_a_mebibyte_do_not_pull_the_slope_down(largest, slow_s):
    """The fresh-clone failure: small messages slower than 1 MiB ones. A joint fit over every
    size gives a slope well off (or below zero: the old fit clamped it to 0); the fit over the
    bandwidth-dominated sizes recovers beta."""
    sizes = log_spaced_sizes(4096, largest, 2)
    times = [slow_s if x < 2**20 else ALPHA + BETA * x for x in sizes]
    _, joint_beta = _relative_lstsq(np.array(sizes, float), np.array(times))
    assert joint_beta < 0.7 * BETA                           # the joint fit is misled ...
    fit = fit_alpha_beta(sizes, times)
    assert fit.beta == pytest.approx(BETA, rel=1e-6)         # ... this one is not
    assert fit.warning is None and fit.bandwidth_points >= 2
    assert fit.rms_rel > 0.2                                 # and the residual says the points are not one line


def test_exact_points_give_a_zero_residual_and_the_true_numbers():
    sizes = log_spaced_sizes(4096, 2**26, 2)
    fit = fit_alpha_beta(sizes, [ALPHA + BETA * x for x in sizes])
    assert fit.alpha == pytest.approx(ALPHA, rel=1e-6) and fit.beta == pytest.approx(BETA, rel=1e-9)
    assert fit.rms_rel < 1e-9


def test_a_non_positive_slope_where_bandwidth_should_dominate_is_refused_with_a_warning_and_a_bound():
    sizes = log_spaced_sizes(4096, 2**20, 4)
    times = [2.0e-3, 2.1e-3, 1.9e-3, 2.0e-3, 1.5e-3]         # noise only: time falls with size
    with pytest.warns(FitWarning, match="non-positive slope"):
        fit = fit_alpha_beta(sizes, times)
    assert fit.beta == pytest.approx(times[-1] / sizes[-1])  # the bandwidth the largest reached, at least
    assert fit.warning and "upper bound" in fit.warning and fit.alpha >= 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(1.0, 1e10), st.floats(1e-7, 10.0)), min_size=2, max_size=12,
                unique_by=lambda p: p[0]))
def test_any_positive_points_give_a_physical_fit(points):
    sizes, times = zip(*points)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitWarning)      # may be issued: the bound is checked below
        fit = fit_alpha_beta(sizes, times)
    assert fit.alpha >= 0 and math.isfinite(fit.alpha)
    assert fit.beta > 0 and math.isfinite(fit.beta)
    assert math.isfinite(fit.rms_rel) and fit.rms_rel >= 0
    assert all(fit.time(x) > 0 for x in sizes)


@pytest.mark.parametrize("sizes, times", [([1, 2], [1e-3, math.nan]), ([1, 2], [1e-3, 0.0]), ([0, 2], [1e-3, 2e-3]),
                                          ([1], [1e-3])])
def test_points_that_cannot_be_fitted_are_refused(sizes, times):
    with pytest.raises(ValueError):
        fit_alpha_beta(sizes, times)


# ----------------------------------------------------------------------------- known curves

def test_alpha_beta_fit_recovers_known_alpha_and_beta_within_1_percent():
    sizes = log_spaced_sizes(4096, 64 * 2**20, 2)
    alpha, beta = 6e-4, 1 / 0.9e9
    rng = np.random.default_rng(0)
    noisy = [(alpha + beta * x) * (1 + rng.uniform(-0.003, 0.003)) for x in sizes]
    for times in ([alpha + beta * x for x in sizes], noisy):
        fit = fit_alpha_beta(sizes, times)
        assert fit.alpha == pytest.approx(alpha, rel=0.01)
        assert fit.beta == pytest.approx(beta, rel=0.01)


def test_alpha_beta_fit_weighs_small_messages_so_alpha_is_not_lost_in_large_message_noise():
    sizes = log_spaced_sizes(4096, 64 * 2**20, 4)
    alpha, beta = 5e-4, 1e-9
    times = [alpha + beta * x for x in sizes]
    times[-1] *= 1.10     # 10% noise on the 64 MiB point would swamp alpha in plain least squares
    fit = fit_alpha_beta(sizes, times)
    assert fit.alpha == pytest.approx(alpha, rel=0.05)


def test_alpha_beta_fit_never_returns_a_negative_latency():
    sizes = log_spaced_sizes(4096, 2**24, 2)
    fit = fit_alpha_beta(sizes, [2e-9 * x * (0.9 if x < 2**16 else 1.0) for x in sizes])
    assert fit.alpha >= 0 and fit.beta > 0


def test_gemm_efficiency_fit_recovers_the_saturating_curve():
    curve = GemmEfficiency(max_efficiency=0.8, half_dim=64)
    shapes = [(m, n, k) for m in (32, 128, 512) for n in (64, 256, 2048) for k in (16, 512)]
    peak = 1e11
    rates = [peak * curve.efficiency(*s) for s in shapes]
    fit = fit_gemm_efficiency(shapes, rates, peak)
    assert fit.max_efficiency == pytest.approx(0.8, rel=0.01)
    assert fit.half_dim == pytest.approx(64, rel=0.01)


def test_summary_is_the_median_with_p10_p90_spread():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median == 3.0 and s.p10 < s.median < s.p90 and s.n == 5
