"""Pure fitting of micro-benchmark samples into the numbers the simulator consumes.

* ``summarize``: median and p10/p90 of repeated samples (robust to the one-off stalls a
  shared VM produces; the median is what the simulator uses, the spread is recorded).
* ``fit_alpha_beta``: time = alpha + beta * nbytes (Hockney 1994, "The communication
  challenge for MPP": the alpha-beta / latency-bandwidth model).
* ``fit_alpha_beta_knee``: the same line up to a message size where the bytes start to cost
  more (the buffers no longer fit the last-level cache), another slope beyond it.
* ``fit_gemm_efficiency``: eff = max_efficiency * prod_d d / (d + half_dim), the curve of
  ``parsim.specs.GemmEfficiency``.

No torch, no I/O: everything here takes numbers and returns numbers.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from parsim.specs.surfaces import bytes_time


@dataclass(frozen=True)
class Summary:
    """Median, mean and spread of repeated measurements of one quantity (seconds); ``mean``
    None where only the median was kept (a summary of summaries)."""

    median: float
    p10: float
    p90: float
    n: int
    mean: float | None = None

    @property
    def rel_spread(self) -> float:
        """(p90 - p10) / median: the relative width of the central 80% of the samples."""
        return (self.p90 - self.p10) / self.median if self.median > 0 else 0.0


def summarize(samples: Sequence[float]) -> Summary:
    if len(samples) == 0:
        raise ValueError("no samples to summarize")
    a = np.asarray(samples, dtype=float)
    p10, med, p90 = np.percentile(a, [10, 50, 90])
    return Summary(median=float(med), p10=float(p10), p90=float(p90), n=len(a), mean=float(a.mean()))


# Fewest samples a median and p10/p90 are taken over.
MIN_SAMPLES = 3


def sampling_plan(first_s: float, repeats: int, budget_s: float, min_sample_s: float) -> tuple[int, int]:
    """(calls per sample, samples) for an op whose one call took ``first_s`` seconds."""
    first_s = max(first_s, 1e-9)
    inner = max(1, math.ceil(min_sample_s / first_s))
    return inner, max(MIN_SAMPLES, min(repeats, int(budget_s / (first_s * inner))))


class FitWarning(UserWarning):
    """A calibration fit whose data could not give a physical number as measured (a
    non-positive slope over the large messages): the fit keeps a bound and says so."""


@dataclass(frozen=True)
class AlphaBeta:
    """time = alpha + beta * nbytes; ``rms_rel`` is the rms relative residual of the fit over
    every point, ``bandwidth_points`` how many of the largest sizes ``beta`` was fitted on, and
    ``warning`` says why ``beta`` is a bound rather than a fit (None when it is a fit)."""

    alpha: float      # seconds, >= 0
    beta: float       # seconds per byte, > 0
    rms_rel: float
    bandwidth_points: int = 0
    warning: str | None = None
    knee: float | None = None           # bytes; None: one line over every size
    beta_beyond: float | None = None    # seconds per byte beyond ``knee``

    def time(self, nbytes):
        """Seconds for ``nbytes`` (a number or an array; ``specs.surfaces.bytes_time``)."""
        return self.alpha + bytes_time(nbytes, self.beta, self.knee, self.beta_beyond)


# A knee is kept only where the bytes beyond it cost at least this much more than below it (a
# cache level ending: gloo's all-gather on the 2-core Xeon VM of 11-27/28 moved 0.63-0.75 GB/s
# on 2 ranks up to 16 MiB per rank and 0.32-0.45 beyond, 0.17-0.22 and 0.09-0.12 on 4 ranks
# past 8 MiB; profiles under studies/validation_cpu/heldout/run_2026112*), where the two lines
# leave at most ``KNEE_KEEP`` of the one line's rms relative residual over the sizes of
# ``KNEE_MIN_BYTES`` or more, and at such a size: cache levels end at megabytes (2 MiB L2 per
# core, a last-level cache of tens to hundreds), while what changes below (latency, protocols)
# is the line's alpha. The residuals are compared where a knee can act, not over every size:
# below a megabyte gloo's latency sways 2-3x from sample to sample on a 2-vCPU VM (p10-p90 of
# 0.2-1.1 ms at 4-512 KiB, the AMD VM of 11-29), which both fits share and which hid a
# 2x-per-byte knee at 8-16 MiB on 2 ranks there (``studies/validation_cpu/collective_knee.txt``).
KNEE_SLOWER = 1.25
KNEE_KEEP = 0.75
KNEE_MIN_BYTES = 2**20


def fit_alpha_beta_knee(nbytes: Sequence[float], seconds: Sequence[float]) -> AlphaBeta:
    """``fit_alpha_beta`` over the sizes up to a knee, and beyond it a second slope from the
    line's time at the knee (so the two meet): time = alpha + beta * min(x, knee) +
    beta_beyond * max(x - knee, 0) [s]. The knee is the measured size (at least three at or
    below it, two above) whose two lines fit the sizes of ``KNEE_MIN_BYTES`` or more best, kept
    under the ``KNEE_*`` rules; otherwise the one line of ``fit_alpha_beta`` (``knee`` None).
    beta_beyond is the relative least-squares slope of the sizes above the knee through the
    line's time there."""
    line = fit_alpha_beta(nbytes, seconds)
    x = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    order = np.argsort(x, kind="stable")
    x, t = x[order], t[order]
    large = x >= KNEE_MIN_BYTES

    def rms_large(fit: AlphaBeta) -> float:
        return float(np.sqrt(np.mean(((fit.time(x[large]) - t[large]) / t[large]) ** 2)))

    best, best_large = None, None
    for k in range(2, len(x) - 2):
        if x[k] < KNEE_MIN_BYTES:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FitWarning)
            below = fit_alpha_beta(x[:k + 1], t[:k + 1])
        at_knee, dx, w = below.time(x[k]), x[k + 1:] - x[k], 1.0 / t[k + 1:] ** 2
        slope = float(np.sum(w * (t[k + 1:] - at_knee) * dx) / np.sum(w * dx * dx))
        if below.warning or not slope >= KNEE_SLOWER * below.beta:
            continue
        fit = AlphaBeta(alpha=below.alpha, beta=below.beta, rms_rel=0.0, bandwidth_points=below.bandwidth_points,
                        knee=float(x[k]), beta_beyond=slope)
        residual = rms_large(fit)
        if best is None or residual < best_large:
            rms = float(np.sqrt(np.mean(((fit.time(x) - t) / t) ** 2)))
            best, best_large = AlphaBeta(**{**fit.__dict__, "rms_rel": rms}), residual
    return best if best is not None and best_large <= KNEE_KEEP * rms_large(line) else line


def _relative_lstsq(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(alpha, beta) minimising sum(((alpha + beta x - t) / t)^2): every size weighs alike."""
    w = 1.0 / t
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    return float(alpha), float(beta)


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float]) -> AlphaBeta:
    """time = alpha + beta * nbytes (Hockney 1994), fitted so that it cannot go non-physical.

    1. Where bandwidth dominates: the sizes at or above the half-performance length
       n_1/2 = alpha / beta (Hockney 1994: the size at which latency and transfer cost the
       same) of a first least-squares fit on relative residuals; at least the two largest
       sizes, and from the fastest size up when the first fit has no positive slope.
    2. beta [s/byte]: the slope of a relative least-squares fit over those sizes only, so small
       messages that run slower than a 1 MiB one (a cache or protocol switch, a noisy first
       call) cannot pull it to zero or below. A non-positive slope there is refused as a fit:
       beta becomes t / x of the largest message (the bandwidth it reached at least, latency
       included, so an upper bound on beta), ``warning`` says so and a FitWarning is issued.
    3. alpha [s]: the median over the sizes below n_1/2 (all sizes when none is) of
       t - beta * x, kept >= 0.
    ``rms_rel`` is the rms relative residual over every point."""
    x = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if len(x) != len(t) or len(x) < 2:
        raise ValueError("need at least two (nbytes, seconds) points")
    if not (np.all(np.isfinite(t)) and np.all(t > 0) and np.all(np.isfinite(x)) and np.all(x > 0)):
        raise ValueError("sizes and times must be positive and finite")
    order = np.argsort(x, kind="stable")
    x, t = x[order], t[order]
    alpha0, beta0 = _relative_lstsq(x, t)
    if beta0 > 0:
        large = x >= max(alpha0, 0.0) / beta0
    else:                           # no slope overall: from the fastest size up, where time grows
        large = x >= x[int(np.argmin(t))]
    large[-2:] = True
    alpha1, beta = _relative_lstsq(x[large], t[large])
    warning = None
    if not beta > 0:
        warning = (f"non-positive slope {beta:.3g} s/byte over the {int(large.sum())} largest messages "
                   f"({x[large][0]:.0f}..{x[-1]:.0f} bytes); kept beta = t/x of the largest, an upper bound")
        beta = float(t[-1] / x[-1])
        warnings.warn(FitWarning(warning), stacklevel=2)
    small = ~large if np.any(~large) else np.ones_like(large)
    alpha = max(0.0, float(np.median(t[small] - beta * x[small])))
    rel = (alpha + beta * x - t) / t
    return AlphaBeta(alpha=alpha, beta=float(beta), rms_rel=float(np.sqrt(np.mean(rel ** 2))),
                     bandwidth_points=int(large.sum()), warning=warning)


@dataclass(frozen=True)
class GemmCurve:
    max_efficiency: float
    half_dim: float
    rms_log: float    # rms of log(measured / fitted) rate over the table


def fit_gemm_efficiency(shapes: Sequence[tuple[float, float, float]], rates: Sequence[float],
                        peak: float) -> GemmCurve:
    """Fit eff = max_eff * prod_d d / (d + h) to measured rates / peak (log-space least squares).

    For a fixed h the best log(max_eff) is the mean log residual, so h is found by a
    golden-section search on a log scale (the error is unimodal in h in practice) and
    max_eff follows in closed form.
    """
    if len(shapes) == 0 or len(shapes) != len(rates):
        raise ValueError("need one rate per GEMM shape")
    dims = np.asarray(shapes, dtype=float)
    log_eff = np.log(np.asarray(rates, dtype=float) / peak)

    def residual(h: float) -> tuple[float, float]:
        log_occ = np.sum(np.log(dims / (dims + h)), axis=1)
        log_max = float(np.mean(log_eff - log_occ))
        err = log_eff - log_occ - log_max
        return float(np.sqrt(np.mean(err ** 2))), log_max

    lo, hi = math.log(1.0), math.log(1e5)      # a half-rate dimension between 1 and 1e5
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    for _ in range(80):
        if residual(math.exp(a))[0] < residual(math.exp(b))[0]:
            hi, b = b, a
            a = hi - g * (hi - lo)
        else:
            lo, a = a, b
            b = lo + g * (hi - lo)
    h = math.exp((lo + hi) / 2)
    rms, log_max = residual(h)
    return GemmCurve(max_efficiency=math.exp(log_max), half_dim=h, rms_log=rms)


def log_spaced_sizes(smallest: int, largest: int, factor: int) -> list[int]:
    """smallest, smallest*factor, ... up to and including largest (bytes)."""
    if smallest <= 0 or largest < smallest or factor < 2:
        raise ValueError("need 0 < smallest <= largest and factor >= 2")
    sizes = [smallest]
    while sizes[-1] * factor <= largest:
        sizes.append(sizes[-1] * factor)
    return sizes
