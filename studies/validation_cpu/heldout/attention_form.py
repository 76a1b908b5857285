"""Is the attention fits' leave-out error (the fit report's worst table: 9-16 % median on the Zen 4
VM, 2026-12-03) the machine's noise or the surface's form? The calibration's attention grid
(24 points, torch's CPU flash kernel, forward and backward) timed in three passes, round-robin
as the calibration times it (``calibration.round_robin``), in fp32 and bf16; then per pass and
dtype:

* noise: each point's median |pass / median of the passes - 1| over the points;
* form: the calibration's own surface (``machine_fit.attention_fit``: roofline over (seq, head
  dim, batch x heads) on the kernel's executed FLOPs, with or without seconds per head or per
  (head, query block), the best of them) fitted to the median of the passes, its 5-fold
  leave-out median and max; and the same without the per-block form (the calibration before
  2026-12-03).

    .venv/bin/python studies/validation_cpu/heldout/attention_form.py > studies/validation_cpu/heldout/attention_form.txt

About 25 s, one core.
"""
from __future__ import annotations

import numpy as np
import torch

from parsim.calibration.grid import attention_grid, ranges_for
from parsim.calibration.machine_bench import estimate_rate
from parsim.calibration.machine_fit import attention_fit, attention_work
from parsim.calibration.round_robin import bench_attention_many
from parsim.calibration.timer import Clock

PASSES = 3
POINTS = 24          # the full grid's attention points (``machine_bench.FULL_GRID``)
REPEATS, BUDGET_S = 10, 0.4    # the full calibration's samples and seconds per point (``runner.FULL``)


def main() -> None:
    torch.set_num_threads(1)
    clock = Clock(torch.device("cpu"))
    cap = estimate_rate("fp32", clock) * ranges_for("cpu").call_s
    for dtype, seed in (("fp32", 0), ("bf16", 1)):     # the calibrated dtype's grid, another dtype's
        points = attention_grid("cpu", POINTS, cap, seed=seed)
        timed = np.array([[[f.median, b.median] for f, b in bench_attention_many(points, dtype, clock, REPEATS,
                                                                                  BUDGET_S)]
                          for _ in range(PASSES)])          # (pass, point, fwd / bwd)
        median = np.median(timed, axis=0)
        for column, pass_ in ((0, "fwd"), (1, "bwd")):
            noise = np.median(np.abs(timed[:, :, column] / median[:, column] - 1.0))
            work, dims = attention_work(points, pass_, cpu_flash=True)
            head = attention_fit(work, dims, median[:, column])[1]              # no per-block form
            fit, block = attention_fit(work, dims, median[:, column], cpu_flash=True)
            form = "per block" if fit.per_block else "per head" if fit.per_batch_s else "roofline"
            print(f"{dtype} {pass_}: {len(points)} points, {PASSES} passes: pass-to-median noise {noise:5.1%};"
                  f" surface leave-out median {head.median:5.1%}, max {head.max:5.1%} without the per-block term,"
                  f" {block.median:5.1%}, max {block.max:5.1%} as calibrated ({form})", flush=True)

if __name__ == "__main__":
    main()
