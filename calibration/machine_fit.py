"""The machine grid's measurements (``machine_bench.GridResults``) -> the fitted surfaces of a
profile (``parsim.specs.surfaces``) with their leave-out errors. Pure: numbers in, typed fits out.

Keys of the fit report: ``gemm.<dtype>.<form>``, ``attention.<dtype>.<pass>``,
``membound.<op>``, ``composition.<pass>`` (``layer_terms``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from parsim.costs.flops import cpu_flash_causal_fraction, cpu_flash_query_blocks
from parsim.costs.timing import OPTIMIZER_WORKING_SET_BYTES
from parsim.specs.surfaces import LeaveOut, MemboundFit, RooflineFit
from parsim.specs.tables import OptimizerLevels

from .optimizer_fit import fit_optimizer, fit_optimizer_levels
from .surface_fit import (FOLDS, Points, fit_membound, leave_out,
                          nonnegative_lstsq, roofline_params, roofline_with_report)

# costs.ops: fused attention's backward counts 2.5x its forward FLOPs (Dao 2022, Sec. 3.1)
ATTENTION_BWD_FACTOR = 2.5
# Ops kept out of the membound surface: AdamW is priced by ``timing.optimizer_time`` as bytes /
# rate + the per-op overhead by both engines (the fast path's numba kernel too), so it keeps the
# rate form: 1 / beta of its fit goes to the rate table.
RATE_ONLY = ("adamw",)


@dataclass
class Surfaces:
    gemm: dict[str, dict[str, RooflineFit]] = field(default_factory=dict)
    attention: dict[str, dict[str, RooflineFit]] = field(default_factory=dict)
    membound: dict[str, MemboundFit] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)       # op -> bytes/s (1 / beta)
    report: dict[str, LeaveOut] = field(default_factory=dict)
    optimizer_per_tensor_s: float | None = None                 # AdamW's Python loop, s per tensor
    optimizer_levels: OptimizerLevels | None = None             # AdamW's rate per cache level

    def peak(self, dtype: str) -> float | None:
        """The fitted asymptote of ``dtype``'s forward GEMMs (FLOP/s)."""
        fit = self.gemm.get(dtype, {}).get("linear")
        return fit.peak if fit else None


def gemm_surfaces(results: dict[str, list], dtype: str, sms: int | None, overlap: bool, out: Surfaces) -> None:
    """One surface per GEMM form of the calibrated ``dtype`` with enough points (more than its
    parameters). Every other dtype's ``linear`` GEMMs: fitted with the calibrated dtype's
    half-saturation sizes held (the same kernel family's tiles: only its peak and overhead
    are fitted, so two dozen points pin its asymptote), or freely where that predicts the
    left-out points better (a CPU's bf16 GEMMs may run another kernel)."""
    def points(dt: str, form: str) -> Points | None:
        sel = [(p, s) for p, s in results.get(dt, []) if p.form == form]
        if len(sel) < 4:
            return None
        return Points.of([p.flops for p, _ in sel], [p.key for p, _ in sel], [s.median for _, s in sel],
                         [p.batch for p, _ in sel])

    def keep(dt: str, form: str, surface_report) -> None:
        out.gemm.setdefault(dt, {})[form], out.report[f"gemm.{dt}.{form}"] = surface_report

    # the forward GEMM first: the other forms' asymptotes stay below its peak (one chip, one peak;
    # fitted alone, a form measured mostly below saturation can extrapolate past it). On a CPU
    # each unbatched form's rate may fall with its output's width (``RooflineFit.wide``, fitted
    # free: far past the widest point where nothing falls). Not kept by the leave-out: the grid
    # holds a handful of points wide enough to show it, and on a VM whose speed moves 10-20 % a
    # point the leave-out picked the plain form in one of two calibrations (2026-11-30, Zen 3
    # VM), which priced the deep held-out model's head at half its time; on a dedicated sub-grid
    # of the heads' region the width halves the leave-out (``heldout/wide_gemm.txt``).
    for form in sorted({p.form for p, _ in results.get(dtype, [])}, key=lambda f: f != "linear"):
        pts, per_batch = points(dtype, form), form == "bmm"
        cap = out.gemm.get(dtype, {}).get("linear")
        if pts is not None and len(pts) >= roofline_params(3, per_batch) + 2:
            wide = sms is None and not overlap and not per_batch and len(pts) >= roofline_params(3, False) + 3
            keep(dtype, form, roofline_with_report(pts, per_batch=per_batch, sms=sms, overlap=overlap,
                                                   peak_cap=cap.peak if cap else None, wide=wide))
    main = out.gemm.get(dtype, {}).get("linear")
    batched = points(dtype, "bmm")
    if main is not None and batched is not None and not overlap and "bmm" in out.gemm.get(dtype, {}):
        held = batched_on_linear(batched, main)
        if held[1].median < out.report[f"gemm.{dtype}.bmm"].median:
            keep(dtype, "bmm", held)
    for dt in results:
        pts = points(dt, "linear")
        if dt == dtype or main is None or pts is None:
            continue
        options = [roofline_with_report(pts, sms=sms, overlap=overlap, half=main.half, wide=main.wide or False)]
        if len(pts) >= roofline_params(3, False) + 2:
            options.append(roofline_with_report(pts, sms=sms, overlap=overlap))
        keep(dt, "linear", min(options, key=lambda fr: fr[1].median))


def batched_on_linear(points: Points, linear: RooflineFit, folds: int = FOLDS) -> tuple[RooflineFit, LeaveOut]:
    """A CPU's batched GEMM as ``batch`` GEMMs of the forward GEMM's surface: seconds =
    overhead + batch x per_batch + work / (peak x eff(m, n, k)) with ``linear``'s peak and
    half-saturation sizes held (torch's CPU bmm runs the same GEMM kernel once per batch element)
    and the per-call and per-element dispatch fitted (non-negative least squares on relative
    residuals), with its k-fold leave-out error. On the 2-core Xeon VM (11-28,
    ``studies/validation_cpu/shape_check.py``) the free 5-parameter surface priced the
    (128, 128, 32) x 8 score products of an unfused 32-wide-head model at 2.0-2.1x their measured
    time (its k half-size of 67 makes k = 32 a third efficient); this form prices them from the
    linear GEMMs, where k = 32 runs well, with a leave-out error of 4.3-4.6 % (free: 4.8-8.7 %)."""
    busy = points.work / np.array([linear.peak * linear.efficiency(tuple(d), b)
                                   for d, b in zip(points.dims, points.batch)])
    design = np.stack([np.ones(len(points)), points.batch], axis=1)

    def fit(idx: np.ndarray) -> np.ndarray:
        t = points.seconds[idx]
        return nonnegative_lstsq(design[idx] / t[:, None], 1.0 - busy[idx] / t)

    report = leave_out(len(points), fit, lambda c, idx: busy[idx] + design[idx] @ c, points.seconds,
                       min(folds, len(points)))
    over, per_batch = fit(np.arange(len(points)))
    return RooflineFit(peak=linear.peak, half=linear.half, overhead_s=float(over), per_batch_s=float(per_batch),
                       points=len(points)), report


def attention_surfaces(results: list, dtype: str, overlap: bool, out: Surfaces, cpu_flash: bool = False) -> None:
    """Fused causal attention per pass over (seq, head dim, batch x heads) on the counted FLOPs,
    or with ``cpu_flash`` (torch's CPU kernel) on those it executes: it skips no key block up to
    s = 512 and a quarter at 1024 (``costs.flops.cpu_flash_causal_fraction``), a step a surface
    smooth in s cannot follow on the counted FLOPs (the form: ``attention_fit``)."""
    if len(results) < roofline_params(3, True) + 2:
        return
    points = [p for p, _, _ in results]
    for pass_, column in (("fwd", 1), ("bwd", 2)):
        work, dims = attention_work(points, pass_, cpu_flash)
        fit, report = attention_fit(work, dims, [r[column].median for r in results], overlap, cpu_flash)
        out.attention.setdefault(dtype, {})[pass_] = fit
        out.report[f"attention.{dtype}.{pass_}"] = report


def attention_work(points: list, pass_: str, cpu_flash: bool) -> tuple[list[float], list[tuple[int, int, int]]]:
    """(work in FLOP, dims = (seq, head dim, batch x heads)) of each ``AttentionPoint`` in one
    pass: the counted FLOPs (x ``ATTENTION_BWD_FACTOR`` in backward), or with ``cpu_flash`` those
    torch's CPU flash kernel executes (``costs.flops.cpu_flash_causal_fraction``)."""
    factor = ATTENTION_BWD_FACTOR if pass_ == "bwd" else 1.0
    work = [factor * p.fwd_flops * (cpu_flash_causal_fraction(p.seq) if cpu_flash else 1.0) for p in points]
    return work, [(p.seq, p.head_dim, p.batch_heads) for p in points]


def attention_fit(work: list[float], dims: list[tuple[int, int, int]], seconds: list[float], overlap: bool = False,
                  cpu_flash: bool = False) -> tuple[RooflineFit, LeaveOut]:
    """One pass's attention surface over ``dims`` = (seq, head dim, batch x heads), and its
    leave-out error: the form among these that predicts the left-out points best --

    * the roofline alone;
    * plus seconds per (batch, head) pair (``per_batch`` over batch x heads);
    * with ``cpu_flash``, plus seconds per (batch, head, query block) instead
      (``RooflineFit.per_block``): torch's CPU kernel loops over query blocks of 32 rows below
      s = 192 and 64 from there (``costs.flops.cpu_flash_query_block``), and each block's pass
      has a fixed cost (in 16 bits, the backward converts fp32 accumulators per block) that steps
      where the blocks grow. On the 2-vCPU Zen 4 VM (2026-12-03, torch 2.13, the calibration's 24
      points a dtype, median of three passes; ``studies/validation_cpu/heldout/attention_form.txt``)
      the per-block term took the leave-out median from 21.5 % to 7.9 % on the bf16 backward and
      from 9.6 % to 6.0 % on the fp32 forward, and was not chosen on the fp32 backward (7.3 %
      either way)."""
    heads = [d[2] for d in dims]
    candidates = [(False, heads, False), (True, heads, False)]
    if cpu_flash:
        candidates.append((True, [h * cpu_flash_query_blocks(d[0]) for h, d in zip(heads, dims)], True))
    best = None
    for per_batch, batch, per_block in candidates:
        fit, report = roofline_with_report(Points.of(work, dims, seconds, batch), per_batch=per_batch, overlap=overlap)
        if best is None or report.median < best[1].median:
            best = (replace(fit, executed=cpu_flash, per_block=per_block), report)
    return best


def membound_surfaces(results: list, out: Surfaces, overhead: float = 0.0, caches: tuple[int, ...] = ()) -> None:
    """alpha + beta x bytes per op and pass over the grid's sizes (ops with at least 3 sizes), at
    a second rate past the last of ``caches`` (the last-level cache) where the sizes cross it;
    AdamW: bytes / bandwidth + seconds per parameter tensor (``optimizer_fit.fit_optimizer``), or
    with one bandwidth per cache level of ``caches`` (``fit_optimizer_levels``) where that
    predicts the left-out steps better."""
    names = sorted({p.name for p, _, _ in results})
    for name in names:
        sel = [(p, f, b) for p, f, b in results if p.name == name]
        if len(sel) < 3:
            continue
        if name == "adamw" and all(p.tensors for p, _, _ in sel):
            _optimizer_fit(sel, out, overhead, caches)
            continue
        with_bwd = all(b is not None for _, _, b in sel)
        fit, report = fit_membound([p.fwd_bytes for p, _, _ in sel], [f.median for _, f, _ in sel],
                                   [p.bwd_bytes for p, _, _ in sel] if with_bwd else None,
                                   [b.median for _, _, b in sel] if with_bwd else None,
                                   knee=float(caches[-1]) if caches else None)
        if math.isfinite(fit.bandwidth):       # a forward whose time does not grow with bytes has no rate
            out.rates[name] = fit.bandwidth
        out.report[f"membound.{name}"] = report
        if name not in RATE_ONLY:
            out.membound[name] = fit


def _optimizer_fit(sel: list, out: Surfaces, overhead: float, caches: tuple[int, ...]) -> None:
    seconds = [f.median for _, f, _ in sel]
    opt = fit_optimizer([len(p.tensors) for p, _, _ in sel], [p.fwd_bytes for p, _, _ in sel], seconds, overhead)
    out.rates["adamw"], out.optimizer_per_tensor_s = opt.bandwidth, opt.per_tensor_s
    out.report["membound.adamw"] = opt.report
    steps = [[float(math.prod(s)) for s in p.tensors] for p, _, _ in sel]
    per_element = sel[0][0].fwd_bytes / sum(steps[0])
    levels = fit_optimizer_levels(steps, seconds, overhead, caches, per_element, OPTIMIZER_WORKING_SET_BYTES) \
        if caches else None
    if levels is not None and levels.report.median < opt.report.median:
        out.optimizer_levels = OptimizerLevels(levels.capacities, levels.bandwidths)
        out.optimizer_per_tensor_s = levels.per_tensor_s
        out.report["membound.adamw"] = levels.report


def fit_surfaces(grid, dtype: str, sms: int | None = None, overlap: bool = False, overhead: float = 0.0,
                 caches: tuple[int, ...] = (), cpu_flash: bool = False) -> Surfaces:
    """Every surface of the grid; ``sms`` and ``overlap`` on a GPU (wave quantisation,
    asynchronous launches); ``overhead``: the per-op overhead (s) the optimizer's price adds;
    ``caches``: the host's cache levels (``cache.cache_levels``) the optimizer's rate may follow;
    ``cpu_flash``: attention ran torch's CPU flash kernel (``attention_surfaces``)."""
    out = Surfaces()
    gemm_surfaces(grid.gemm, dtype, sms, overlap, out)
    attention_surfaces(grid.attention, dtype, overlap, out, cpu_flash)
    for other, results in grid.attention_other.items():
        attention_surfaces(results, other, overlap, out, cpu_flash)
    membound_surfaces(grid.membound, out, overhead, caches)
    return out


def device_numbers(s: Surfaces, dtype: str) -> dict[str, float | dict]:
    """The ``DeviceProfile`` numbers a machine-calibrated profile states beside its surfaces
    (what prices a shape where no surface does): peak FLOP/s per dtype (each dtype's fitted
    asymptote), a ``GemmEfficiency`` curve with efficiency <= 1 (max 1, the geometric mean of
    the forward GEMM's half-saturation sizes), the median memory-bound bandwidth and fused
    attention's achieved fraction of peak on the executed (causal: half the counted) FLOPs."""
    peaks = {dt: fits["linear"].peak for dt, fits in s.gemm.items() if "linear" in fits}
    linear = s.gemm[dtype]["linear"]
    half = math.exp(float(np.mean(np.log(np.maximum(linear.half, 1e-3)))))
    att = s.attention.get(dtype, {}).get("fwd")
    return {
        "peak_flops": {k: float(v) for k, v in sorted(peaks.items())},
        "gemm": {"max_efficiency": 1.0, "half_dim": float(half)},
        "memory_bandwidth": float(np.median(list(s.rates.values()))) if s.rates else 0.0,
        "attention_efficiency": float(min(1.0, 0.5 * att.peak / peaks[dtype])) if att else 0.5,
    }
