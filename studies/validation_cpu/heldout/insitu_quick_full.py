"""Does a quick calibration read the TP collectives' in-situ latencies differently from a full
one? Alternates 2-rank collectives jobs built as ``parsim calibrate --quick`` and ``parsim
calibrate`` build them (``calibration.runner``: sizes, repeats, contention rounds, the reference
layer's in-situ sizes and compute block, 60 in-situ samples each) and prints each job's in-situ
median and mean per collective and size: what ``alpha_insitu`` is fitted from.

    .venv/bin/python studies/validation_cpu/heldout/insitu_quick_full.py   # ~6 min (3 pairs)
"""
from __future__ import annotations

import statistics
import time

import parsim.calibration.runner as runner
from parsim.calibration.comm import COLLECTIVES, CommJob, run_comm_job


def job(quick: bool) -> CommJob:
    return runner.comm_job(runner.make_options(quick=quick, ranks="2"), 2, COLLECTIVES, "cpu")


if __name__ == "__main__":
    for _ in range(3):
        for quick in (True, False):
            t0 = time.perf_counter()
            ranks = run_comm_job(job(quick))
            points = [f"{op} {x}: {statistics.median(v) * 1e3:.2f} ms, mean {statistics.mean(v) * 1e3:.2f}"
                      for op, per_size in ranks[0]["insitu"].items() for x, v in per_size.items()]
            print(f"{'quick' if quick else 'full ':5s} {time.perf_counter() - t0:5.1f} s  " + "; ".join(points),
                  flush=True)
