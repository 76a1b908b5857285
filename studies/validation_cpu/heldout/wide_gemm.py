"""Does a CPU GEMM's rate fall with the output's width n, and with n alone?

F.linear (fp32, one thread, warm: the fastest of >= 3 calls over 0.25 s) over a sub-grid of
m in 64..1024, n in 512..16384, k in 256..1024 -- the LM heads' region (a few hundred tokens
times a vocabulary) -- twice; then the calibration's roofline form fitted to it as it stands
and with a factor 1 / (1 + d / wide) on each dimension d in turn (``RooflineFit.wide`` puts it
on n), each with its 5-fold leave-out error.

    .venv/bin/python studies/validation_cpu/heldout/wide_gemm.py > studies/validation_cpu/heldout/wide_gemm.txt
    .venv/bin/python studies/validation_cpu/heldout/wide_gemm.py grad_weight > studies/validation_cpu/heldout/wide_gemm_grad_weight.txt

Every form is timed as the calibration runs it (``calibration.compute.gemm_callable``, warm;
linear is F.linear); grad_input and grad_weight time that backward GEMM on the same (m, n, k)
executed shapes (``costs.ops.executed_gemm``: a weight gradient's m is the layer's input width,
n its output width, k the tokens).

About a minute. Run it with nothing else on the machine.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np

M = (64, 128, 256, 512, 1024)
N = (512, 1024, 2048, 4096, 8192, 16384)
K = (256, 512, 1024)


def measure(form: str = "linear") -> dict[tuple[int, int, int], float]:
    import torch

    from parsim.calibration.compute import gemm_callable
    from parsim.calibration.shapes import GemmPoint

    torch.set_num_threads(1)
    best: dict[tuple[int, int, int], float] = {}
    for _ in range(2):
        for k in K:
            for m in M:
                for n in N:
                    with torch.no_grad():       # warm operands: the same tensors every call
                        call = gemm_callable(GemmPoint((m, n, k), 1, form, "wide"), "fp32", torch.device("cpu"))
                    call()
                    times, start = [], time.perf_counter()
                    while time.perf_counter() - start < 0.25 or len(times) < 3:
                        t0 = time.perf_counter()
                        call()
                        times.append(time.perf_counter() - t0)
                    best[(m, n, k)] = min(best.get((m, n, k), math.inf), min(times))
    return best


def fit_report(best: dict[tuple[int, int, int], float], axis: int | None) -> tuple[float, float, float | None]:
    """(leave-out median, p90, fitted width) of the roofline form with the width factor on ``axis``."""
    from parsim.calibration.surface_fit import Points, roofline_with_report
    keys = sorted(best)
    dims = np.array(keys, dtype=float)
    if axis is not None:       # the calibration's form puts the factor on dims[1]: move the axis there
        dims[:, [1, axis]] = dims[:, [axis, 1]]
    pts = Points.of(2 * np.prod(np.array(keys, dtype=float), axis=1), dims, [best[k] for k in keys])
    fit, report = roofline_with_report(pts, wide=axis is not None)
    return report.median, report.p90, fit.wide


def main(form: str = "linear") -> None:
    best = measure(form)
    name = "F.linear" if form == "linear" else f"{form} (executed m x n x k)"
    print(f"# {name} fp32, 1 thread, GFLOP/s (fastest of two passes); {os.cpu_count()} CPUs")
    for k in K:
        print(f"k = {k:4d}   n:" + "".join(f"{n:>7d}" for n in N))
        for m in M:
            print(f"  m = {m:4d}  " + "".join(f"{2 * m * n * k / best[(m, n, k)] / 1e9:7.1f}" for n in N))
    print("\n# the roofline form (5-fold leave-out |predicted / measured - 1|)")
    for label, axis in (("as calibrated", None), ("x 1/(1 + m/wide)", 0), ("x 1/(1 + n/wide)", 1),
                        ("x 1/(1 + k/wide)", 2)):
        med, p90, wide = fit_report(best, axis)
        print(f"{label:18s} median {med:6.1%}  p90 {p90:6.1%}" + (f"  wide {wide:,.0f}" if wide else ""))


if __name__ == "__main__":
    import sys
    main(*sys.argv[1:2])
