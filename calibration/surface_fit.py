"""Pure fitting of the machine grid's measurements into the surfaces of ``parsim.specs.surfaces``,
and each fit's leave-out error.

* ``fit_roofline``: seconds = overhead + batch x per-batch + work / (peak x prod_i d_i / (d_i + h_i)
  x waves), least squares on log seconds (every point's *relative* error counts alike, from a
  10-microsecond GEMM to a 30-millisecond one) by Levenberg-Marquardt (Marquardt 1963) over the
  logarithms of the parameters, so each stays positive; on a GPU the output tile of the wave
  quantisation is chosen among 64/128/256 by the same residual.
* ``fit_membound``: alpha + beta x bytes per pass (``fit.fit_alpha_beta``).
* ``leave_out``: k-fold cross-validation: every point predicted by the fit of the other folds,
  |predicted / measured - 1| summarised (``specs.surfaces.LeaveOut``).
* ``fit_composition``: a pass's measured seconds = c x its ops' priced sum + tau x its op count,
  over the synthetic stages, with leave-one-out.

No torch, no I/O: numbers in, fits out.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from parsim.specs.surfaces import LeaveOut, MemboundFit, RooflineFit

from .fit import FitWarning, fit_alpha_beta

FOLDS = 5
GPU_TILES = (64, 128, 256)        # square output tiles cuBLAS / CUTLASS kernels use


def levenberg_marquardt(residual: Callable[[np.ndarray], np.ndarray], theta: np.ndarray,
                        iterations: int = 200, tol: float = 1e-10) -> tuple[np.ndarray, float]:
    """Minimise sum(residual(theta)^2) (Marquardt 1963, SIAM J. Appl. Math. 11(2)); forward
    differences for the Jacobian. Returns (theta, sum of squares)."""
    theta = np.asarray(theta, dtype=float).copy()
    r = residual(theta)
    cost, lam = float(r @ r), 1e-3
    for _ in range(iterations):
        jac = np.empty((len(r), len(theta)))
        for j in range(len(theta)):
            step = np.zeros_like(theta)
            step[j] = 1e-6 * max(1.0, abs(theta[j]))
            jac[:, j] = (residual(theta + step) - r) / step[j]
        grad, hess = jac.T @ r, jac.T @ jac
        improved = False
        while lam < 1e12:
            delta = np.linalg.solve(hess + lam * np.diag(np.diag(hess) + 1e-12), -grad)
            trial = theta + delta
            r_trial = residual(trial)
            c_trial = float(r_trial @ r_trial)
            if np.isfinite(c_trial) and c_trial < cost:
                done = cost - c_trial < tol * max(cost, 1e-30)
                theta, r, cost, lam, improved = trial, r_trial, c_trial, max(lam / 10, 1e-12), True
                break
            lam *= 10
        if not improved or done:
            break
    return theta, cost


@dataclass(frozen=True)
class Points:
    """Measured points of one surface: work (FLOP), dims per point, batch, seconds."""
    work: np.ndarray
    dims: np.ndarray        # (points, dimensions)
    batch: np.ndarray
    seconds: np.ndarray

    @classmethod
    def of(cls, work: Sequence[float], dims: Sequence[Sequence[float]], seconds: Sequence[float],
           batch: Sequence[float] | None = None) -> "Points":
        work_a = np.asarray(work, dtype=float)
        return cls(work_a, np.asarray(dims, dtype=float).reshape(len(work_a), -1),
                   np.ones_like(work_a) if batch is None else np.asarray(batch, dtype=float),
                   np.asarray(seconds, dtype=float))

    def __len__(self) -> int:
        return len(self.work)

    def take(self, idx: np.ndarray) -> "Points":
        return Points(self.work[idx], self.dims[idx], self.batch[idx], self.seconds[idx])


def _waves(points: Points, tile: int | None, sms: int | None) -> np.ndarray:
    if not tile or not sms:
        return np.ones(len(points))
    tiles = np.ceil(points.dims[:, 0] / tile) * np.ceil(points.dims[:, 1] / tile) * points.batch
    return tiles / (np.ceil(tiles / sms) * sms)


@dataclass(frozen=True)
class Form:
    """What a surface fit holds fixed: a per-batch term, a GPU's SMs (wave quantisation),
    asynchronous launches (``RooflineFit.overlap``), half-saturation sizes (None: fitted)."""
    per_batch: bool = False
    sms: int | None = None
    overlap: bool = False
    half: tuple[float, ...] | None = None
    peak_cap: float | None = None      # the peak stays below it (another form's asymptote on the same units)

    def params(self, dims: int) -> int:
        """Parameters fitted: peak, overhead, one half-size per dimension unless fixed(, per batch)."""
        return 2 + (0 if self.half else dims) + int(self.per_batch)


def _unpack(theta: np.ndarray, dims: int, form: Form) -> tuple[float, np.ndarray, float, float]:
    """(peak, halves, overhead, per-batch) from the log-parameters."""
    if form.half:
        half, rest = np.asarray(form.half, dtype=float), theta[1:]
    else:
        half, rest = np.exp(np.clip(theta[1:1 + dims], -30, 30)), theta[1 + dims:]
    over = float(np.exp(np.clip(rest[0], -60, 5)))
    per_batch = float(np.exp(np.clip(rest[1], -60, 5))) if form.per_batch else 0.0
    if form.peak_cap:      # peak = cap x logistic(theta_0): below the cap by construction
        return float(form.peak_cap / (1.0 + np.exp(-np.clip(theta[0], -60, 60)))), half, over, per_batch
    return float(np.exp(theta[0])), half, over, per_batch


def _model(theta: np.ndarray, points: Points, form: Form, waves: np.ndarray) -> np.ndarray:
    peak, half, over, per_batch = _unpack(theta, points.dims.shape[1], form)
    eff = np.prod(points.dims / (points.dims + half), axis=1) * waves
    fixed = over + points.batch * per_batch
    busy = points.work / (peak * eff)
    return np.maximum(fixed, busy) if form.overlap else fixed + busy


def fit_roofline(points: Points, per_batch: bool = False, sms: int | None = None, overlap: bool = False,
                 half: tuple[float, ...] | None = None, peak_cap: float | None = None) -> RooflineFit:
    """The ``RooflineFit`` of ``points`` (more points than parameters). ``per_batch``: fit a
    seconds-per-batch-element term (batched GEMMs); ``sms``: a GPU's SM count, to fit the wave
    quantisation's tile; ``overlap``: asynchronous launches (GPUs); ``half``: half-saturation
    sizes held fixed (another dtype's GEMMs run the same tiles: only its peak and overhead
    are fitted); ``peak_cap``: an upper bound on the peak."""
    form = Form(per_batch, sms, overlap, half, peak_cap)
    d = points.dims.shape[1]
    n_params = form.params(d)
    if len(points) <= n_params:
        raise ValueError(f"need more than {n_params} points to fit a {d}-dimensional surface, got {len(points)}")
    log_t = np.log(points.seconds)
    best: tuple[float, np.ndarray, int | None] | None = None
    for tile in ((None,) + GPU_TILES if sms else (None,)):
        waves = _waves(points, tile, sms)
        rate = points.work / points.seconds / waves
        for half0 in ((None,) if half else (4.0, 32.0, 256.0)):
            start = 2.0 if peak_cap else math.log(float(rate.max()) * 1.5)
            theta0 = [start, *([] if half else [math.log(half0)] * d),
                      math.log(max(float(points.seconds.min()) * 0.2, 1e-9))]
            if per_batch:
                theta0.append(math.log(max(float((points.seconds / points.batch).min()) * 0.05, 1e-10)))
            theta, cost = levenberg_marquardt(
                lambda th, w=waves: np.log(_model(th, points, form, w)) - log_t, np.array(theta0))
            if best is None or cost < best[0]:
                best = (cost, theta, tile)
    _, theta, tile = best
    peak, halves, over, pb = _unpack(theta, d, form)
    return RooflineFit(peak=peak, half=tuple(float(h) for h in halves), overhead_s=over, per_batch_s=pb,
                       tile=tile, sms=sms if tile else None, overlap=overlap, points=len(points))


def predict(fit: RooflineFit, points: Points) -> np.ndarray:
    return np.array([fit.seconds(w, tuple(dims), b) for w, dims, b in zip(points.work, points.dims, points.batch)])


def folds_of(n: int, folds: int = FOLDS, seed: int = 0) -> list[np.ndarray]:
    """Indices 0..n-1 shuffled (seeded) and cut into ``folds`` near-equal folds."""
    order = np.random.default_rng(seed).permutation(n)
    return [order[i::folds] for i in range(min(folds, n))]


def summarize_errors(errors: Sequence[float], folds: int) -> LeaveOut:
    e = np.abs(np.asarray(errors, dtype=float))
    return LeaveOut(points=int(len(e)), median=float(np.median(e)), p90=float(np.percentile(e, 90)),
                    max=float(e.max()), folds=int(folds))


def leave_out(n: int, fit: Callable[[np.ndarray], object], predict_at: Callable[[object, np.ndarray], np.ndarray],
              measured: np.ndarray, folds: int = FOLDS, seed: int = 0) -> LeaveOut:
    """k-fold cross-validation: every point predicted by the fit of the others' folds;
    |predicted / measured - 1| over all points."""
    parts = folds_of(n, folds, seed)
    errors = np.empty(n)
    for test in parts:
        train = np.setdiff1d(np.arange(n), test)
        model = fit(train)
        errors[test] = predict_at(model, test) / measured[test] - 1.0
    return summarize_errors(errors, len(parts))


def roofline_params(dims: int, per_batch: bool) -> int:
    """Parameters of a ``RooflineFit``: peak, one half-size per dimension, overhead(, per batch)."""
    return Form(per_batch).params(dims)


def roofline_with_report(points: Points, per_batch: bool = False, sms: int | None = None, overlap: bool = False,
                         half: tuple[float, ...] | None = None, peak_cap: float | None = None,
                         folds: int = FOLDS) -> tuple[RooflineFit, LeaveOut]:
    """The fit on every point and its k-fold leave-out error (leave-one-out where k folds would
    leave too few points to fit on)."""
    n = len(points)
    if n - math.ceil(n / folds) <= Form(per_batch, sms, overlap, half).params(points.dims.shape[1]):
        folds = n
    args = (per_batch, sms, overlap, half, peak_cap)
    report = leave_out(n, lambda idx: fit_roofline(points.take(idx), *args),
                       lambda fit, idx: predict(fit, points.take(idx)), points.seconds, folds)
    return fit_roofline(points, *args), report


def fit_membound(fwd_bytes: Sequence[float], fwd_s: Sequence[float], bwd_bytes: Sequence[float] | None = None,
                 bwd_s: Sequence[float] | None = None, folds: int = FOLDS) -> tuple[MemboundFit, LeaveOut]:
    """alpha + beta x bytes for each pass, and the leave-out error over both passes' points."""
    passes = [(np.asarray(fwd_bytes, float), np.asarray(fwd_s, float))]
    if bwd_bytes is not None and bwd_s is not None:
        passes.append((np.asarray(bwd_bytes, float), np.asarray(bwd_s, float)))
    errors: list[float] = []
    with warnings.catch_warnings():   # a left-out fold's bound says nothing of the profile; the fit
        warnings.simplefilter("ignore", FitWarning)   # on all points below still warns
        for x, t in passes:
            for test in folds_of(len(x), folds):
                train = np.setdiff1d(np.arange(len(x)), test)
                ab = fit_alpha_beta(x[train], t[train])
                errors.extend((ab.alpha + ab.beta * x[test]) / t[test] - 1.0)
    fits = [fit_alpha_beta(x, t) for x, t in passes]
    fit = MemboundFit(fwd=(fits[0].alpha, fits[0].beta),
                      bwd=(fits[1].alpha, fits[1].beta) if len(fits) > 1 else None, points=len(passes[0][0]))
    return fit, summarize_errors(errors, min(folds, len(passes[0][0])))


@dataclass(frozen=True)
class OptimizerFit:
    """seconds = overhead + per_tensor_s x tensors + bytes / bandwidth for one optimizer step
    (``costs.timing.optimizer_time``)."""
    bandwidth: float        # bytes/s
    per_tensor_s: float     # s per parameter tensor
    report: LeaveOut


def fit_optimizer(tensors: Sequence[float], nbytes: Sequence[float], seconds: Sequence[float], overhead: float,
                  folds: int = FOLDS) -> OptimizerFit:
    """The optimizer's two terms over its measured steps (non-negative, relative residuals), and
    their k-fold leave-out error on the full seconds (overhead included)."""
    n_t, x, t = (np.asarray(v, dtype=float) for v in (tensors, nbytes, seconds))
    y = np.maximum(t - overhead, 0.05 * t)

    def fit(idx: np.ndarray) -> tuple[float, float]:
        return _nonnegative_fit(x[idx], n_t[idx], y[idx], two_terms=True)

    report = leave_out(len(t), fit, lambda bt, idx: overhead + bt[0] * x[idx] + bt[1] * n_t[idx], t,
                       min(folds, len(t)))
    beta, tau = fit(np.arange(len(t)))
    return OptimizerFit(bandwidth=1.0 / beta, per_tensor_s=tau, report=report)


@dataclass(frozen=True)
class OptimizerLevelsFit:
    """seconds = overhead + per_tensor_s x tensors + sum over tensors of bytes / bandwidth of the
    cache level the tensor's working set fits (``costs.timing.optimizer_time`` with
    ``tables.optimizer_levels``)."""
    capacities: tuple[float, ...]     # bytes, smallest first (the last: as fitted)
    bandwidths: tuple[float, ...]     # bytes/s per level, the last main memory's
    per_tensor_s: float
    report: LeaveOut


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min |a c - b| subject to c >= 0, exactly, by trying every subset of free columns (the
    optimizer fit has at most 1 + levels of them)."""
    n = a.shape[1]
    best, best_res = np.zeros(n), float(np.sum(b * b))
    for mask in range(1, 2 ** n):
        free = [j for j in range(n) if mask >> j & 1]
        c, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
        if np.all(c >= 0):
            res = float(np.sum((a[:, free] @ c - b) ** 2))
            if res < best_res:
                best, best_res = np.zeros(n), res
                best[free] = c
    return best


def _level_design(steps: Sequence[Sequence[float]], capacities: Sequence[float], bytes_per_element: float,
                  ws_per_element: float) -> np.ndarray:
    """Columns: tensors, then bytes streamed at each level (the last: memory)."""
    levels = len(capacities) + 1
    x = np.zeros((len(steps), 1 + levels))
    for i, sizes in enumerate(steps):
        x[i, 0] = len(sizes)
        for e in sizes:
            lv = next((j for j, c in enumerate(capacities) if ws_per_element * e <= c), levels - 1)
            x[i, 1 + lv] += bytes_per_element * e
    return x


def _fit_levels(x: np.ndarray, y: np.ndarray, idx: np.ndarray, cols: list[int]) -> np.ndarray:
    w = 1.0 / y[idx]
    return nonnegative_lstsq(x[np.ix_(idx, cols)] * w[:, None], np.ones(len(idx)))


def fit_optimizer_levels(steps: Sequence[Sequence[float]], seconds: Sequence[float], overhead: float,
                         capacities: Sequence[float], bytes_per_element: float, working_set_per_element: float,
                         folds: int = FOLDS) -> OptimizerLevelsFit | None:
    """The optimizer's per-tensor cost and one rate per cache level from measured steps, each
    over tensors of the given element counts (``steps``): non-negative least squares on relative
    residuals of ``seconds - overhead`` against (tensors, bytes at each level). The last level's
    capacity is the one, among sysfs's and the measured tensors' working sets between it and the
    level below, with the smallest k-fold leave-out median (a VM gets a share of its socket's
    last-level cache, and neighbours contend for it). A level no measured tensor falls in takes
    the rate of the next larger level that has one (a cache the grid never filled is not assumed
    faster), memory that of the largest measured; a larger level is never faster than a smaller
    one. None where fewer than two levels hold measured tensors (then the single-rate
    ``fit_optimizer`` is the form to use)."""
    t = np.asarray(seconds, dtype=float)
    y = np.maximum(t - overhead, 0.05 * t)
    levels = len(capacities) + 1
    below = capacities[-2] if len(capacities) > 1 else 0.0
    sets = sorted({working_set_per_element * e for s in steps for e in s})
    lasts = [c for c in sets if below < c < capacities[-1]] + [capacities[-1]] if capacities else [None]
    best = None
    for last in lasts:
        caps = [*capacities[:-1], last] if capacities else []
        x = _level_design(steps, caps, bytes_per_element, working_set_per_element)
        used = [lv for lv in range(levels) if x[:, 1 + lv].any()]
        if len(used) < 2:
            continue
        cols = [0] + [1 + lv for lv in used]
        report = leave_out(len(t), lambda idx: _fit_levels(x, y, idx, cols),
                           lambda c, idx: overhead + x[np.ix_(idx, cols)] @ c, t, min(folds, len(t)))
        if best is None or report.median < best[0].median:
            best = (report, caps, used, _fit_levels(x, y, np.arange(len(t)), cols))
    if best is None:
        return None
    report, caps, used, coef = best
    per_byte = dict(zip(used, coef[1:]))
    measured = [lv for lv in used if per_byte[lv] > 0]
    if not measured:
        return None
    out = [1.0 / per_byte[next((m for m in measured if m >= lv), measured[-1])] for lv in range(levels)]
    for lv in range(1, levels):
        out[lv] = min(out[lv], out[lv - 1])
    return OptimizerLevelsFit(tuple(float(c) for c in caps), tuple(out), float(coef[0]), report)


@dataclass(frozen=True)
class CompositionFit:
    """measured = factor x priced + per_op_s x ops for one pass, over the synthetic stages."""
    factor: float
    per_op_s: float
    report: LeaveOut


# the smallest composition factor a two-term fit may keep: below it the stages' ops would run at
# under half their time alone, a fit of the machine's noise (a calibration whose layer drifted 40 %
# over the run fitted 0.005 with a large per-op term, 2026-11-28, and priced the held-out models at
# half their time), not of composing ops. Below it the one-term fit is used.
COMPOSITION_MIN_FACTOR = 0.5


def _nonnegative_fit(priced: np.ndarray, ops: np.ndarray, measured: np.ndarray, two_terms: bool,
                     min_c: float = 0.0) -> tuple[float, float]:
    """Least squares on relative residuals of measured = c priced (+ tau ops), c > 0, tau >= 0
    (and c >= ``min_c`` with the second term)."""
    w = 1.0 / measured
    if two_terms:
        a = np.stack([priced * w, ops * w], axis=1)
        (c, tau), *_ = np.linalg.lstsq(a, np.ones_like(measured), rcond=None)
        if tau >= 0 and c > 0 and c >= min_c:
            return float(c), float(tau)
    c = float(np.sum(priced * w) / np.sum((priced * w) ** 2))
    return c, 0.0


# relative leave-out improvement the per-op composition term must bring to be kept
COMPOSITION_MARGIN = 0.01


def fit_composition(priced: Sequence[float], ops: Sequence[float], measured: Sequence[float]) -> CompositionFit:
    """The composition terms of one pass over the stages (priced: their ops' priced seconds;
    ops: their op counts; measured: seconds). The per-op term is kept only when it predicts the
    left-out stages clearly better (leave-one-out median lower by ``COMPOSITION_MARGIN``: a
    near-tie would flip on the profile's rounded numbers when ``refit`` re-derives it) and there
    are at least three stages."""
    p, o, m = (np.asarray(x, dtype=float) for x in (priced, ops, measured))
    n = len(m)
    best: CompositionFit | None = None
    for two in ((False, True) if n >= 3 else (False,)):
        if n >= 2:
            errors = []
            for i in range(n):
                keep = np.arange(n) != i
                c, tau = _nonnegative_fit(p[keep], o[keep], m[keep], two, COMPOSITION_MIN_FACTOR)
                errors.append((c * p[i] + tau * o[i]) / m[i] - 1.0)
            report = summarize_errors(errors, n)
        else:
            report = summarize_errors([0.0], 1)
        c, tau = _nonnegative_fit(p, o, m, two, COMPOSITION_MIN_FACTOR)
        if best is None or report.median < best.report.median * (1.0 - COMPOSITION_MARGIN):
            best = CompositionFit(c, tau, report)
    return best
