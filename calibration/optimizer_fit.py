"""The optimizer's fits over the machine grid's AdamW steps (``machine_fit.membound_surfaces``):
one rate and a cost per parameter tensor (``fit_optimizer``), or one rate per cache level the
tensors' working sets fall in (``fit_optimizer_levels``), each with its leave-out error.

No torch, no I/O: numbers in, fits out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from parsim.specs.surfaces import LeaveOut

from .surface_fit import FOLDS, leave_out, nonnegative_fit, nonnegative_lstsq


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
        return nonnegative_fit(x[idx], n_t[idx], y[idx], two_terms=True)

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
