"""Pure fitting of the machine grid's measurements into the surfaces of ``parsim.specs.surfaces``,
and each fit's leave-out error.

* ``fit_roofline``: seconds = overhead + batch x per-batch + work / (peak x prod_i d_i / (d_i + h_i)
  x waves), least squares on log seconds (every point's *relative* error counts alike, from a
  10-microsecond GEMM to a 30-millisecond one) by Levenberg-Marquardt (Marquardt 1963) over the
  logarithms of the parameters, so each stays positive; on a GPU the output tile of the wave
  quantisation is chosen among 64/128/256 by the same residual.
* ``fit_membound``: alpha + beta x bytes per pass, a second rate past the last-level cache
  (non-negative least squares on relative residuals).
* ``leave_out``: k-fold cross-validation: every point predicted by the fit of the other folds,
  |predicted / measured - 1| summarised (``specs.surfaces.LeaveOut``).
* ``fit_composition``: a pass's measured seconds = c x its ops' priced sum + tau x its op count,
  over the synthetic stages, with leave-one-out.
* ``nonnegative_lstsq``, ``nonnegative_fit``: the non-negative least squares these and the
  optimizer's fits (``optimizer_fit``) share.

No torch, no I/O: numbers in, fits out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from parsim.specs.surfaces import LeaveOut, MemboundFit, RooflineFit, wide_fraction
from parsim.costs.timing import composed

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
    wide: bool | float = False         # ``RooflineFit.wide``: True fitted, a number held

    def params(self, dims: int) -> int:
        """Parameters fitted: peak, overhead, one half-size per dimension unless fixed(, per batch)(, wide)."""
        return 2 + (0 if self.half else dims) + int(self.per_batch) + int(self.wide is True)


def _unpack(theta: np.ndarray, dims: int, form: Form) -> tuple[float, np.ndarray, float, float, float | None]:
    """(peak, halves, overhead, per-batch, wide) from the log-parameters."""
    if form.half:
        half, rest = np.asarray(form.half, dtype=float), theta[1:]
    else:
        half, rest = np.exp(np.clip(theta[1:1 + dims], -30, 30)), theta[1 + dims:]
    over = float(np.exp(np.clip(rest[0], -60, 5)))
    per_batch = float(np.exp(np.clip(rest[1], -60, 5))) if form.per_batch else 0.0
    wide = float(np.exp(np.clip(rest[-1], -30, 30))) if form.wide is True else (float(form.wide) or None)
    if form.peak_cap:      # peak = cap x logistic(theta_0): below the cap by construction
        return float(form.peak_cap / (1.0 + np.exp(-np.clip(theta[0], -60, 60)))), half, over, per_batch, wide
    return float(np.exp(theta[0])), half, over, per_batch, wide


def _model(theta: np.ndarray, points: Points, form: Form, waves: np.ndarray) -> np.ndarray:
    peak, half, over, per_batch, wide = _unpack(theta, points.dims.shape[1], form)
    eff = np.prod(points.dims / (points.dims + half), axis=1) * waves
    if wide:
        eff = eff * wide_fraction(points.dims[:, 1], wide)
    fixed = over + points.batch * per_batch
    busy = points.work / (peak * eff)
    return np.maximum(fixed, busy) if form.overlap else fixed + busy


def fit_roofline(points: Points, per_batch: bool = False, sms: int | None = None, overlap: bool = False,
                 half: tuple[float, ...] | None = None, peak_cap: float | None = None,
                 wide: bool | float = False) -> RooflineFit:
    """The ``RooflineFit`` of ``points`` (more points than parameters). ``per_batch``: fit a
    seconds-per-batch-element term (batched GEMMs); ``sms``: a GPU's SM count, to fit the wave
    quantisation's tile; ``overlap``: asynchronous launches (GPUs); ``half``: half-saturation
    sizes held fixed (another dtype's GEMMs run the same tiles: only its peak and overhead
    are fitted); ``peak_cap``: an upper bound on the peak; ``wide``: fit (True) or hold (a
    number) the output width at which the rate halves (``RooflineFit.wide``)."""
    form = Form(per_batch, sms, overlap, half, peak_cap, wide)
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
            if wide is True:      # from far past the widest point: no fall until the points ask for one
                theta0.append(math.log(8.0 * float(points.dims[:, 1].max())))
            theta, cost = levenberg_marquardt(
                lambda th, w=waves: np.log(_model(th, points, form, w)) - log_t, np.array(theta0))
            if best is None or cost < best[0]:
                best = (cost, theta, tile)
    _, theta, tile = best
    peak, halves, over, pb, wide_n = _unpack(theta, d, form)
    return RooflineFit(peak=peak, half=tuple(float(h) for h in halves), overhead_s=over, per_batch_s=pb,
                       tile=tile, sms=sms if tile else None, overlap=overlap, points=len(points), wide=wide_n)


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
                         folds: int = FOLDS, wide: bool | float = False) -> tuple[RooflineFit, LeaveOut]:
    """The fit on every point and its k-fold leave-out error (leave-one-out where k folds would
    leave too few points to fit on)."""
    n = len(points)
    if n - math.ceil(n / folds) <= Form(per_batch, sms, overlap, half, wide=wide).params(points.dims.shape[1]):
        folds = n
    args = (per_batch, sms, overlap, half, peak_cap, wide)
    report = leave_out(n, lambda idx: fit_roofline(points.take(idx), *args),
                       lambda fit, idx: predict(fit, points.take(idx)), points.seconds, folds)
    return fit_roofline(points, *args), report


def _membound_pass(x: np.ndarray, t: np.ndarray, knee: float | None) -> tuple[float, ...]:
    """(alpha s, beta s/byte[, beta_beyond s/byte]) of one pass: non-negative least squares on
    relative residuals (a 3-microsecond op weighs as much as a 3-millisecond one), with a second
    rate for the bytes past ``knee`` where at least two points lie past it (one would set the
    second rate alone, noise and all) and one within it, and it is slower than the first
    (streaming past the last-level cache is never faster than within it; one as fast is the one
    line)."""
    w = 1.0 / t
    line = nonnegative_lstsq(np.stack([np.ones_like(x), x], axis=1) * w[:, None], np.ones(len(x)))
    if knee is None or int(np.sum(x > knee)) < 2 or not np.any(x <= knee):
        return tuple(float(c) for c in line)
    below = np.minimum(x, knee)
    two = nonnegative_lstsq(np.stack([np.ones_like(x), below, x - below], axis=1) * w[:, None], np.ones(len(x)))
    return tuple(float(c) for c in (two if two[2] > two[1] else line))


def fit_membound(fwd_bytes: Sequence[float], fwd_s: Sequence[float], bwd_bytes: Sequence[float] | None = None,
                 bwd_s: Sequence[float] | None = None, folds: int = FOLDS,
                 knee: float | None = None) -> tuple[MemboundFit, LeaveOut]:
    """alpha + beta x bytes for each pass, past ``knee`` bytes (the host's last-level cache;
    None: one rate) at a second rate (``_membound_pass``), and the leave-out error over both
    passes' points. Not ``fit.fit_alpha_beta``: that one keeps a message's bandwidth from its
    largest sizes, while an op's small sizes are as much its use as its large ones (a layer
    norm over a microbatch's tokens), and an op whose time does not grow with its bytes (a
    residual add's backward passes its gradient on) gets beta = 0, not a bound."""
    passes = [(np.asarray(fwd_bytes, float), np.asarray(fwd_s, float))]
    if bwd_bytes is not None and bwd_s is not None:
        passes.append((np.asarray(bwd_bytes, float), np.asarray(bwd_s, float)))

    n = len(passes[0][0])

    def fit(idx: np.ndarray) -> MemboundFit:
        terms = [_membound_pass(x[idx], t[idx], knee) for x, t in passes]
        return MemboundFit(fwd=terms[0], bwd=terms[1] if len(terms) > 1 else None, points=n,
                           knee=knee if any(len(c) == 3 for c in terms) else None)

    errors: list[float] = []
    for test in folds_of(n, folds):
        left = fit(np.setdiff1d(np.arange(n), test))
        for pass_, (x, t) in zip(("fwd", "bwd"), passes):
            errors.extend(left.seconds(pass_, float(b)) / s - 1.0 for b, s in zip(x[test], t[test]))
    return fit(np.arange(n)), summarize_errors(errors, min(folds, n))


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


def nonnegative_fit(priced: np.ndarray, ops: np.ndarray, measured: np.ndarray, two_terms: bool,
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
# the per-op term is fitted only over stages whose op counts span this ratio: over nearly equal
# counts it is a near-constant offset the stages cannot tell from the factor, and a model with
# many more ops takes it per op. The machine grid's four stages run 18-26 ops a pass; on a Zen 3
# EPYC VM (2026-11-30) their backward fitted 0.684 x priced + 1.13 ms per op (a fit of the 13 %
# the stages drifted between rounds, not of autograd, whose per-op cost is tens of us), and priced
# a 12-layer model's backward (113 ops) +98 % and a 2-layer one's (19 ops) -33 % (alone, one thread).
COMPOSITION_OPS_SPAN = 2.0


def fit_composition(priced: Sequence[float], ops: Sequence[float], measured: Sequence[float]) -> CompositionFit:
    """The composition terms of one pass over the stages (priced: their ops' priced seconds;
    ops: their op counts; measured: seconds). The per-op term is kept only when it predicts the
    left-out stages clearly better (leave-one-out median lower by ``COMPOSITION_MARGIN``: a
    near-tie would flip on the profile's rounded numbers when ``refit`` re-derives it), there
    are at least three stages, and their op counts span ``COMPOSITION_OPS_SPAN`` (else the data
    cannot tell it from the factor)."""
    p, o, m = (np.asarray(x, dtype=float) for x in (priced, ops, measured))
    n = len(m)
    identified = n >= 3 and o.min() > 0 and o.max() >= COMPOSITION_OPS_SPAN * o.min()
    best: CompositionFit | None = None
    for two in ((False, True) if identified else (False,)):
        if n >= 2:
            errors = []
            for i in range(n):
                keep = np.arange(n) != i
                c, tau = nonnegative_fit(p[keep], o[keep], m[keep], two, COMPOSITION_MIN_FACTOR)
                errors.append((c * p[i] + tau * o[i]) / m[i] - 1.0)
            report = summarize_errors(errors, n)
        else:
            report = summarize_errors([0.0], 1)
        c, tau = nonnegative_fit(p, o, m, two, COMPOSITION_MIN_FACTOR)
        if best is None or report.median < best.report.median * (1.0 - COMPOSITION_MARGIN):
            best = CompositionFit(c, tau, report)
    return best


def _overlapped_error(factors: np.ndarray, taus: np.ndarray, running, rest, measured) -> np.ndarray:
    """Squared relative errors summed over stages, (factors x taus): a stage's pass priced
    sum_i max(f d_i, tau) over the ops that run (``running``, seconds each; ``costs.timing.composed``,
    the rule ``costs.timing.op_time`` prices by) + f x ``rest``."""
    total = np.zeros((len(factors), len(taus)))
    for run, other, m in zip(running, rest, measured):
        run = np.asarray(run, dtype=float)
        for i, f in enumerate(factors):
            priced = composed(run[:, None], f, taus[None, :], True)
            total[i] += ((priced.sum(axis=0) + f * other) / m - 1.0) ** 2
    return total


def _overlapped_terms(running, rest, measured) -> tuple[float, float]:
    """(f, tau) minimising ``_overlapped_error``: a log grid, then a finer one around its best.
    Where no stage's op outlasts the issue time the factor is not seen; the least error nearest
    f = 1 (the kernels composed as timed alone) is kept."""
    longest = max(float(np.max(r)) if len(r) else 0.0 for r in running)
    per_op = [m / max(len(r), 1) for r, m in zip(running, measured)]
    factors = np.geomspace(COMPOSITION_MIN_FACTOR, 4.0, 121)
    taus = np.concatenate([[0.0], np.geomspace(min(per_op) * 1e-3, max(max(per_op), longest) * 2.0, 121)])
    for _ in range(2):
        err = _overlapped_error(factors, taus, running, rest, measured)
        best = err.min()
        near = np.argwhere(err <= best * (1.0 + 1e-9) + 1e-15)
        i, j = min(near, key=lambda ij: abs(np.log(factors[ij[0]])))
        f, tau = float(factors[i]), float(taus[j])
        factors = np.geomspace(max(f / 1.04, COMPOSITION_MIN_FACTOR), f * 1.04, 41)
        taus = np.concatenate([[0.0], np.geomspace(max(tau, 1e-9) / 1.06, max(tau, 1e-9) * 1.06, 41)])
    return f, tau


def fit_overlapped_composition(running: Sequence[Sequence[float]], rest: Sequence[float],
                               measured: Sequence[float]) -> CompositionFit:
    """The composition terms of one pass over the stages of an asynchronous device (CUDA: the
    host queues kernels ahead of the device, ``costs.timing.op_time``): measured = sum over
    the ops that run of max(factor x seconds, per-op issue seconds), + factor x ``rest`` (the
    weight-gradient halves, which issue with their input gradient's node), least squares on
    relative residuals; leave-one-stage-out error with three stages or more."""
    n = len(measured)
    errors = []
    for k in range(n if n >= 3 else 0):
        keep = [i for i in range(n) if i != k]
        f, tau = _overlapped_terms([running[i] for i in keep], [rest[i] for i in keep], [measured[i] for i in keep])
        pred = float(composed(np.asarray(running[k], dtype=float), f, tau, True).sum()) + f * rest[k]
        errors.append(pred / measured[k] - 1.0)
    f, tau = _overlapped_terms(running, rest, measured)
    return CompositionFit(f, tau, summarize_errors(errors or [0.0], n))
