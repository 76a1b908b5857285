"""Fit a profile's free numbers to observed runs: robust Levenberg-Marquardt on log errors.

Residual of a timing observation: w * log(predicted / published), every group (source)
weighted to the same total (w = 1 / sqrt(rows of its group)), Huber-weighted beyond
``HUBER`` (a noisy snapshot must not drag a parameter), in units of the ``NOISE`` a published
number carries, and with a weak prior pulling each
parameter back to its documented start (``PRIOR_SIGMA`` in log space), so a parameter the
data cannot see stays where its source put it. Parameters live in log space (all positive)
and are clipped to their bounds. The Jacobian is taken by forward differences, evaluating
only the runs a parameter touches (its GPU, and its stack for a stack parameter).

Spread: the parameter's 1-sigma from the Gauss-Newton covariance s^2 (J^T J)^-1 (s^2 the
residual variance), as a fraction of its value. A parameter whose column of J is nearly
zero, or whose spread exceeds 50 %, is reported as weakly identified by the data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .observations import Observation, time_like
from .predict import predict, with_values

HUBER = 0.08            # log error beyond which a row's weight falls as 1/|r| (~8 %)
NOISE = 0.05            # the log error a row is expected to keep (noise of published numbers)
PRIOR_SIGMA = 5.0       # log-space width of the pull back to the documented start
STEP = 1e-3             # forward-difference step in log space


@dataclass(frozen=True)
class FitParam:
    profile: str
    path: tuple[str, ...]           # inside the profile dict (device.stacks.<stack>.<field>, ...)
    start: float
    lo: float
    hi: float
    stack: str | None = None        # None: a GPU number (every run on this profile)
    source: str = ""                # where the start value comes from
    tied: tuple[str, ...] = ()      # other stacks that take the same value (same kernels)

    @property
    def key(self) -> tuple:
        return (self.profile, *self.path)

    @property
    def label(self) -> str:
        return f"{self.profile}:{'.'.join(self.path[1:] if self.path[0] == 'device' else self.path)}"


@dataclass
class FitResult:
    params: list[FitParam]
    values: dict[tuple, float]
    spread: dict[tuple, float]              # 1-sigma / value
    unidentified: list[str]
    cost: float
    iterations: int
    history: list[float] = field(default_factory=list)


def expand(values: dict[tuple, float], params: list[FitParam]) -> dict[tuple, float]:
    """Values with each tied stack's copy (``FitParam.tied``)."""
    out = dict(values)
    for p in params:
        for other in p.tied:
            out[(p.profile, *p.path[:-2], other, p.path[-1])] = values[p.key]
    return out


def timing_rows(observations: list[Observation]) -> list[int]:
    return [i for i, o in enumerate(observations) if time_like(o)]


def group_weights(observations: list[Observation], rows: list[int]) -> np.ndarray:
    counts: dict[str, int] = {}
    for i in rows:
        counts[observations[i].group] = counts.get(observations[i].group, 0) + 1
    return np.array([1.0 / (NOISE * math.sqrt(counts[observations[i].group])) for i in rows])


def touches(p: FitParam, o: Observation) -> bool:
    return o.profile == p.profile and (p.stack is None or o.stack == p.stack or o.stack in p.tied)


class Problem:
    """The residual vector of a parameter vector, with the evaluation cache the Jacobian needs."""

    def __init__(self, observations, profiles, params: list[FitParam]):
        self.obs, self.profiles, self.params = observations, profiles, params
        self.rows = timing_rows(observations)
        self.w = group_weights(observations, self.rows)
        self.measured = np.array([observations[i].value for i in self.rows])
        self.x0 = np.log([p.start for p in params])
        self.lo, self.hi = np.log([p.lo for p in params]), np.log([p.hi for p in params])
        self.evaluations = 0

    def values(self, x: np.ndarray) -> dict[tuple, float]:
        return expand({p.key: float(math.exp(v)) for p, v in zip(self.params, x)}, self.params)

    def log_errors(self, x: np.ndarray, subset: list[int] | None = None, base: np.ndarray | None = None) -> np.ndarray:
        """log(predicted / published) of the timing rows (only ``subset`` re-evaluated)."""
        rows = self.rows if subset is None else subset
        obs = [self.obs[i] for i in rows]
        preds = predict(obs, with_values(self.profiles, self.values(x)))
        self.evaluations += 1
        out = np.array(base, copy=True) if base is not None else np.zeros(len(self.rows))
        where = {i: k for k, i in enumerate(self.rows)}
        for i, p in zip(rows, preds):
            out[where[i]] = math.log(max(p.value, 1e-30) / self.observations_value(i))
        return out

    def observations_value(self, i: int) -> float:
        return self.obs[i].value

    def residuals(self, x: np.ndarray, e: np.ndarray, hub: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(robustly weighted data residuals + prior residuals, the Huber weights: those of
        ``e`` unless given, so steps of one iteration are compared on one objective)."""
        if hub is None:
            a = np.abs(e)
            hub = np.where(a <= HUBER, 1.0, np.sqrt(HUBER / np.maximum(a, 1e-12)))
        return np.concatenate([self.w * hub * e, (x - self.x0) / PRIOR_SIGMA]), hub

    def jacobian(self, x: np.ndarray, e: np.ndarray) -> np.ndarray:
        cols = []
        for j, p in enumerate(self.params):
            xj = x.copy()
            xj[j] += STEP
            subset = [i for i in self.rows if touches(p, self.obs[i])]
            ej = self.log_errors(xj, subset, e) if subset else e
            cols.append((ej - e) / STEP)
        return np.array(cols).T


def fit(observations: list[Observation], profiles: dict[str, dict], params: list[FitParam],
        max_iter: int = 25, tol: float = 1e-5, log=None) -> FitResult:
    prob = Problem(observations, profiles, params)
    x, e = scan(prob, prob.x0.copy(), log)
    lam, history = 1e-2, []
    it = 0
    for it in range(1, max_iter + 1):
        r, hub = prob.residuals(x, e)               # Huber weights re-taken each iteration (IRLS)
        cost = float(r @ r)
        J = prob.jacobian(x, e) * (prob.w * hub)[:, None]
        A = np.vstack([J, np.eye(len(x)) / PRIOR_SIGMA])
        g, H = A.T @ r, A.T @ A
        improved = False
        for _ in range(8):
            step = np.linalg.solve(H + lam * np.diag(np.diag(H) + 1e-9), -g)
            xn = np.clip(x + step, prob.lo, prob.hi)
            en = prob.log_errors(xn)
            rn, _ = prob.residuals(xn, en, hub)
            cn = float(rn @ rn)
            if cn < cost:
                x, e, lam, improved = xn, en, max(lam / 3, 1e-6), True
                break
            lam *= 4
        history.append(cn if improved else cost)
        if log:
            log(f"  iter {it}: cost {history[-1]:.5f} (lambda {lam:.1e}, {prob.evaluations} evaluations)")
        if not improved or cost - cn < tol * max(cost, 1e-12):
            break
    r, hub = prob.residuals(x, e)
    cost = float(r @ r)
    J = prob.jacobian(x, e) * (prob.w * hub)[:, None]
    spread, unidentified = _spread(prob, J, r, x)
    return FitResult(params, prob.values(x), spread, unidentified, cost, it, history)


SCAN = (-2.0, -1.0, -0.5, 0.5, 1.0, 2.0)     # log2 multiples tried around each start


def scan(prob: Problem, x: np.ndarray, log=None) -> tuple[np.ndarray, np.ndarray]:
    """One coordinate pass over a coarse log grid (x 1/4 .. 4) before Levenberg-Marquardt:
    overlap terms (max(compute, communication)) are flat on one side, where a local method
    sees no gradient."""
    e = prob.log_errors(x)
    cost = float(prob.residuals(x, e)[0] @ prob.residuals(x, e)[0])
    for j, p in enumerate(prob.params):
        subset = [i for i in prob.rows if touches(p, prob.obs[i])]
        if not subset:
            continue
        for step in SCAN:
            xj = x.copy()
            xj[j] = float(np.clip(x[j] + step * math.log(2.0), prob.lo[j], prob.hi[j]))
            ej = prob.log_errors(xj, subset, e)
            r, _ = prob.residuals(xj, ej)
            if float(r @ r) < cost:
                x, e, cost = xj, ej, float(r @ r)
    if log:
        log(f"  scan: cost {cost:.5f} ({prob.evaluations} evaluations)")
    return x, e


def _spread(prob: Problem, J: np.ndarray, r: np.ndarray, x: np.ndarray) -> tuple[dict, list[str]]:
    n, k = J.shape
    dof = max(n - k, 1)
    s2 = float(r[:n] @ r[:n]) / dof
    H = J.T @ J + np.eye(k) * 1e-12
    cov = s2 * np.linalg.pinv(H)
    spread, bad = {}, []
    norms = np.linalg.norm(J, axis=0)
    for j, p in enumerate(prob.params):
        sd = math.sqrt(max(cov[j, j], 0.0))           # log space: ~ relative
        spread[p.key] = sd
        if norms[j] < 1e-3 or sd > 0.5:
            bad.append(p.label)
    return spread, bad


def fit_memory(observations: list[Observation], predictions) -> dict[tuple[str, str], tuple[float, float, int]]:
    """Per (profile, stack) with measured memory: the allocator's (reserve bytes, fragmentation)
    from reported = (1 + fragmentation) x allocated peak + reserve, least squares on the
    relative error (each row divided by its measured value), fragmentation >= 0, reserve >= 0.
    Returns {(profile, stack): (reserve, fragmentation, rows)}."""
    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for o, p in zip(observations, predictions):
        if o.kind == "memory":
            groups.setdefault((o.profile, o.stack), []).append((p.peak_memory_bytes, o.value))
    out = {}
    for key, pairs in groups.items():
        x, y = np.array(pairs).T
        A = np.vstack([x / y, 1.0 / y]).T                 # (1 + f) x / y + r / y = 1
        best = None
        for cols in ((0, 1), (0,), (1,)):
            sol = np.linalg.lstsq(A[:, cols], np.ones(len(y)), rcond=None)[0]
            full = dict(zip(cols, sol))
            slope, reserve = full.get(0, 1.0), full.get(1, 0.0)
            if slope < 1.0 or reserve < 0.0:
                continue
            err = float(np.mean(np.abs(A @ np.array([slope, reserve]) - 1.0)))
            if best is None or err < best[0]:
                best = (err, reserve, slope - 1.0)
        _, reserve, frag = best or (0.0, 0.0, 0.0)
        out[key] = (float(reserve), float(frag), len(pairs))
    return out
