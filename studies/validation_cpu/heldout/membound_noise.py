"""How much of a calibration's memory-bound leave-out error is the machine: the machine grid's
memory-bound points (AdamW aside) timed in three passes back to back on one thread, as a
calibration times them; per op, the leave-out error (``device.extra.fit_report``) of the fit of
each pass alone and of the median of the three, and each point's spread between its passes
(max / min - 1) and within a pass (p90 / p10 - 1). Where the spreads are as large as the
leave-out errors, the fit report measures the machine's repeatability, not the surface's form.

    OMP_NUM_THREADS=1 PARSIM_HOST_MEMORY=keep .venv/bin/python studies/validation_cpu/heldout/membound_noise.py [DTYPE]   # ~20 s
"""
from __future__ import annotations

import sys
import time

import numpy as np


def main(dtype: str) -> None:
    import torch

    from parsim.calibration.cache import cache_levels
    from parsim.calibration.grid import membound_grid
    from parsim.calibration.machine_bench import MemboundPasses
    from parsim.calibration.machine_fit import Surfaces, membound_surfaces
    from parsim.calibration.runner import FULL
    from parsim.calibration.timer import Clock
    from parsim.executor.host_alloc import apply_host_memory_policy

    apply_host_memory_policy()          # as the executor's ranks and the calibration
    torch.set_num_threads(1)
    device = torch.device("cpu")
    clock, caches = Clock(device), cache_levels(device)
    points = [p for p in membound_grid("cpu", dtype, 8) if p.name != "adamw"]
    print(f"{len(points)} points, {dtype}, caches {caches} bytes")
    rounds = MemboundPasses(points, 3, dtype, clock, FULL.repeats, FULL.op_budget_s)   # as a full calibration
    while rounds.left:
        t0 = time.perf_counter()
        rounds.run()
        print(f"pass {len(rounds.done)}: {time.perf_counter() - t0:.0f} s", flush=True)
    passes = rounds.done

    def leave_out(results: list) -> dict[str, float]:
        s = Surfaces()
        membound_surfaces(results, s, 0.0, caches)
        return {k.split(".", 1)[1]: v.median for k, v in s.report.items()}

    fits = [leave_out([(p, f, b) for p, (f, b) in zip(points, r)]) for r in passes]
    fits.append(leave_out(rounds.summaries()))
    print(f"\n{'op':16s} leave-out median: pass 1 / 2 / 3 / median of passes | forward spread, median "
          f"over points: between passes, within a pass")
    for name in sorted({p.name for p in points}):
        idx = [i for i, p in enumerate(points) if p.name == name]
        between = [max(r[i][0].median for r in passes) / min(r[i][0].median for r in passes) - 1 for i in idx]
        within = [r[i][0].p90 / r[i][0].p10 - 1 for r in passes for i in idx]
        lo = " / ".join(f"{f.get(name, float('nan')):5.1%}" for f in fits)
        print(f"{name:16s} {lo} | {np.median(between):5.1%}, {np.median(within):5.1%}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp32")
