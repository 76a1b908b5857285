"""Which form should a memory-bound op's surface take? The machine grid's memory-bound ops
measured ``--runs`` times back to back as ``parsim calibrate`` measures them (one thread, the
default grid), and each run's points fitted three ways, with the leave-out median the
calibration's fit report gives (5 folds, both passes of a left-out size predicted):

* ``hockney``: ``fit.fit_alpha_beta`` per pass, the collectives' fit the memory-bound ops used
  before: beta from the largest sizes only, a non-positive slope refused (beta = t / x of the
  largest instead, an upper bound);
* ``line``: alpha + beta x bytes, non-negative least squares on relative residuals;
* ``line + LLC``: the same with a second rate for the bytes past the last-level cache
  (``surface_fit.fit_membound`` as shipped; sysfs's last level, ``cache.cache_levels``).

    PARSIM_HOST_MEMORY=keep .venv/bin/python studies/validation_cpu/membound_forms.py --runs 3 > membound_forms.txt
    # ~10 s; PARSIM_HOST_MEMORY as for the calibration (unset: glibc's default, page faults and all)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import numpy as np


def hockney_leave_out(sel) -> float:
    """The leave-out median of the pre-change fit (``fit_alpha_beta`` per pass, its folds)."""
    from parsim.calibration.fit import FitWarning, fit_alpha_beta
    from parsim.calibration.surface_fit import folds_of
    errors = []
    passes = [([p.fwd_bytes for p, _, _ in sel], [f.median for _, f, _ in sel])]
    if all(b is not None for _, _, b in sel):
        passes.append(([p.bwd_bytes for p, _, _ in sel], [b.median for _, _, b in sel]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitWarning)
        for x, t in passes:
            x, t = np.asarray(x, float), np.asarray(t, float)
            for test in folds_of(len(x)):
                train = np.setdiff1d(np.arange(len(x)), test)
                errors.extend(np.abs(fit_alpha_beta(x[train], t[train]).time(x[test]) / t[test] - 1))
    return float(np.median(errors))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    import torch

    from parsim.calibration.cache import cache_levels
    from parsim.calibration.compute import bench_membound
    from parsim.calibration.grid import membound_grid
    from parsim.calibration.machine_bench import FULL_GRID
    from parsim.calibration.runner import FULL
    from parsim.calibration.surface_fit import fit_membound
    from parsim.calibration.timer import Clock

    from parsim.executor.host_alloc import apply_host_memory_policy

    torch.set_num_threads(1)
    policy = apply_host_memory_policy()      # as ``parsim calibrate`` measures (PARSIM_HOST_MEMORY)
    device = torch.device("cpu")
    clock, llc = Clock(device), float(cache_levels(device)[-1])
    points = [p for p in membound_grid("cpu", "fp32", FULL_GRID.membound) if p.name != "adamw"]
    started, rows = time.time(), {}
    for run in range(args.runs):
        measured = [(p, *bench_membound(p, "fp32", clock, FULL.repeats, FULL.op_budget_s)) for p in points]
        for name in sorted({p.name for p in points}):
            sel = [r for r in measured if r[0].name == name]
            bwd = all(b is not None for _, _, b in sel)
            args_ = ([p.fwd_bytes for p, _, _ in sel], [f.median for _, f, _ in sel],
                     [p.bwd_bytes for p, _, _ in sel] if bwd else None, [b.median for _, _, b in sel] if bwd else None)
            line = fit_membound(*args_)[1].median
            fit, knee = fit_membound(*args_, knee=llc)
            rows.setdefault(name, []).append((hockney_leave_out(sel), line, knee.median, fit.knee is not None))
    print(f"memory-bound grid measured {args.runs} times (full grid, one thread, last-level cache {llc / 2**20:.0f} "
          f"MiB, host memory {policy}), {time.time() - started:.0f} s; leave-out median per run")
    print(f"{'op':16} {'hockney':>16} {'line':>16} {'line + LLC':>16}  second rate used")
    for name, per_run in rows.items():
        cells = ["/".join(f"{r[i]:.1%}" for r in per_run) for i in range(3)]
        print(f"{name:16} {cells[0]:>16} {cells[1]:>16} {cells[2]:>16}  "
              f"{'/'.join('yes' if r[3] else 'no' for r in per_run)}")
    for i, label in enumerate(("hockney", "line", "line + LLC")):
        print(f"median over the ops, {label}: " + " / ".join(
            f"{statistics.median(per_run[run][i] for per_run in rows.values()):.1%}" for run in range(args.runs)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
