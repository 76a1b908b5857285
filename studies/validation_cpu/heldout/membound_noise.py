"""How much of a calibration's memory-bound leave-out error is the way the points are timed: the
machine grid's memory-bound points (AdamW aside) timed in three passes each way, alternately, on
one thread, as a calibration times them: one point after the other (``compute.bench_membound``,
every sample of a point back to back, as calibrations did before 2026-12-01) and round-robin
(``round_robin.bench_membound_many``, what ``parsim calibrate`` runs). Per op, the leave-out
error (``device.extra.fit_report``) of the fit of the median of the three passes and of each pass
alone; then how the two ways' point medians compare.

    OMP_NUM_THREADS=1 PARSIM_HOST_MEMORY=keep .venv/bin/python studies/validation_cpu/heldout/membound_noise.py [DTYPE]   # ~35 s
"""
from __future__ import annotations

import sys
import time

import numpy as np


def main(dtype: str) -> None:
    import torch

    from parsim.calibration.cache import cache_levels
    from parsim.calibration.compute import bench_membound
    from parsim.calibration.grid import membound_grid
    from parsim.calibration.machine_bench import median_of
    from parsim.calibration.machine_fit import Surfaces, membound_surfaces
    from parsim.calibration.round_robin import bench_membound_many
    from parsim.calibration.runner import FULL
    from parsim.calibration.timer import Clock
    from parsim.executor.host_alloc import apply_host_memory_policy

    apply_host_memory_policy()          # as the executor's ranks and the calibration
    torch.set_num_threads(1)
    device = torch.device("cpu")
    clock, caches = Clock(device), cache_levels(device)
    points = [p for p in membound_grid("cpu", dtype, 8) if p.name != "adamw"]
    print(f"{len(points)} points, {dtype}, caches {caches} bytes")
    ways = {"one by one": [], "round-robin": []}
    for k in range(3):
        for way, passes in ways.items():
            t0 = time.perf_counter()
            if way == "one by one":
                passes.append([bench_membound(p, dtype, clock, FULL.repeats, FULL.op_budget_s) for p in points])
            else:
                passes.append(bench_membound_many(points, dtype, clock, FULL.repeats, FULL.op_budget_s))
            print(f"pass {k + 1} {way}: {time.perf_counter() - t0:.1f} s", flush=True)

    def leave_out(results: list) -> dict[str, float]:
        s = Surfaces()
        membound_surfaces(results, s, 0.0, caches)
        return {k.split(".", 1)[1]: v.median for k, v in s.report.items()}

    def medians(passes: list) -> list:
        return [(p, median_of([r[i][0] for r in passes]), median_of([r[i][1] for r in passes]))
                for i, p in enumerate(points)]

    fits = {way: [leave_out(medians(passes))] + [leave_out([(p, *r[i]) for i, p in enumerate(points)])
                                                  for r in passes] for way, passes in ways.items()}
    print(f"\n{'op':16s} leave-out median: median of 3 passes (pass 1 / 2 / 3)")
    for name in sorted(fits["one by one"][0]):
        row = "   ".join(f"{way} {f[0][name]:5.1%} ({' / '.join(f'{x[name]:5.1%}' for x in f[1:])})"
                         for way, f in fits.items())
        print(f"{name:16s} {row}")
    for way, f in fits.items():
        print(f"median over ops, {way}: {np.median(list(f[0].values())):.1%}")
    one, rr = medians(ways["one by one"]), medians(ways["round-robin"])
    ratio = [b[c].median / a[c].median for a, b in zip(one, rr) for c in (1, 2) if a[c] is not None]
    print(f"round-robin / one-by-one point medians: median {np.median(ratio):.3f}, "
          f"p10 {np.percentile(ratio, 10):.3f}, p90 {np.percentile(ratio, 90):.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp32")
