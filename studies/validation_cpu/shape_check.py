"""Does the machine grid's GEMM surface price the GEMMs of models it never saw? The grid's
GEMMs (``parsim calibrate``'s points) and every GEMM of the held-out models and the demo's
model (tp 1 and 2, mbs 1 and 2: forward, input gradient, weight gradient, batched attention
products) timed together, round-robin, one thread, cold operands (``compute.bench_gemms``), so
the machine's drift is common to both; the surfaces are fitted on the grid's points only
(``machine_fit.gemm_surfaces``) and price the models' shapes.

Per model and form: the shapes' median |predicted / measured - 1| and the ratio of the
summed predicted to the summed measured seconds (what a layer's GEMM time is off by).

    .venv/bin/python studies/validation_cpu/shape_check.py > shape_check.txt     # ~2 min
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
MODELS = ("heldout/model_gpt.yaml", "heldout/model_llama.yaml", "heldout/model_deep.yaml", "cpu-small")


def main() -> None:
    import torch

    from parsim.calibration.compute import bench_gemms
    from parsim.calibration.machine_bench import FULL_GRID, estimate_rate, plan_grid
    from parsim.calibration.machine_fit import Surfaces, gemm_surfaces
    from parsim.calibration.runner import FULL
    from parsim.calibration.shapes import gemm_points
    from parsim.calibration.timer import Clock
    from parsim.specs import DTYPES, load_model

    torch.set_num_threads(1)
    clock = Clock(torch.device("cpu"))
    rates = {dt: estimate_rate(dt, clock) for dt in DTYPES}
    grid = plan_grid("cpu", "fp32", FULL_GRID, rates, False).gemm["fp32"]
    models = {name: load_model(HERE / name if name.endswith(".yaml") else name) for name in MODELS}
    shapes = {name: gemm_points(spec, [1, 2], [1, 2], "fp32") for name, spec in models.items()}
    points = grid + [p for pts in shapes.values() for p in pts]
    t0 = time.time()
    summaries = bench_gemms(points, "fp32", clock, FULL.repeats, FULL.gemm_budget_s / 4)
    measured = dict(zip(range(len(points)), summaries))
    print(f"{len(grid)} grid GEMMs and {len(points) - len(grid)} model GEMMs timed together round-robin in "
          f"{time.time() - t0:.0f} s (one thread, cold operands)", file=sys.stderr)
    fits = Surfaces()
    gemm_surfaces({"fp32": [(p, measured[i]) for i, p in enumerate(grid)]}, "fp32", None, False, fits)
    print("fit report (grid, leave-out median): " + ", ".join(
        f"{k} {r.median:.1%}" for k, r in sorted(fits.report.items())))
    print(f"{'model':24} {'form':12} {'shapes':>6} {'median |e|':>10} {'sum pred / sum meas':>20}")
    offset = len(grid)
    for name, pts in shapes.items():
        rows = []
        for i, p in enumerate(pts, start=offset):
            fit = fits.gemm["fp32"][p.form]
            pred = fit.seconds(p.flops, tuple(p.key), p.batch)
            rows.append((p.form, pred, measured[i].median))
        offset += len(pts)
        for form in sorted({r[0] for r in rows}):
            sel = [r for r in rows if r[0] == form]
            errs = [abs(pr / m - 1) for _, pr, m in sel]
            ratio = sum(pr for _, pr, _ in sel) / sum(m for _, _, m in sel)
            print(f"{models[name].name[:24]:24} {form:12} {len(sel):6d} {statistics.median(errs):10.1%} "
                  f"{ratio:20.3f}")
        ratio = sum(pr for _, pr, _ in rows) / sum(m for _, _, m in rows)
        print(f"{models[name].name[:24]:24} {'all':12} {len(rows):6d} "
              f"{statistics.median(abs(pr / m - 1) for _, pr, m in rows):10.1%} {ratio:20.3f}")
    worst = sorted(((abs(fits.gemm['fp32'][p.form].seconds(p.flops, tuple(p.key), p.batch) / measured[i].median - 1),
                     p) for i, p in enumerate(points) if i >= len(grid)), key=lambda r: -r[0])[:8]
    print("worst shapes: " + "; ".join(f"{p.form} {tuple(int(d) for d in p.key)} b{p.batch} {e:.0%}" for e, p in worst))
    np.seterr(all="ignore")


if __name__ == "__main__":
    main()
