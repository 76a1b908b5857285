"""How low can the calibration's own leave-out error go on this machine? The machine grid
measured twice, back to back, as ``parsim calibrate`` measures it (one thread, the default
grid, the same points both times).

Per fit of the profile's fit report (``gemm.<dtype>.<form>``, ``attention.<dtype>.<pass>``,
``membound.<op>``) it prints the retest error (median over the points of |A / B - 1|: the same
point measured twice), the noise floor it implies for one measurement (retest / sqrt 2, where
both runs' errors are independent and alike), the leave-out median of each run's fit (the
number ``parsim calibrate`` reports) and how well run A's fit predicts run B's points. A fit
whose leave-out sits at the floor is as good as this machine lets it be; one well above has a
form that misses the data.

    .venv/bin/python studies/validation_cpu/grid_retest.py [--quick] > grid_retest.txt    # ~4 min (--quick ~1)
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np


def per_point(grid) -> dict[str, dict[tuple, float]]:
    """{fit key: {point: seconds}} of one measured grid (both passes of an op under its key)."""
    out: dict[str, dict[tuple, float]] = {}
    for dt, rows in grid.gemm.items():
        for p, s in rows:
            out.setdefault(f"gemm.{dt}.{p.form}", {})[(p.key, p.batch)] = s.median
    for p, f, b in grid.attention:
        for pass_, s in (("fwd", f), ("bwd", b)):
            out.setdefault(f"attention.{{dtype}}.{pass_}", {})[(p.seq, p.head_dim, p.batch_heads)] = s.median
    for p, f, b in grid.membound:
        key = f"membound.{p.name}"
        out.setdefault(key, {})[(p.source, p.fwd_bytes, "fwd", str(p.tensors))] = f.median
        if b is not None:
            out[key][(p.source, p.fwd_bytes, "bwd", str(p.tensors))] = b.median
    return out


def cross(fits, key: str, grid) -> float | None:
    """Median |predicted / measured - 1| of run B's points by run A's fitted surface."""
    from parsim.calibration.surface_fit import Points, predict
    family, *rest = key.split(".")
    errs = []
    if family == "gemm":
        dt, form = rest
        fit = fits.gemm.get(dt, {}).get(form)
        rows = [(p, s) for p, s in grid.gemm.get(dt, []) if p.form == form]
        if fit is None or not rows:
            return None
        pts = Points.of([p.flops for p, _ in rows], [p.key for p, _ in rows], [s.median for _, s in rows],
                        [p.batch for p, _ in rows])
        errs = list(predict(fit, pts) / pts.seconds - 1)
    elif family == "membound" and rest[0] in fits.membound:
        fit = fits.membound[rest[0]]
        for p, f, b in grid.membound:
            if p.name == rest[0]:
                errs.append(fit.seconds("fwd", p.fwd_bytes) / f.median - 1)
                if b is not None and fit.bwd is not None:
                    errs.append(fit.seconds("bwd", p.bwd_bytes) / b.median - 1)
    return float(np.median(np.abs(errs))) if errs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the quick grid (parsim calibrate --quick)")
    ap.add_argument("--save", help="also pickle both measured grids (machine_bench.GridResults) to this file")
    args = ap.parse_args()
    import torch

    from parsim.calibration.cache import cache_levels
    from parsim.calibration.machine_bench import FULL_GRID, QUICK_GRID, estimate_rate, measure_grid, plan_grid
    from parsim.calibration.machine_fit import fit_surfaces
    from parsim.calibration.runner import FULL, QUICK
    from parsim.calibration.timer import Clock
    from parsim.specs import DTYPES

    from parsim.executor.host_alloc import apply_host_memory_policy

    torch.set_num_threads(1)
    apply_host_memory_policy()      # as ``parsim calibrate`` measures (PARSIM_HOST_MEMORY)
    device, clock, settings = torch.device("cpu"), Clock(torch.device("cpu")), QUICK if args.quick else FULL
    rates = {dt: estimate_rate(dt, clock) for dt in DTYPES}
    plan = plan_grid("cpu", "fp32", QUICK_GRID if args.quick else FULL_GRID, rates, args.quick)
    runs, fits, started = [], [], time.time()
    for name in ("A", "B"):
        t0 = time.time()
        grid = measure_grid(plan, "fp32", clock, settings.repeats, settings.gemm_budget_s / 4, settings.op_budget_s / 2,
                            lambda label: None)
        runs.append(grid)
        fits.append(fit_surfaces(grid, "fp32", caches=cache_levels(device)))
        print(f"run {name}: {time.time() - t0:.0f} s", file=sys.stderr)
    if args.save:
        import pickle
        with open(args.save, "wb") as f:
            pickle.dump({"grids": runs, "caches": cache_levels(device)}, f)
    a, b = (per_point(g) for g in runs)
    print(f"machine grid measured twice back to back ({'quick' if args.quick else 'full'} grid, one thread), "
          f"{time.time() - started:.0f} s in all")
    print(f"{'fit':28} {'points':>6} {'retest':>7} {'floor':>6} {'leave-out A':>11} {'leave-out B':>11} "
          f"{'A predicts B':>12}")
    rows = []
    for key in sorted(fits[0].report):
        lookup = key.replace("fp32", "{dtype}") if key.startswith("attention") else key
        pa, pb = a.get(lookup, {}), b.get(lookup, {})
        retest = [abs(pa[k] / pb[k] - 1) for k in pa if k in pb]
        if not retest:
            continue
        r = statistics.median(retest)
        la, lb = fits[0].report[key].median, fits[1].report[key].median if key in fits[1].report else float("nan")
        c = cross(fits[0], key, runs[1])
        rows.append((r / math.sqrt(2), la, lb))
        print(f"{key:28} {len(retest):6d} {r:7.1%} {r / math.sqrt(2):6.1%} {la:11.1%} {lb:11.1%} "
              f"{'-' if c is None else f'{c:.1%}':>12}")
    print(f"median over the fits: floor {statistics.median(x[0] for x in rows):.1%}, leave-out A "
          f"{statistics.median(x[1] for x in rows):.1%}, B {statistics.median(x[2] for x in rows):.1%}")


if __name__ == "__main__":
    main()
