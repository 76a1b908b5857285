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
    opts = runner.make_options(quick=quick, ranks="2")
    s = opts.settings
    sizes = runner.insitu_sizes(opts.model, "fp32", s.mbs)
    block = runner.insitu_gemm(opts.model, 2, min(s.mbs))
    return CommJob(world=2, device_type="cpu", sizes=s.comm_sizes, ops=COLLECTIVES, repeats=s.comm_repeats,
                   point_budget_s=s.comm_budget_s, min_sample_s=s.comm_min_sample_s,
                   contention_gemm=runner._contention_shape(opts), contention_dtype="fp32",
                   contention_s=s.contention_s, layer_model=opts.model, layer_mbs=min(s.mbs),
                   rounds=s.contention_rounds, insitu_sizes=sizes, line_bytes=min(sizes),
                   insitu_blocks=((2, *block),) if block else ())


if __name__ == "__main__":
    for _ in range(3):
        for quick in (True, False):
            t0 = time.perf_counter()
            ranks = run_comm_job(job(quick))
            points = [f"{op} {x}: {statistics.median(v) * 1e3:.2f} ms, mean {statistics.mean(v) * 1e3:.2f}"
                      for op, per_size in ranks[0]["insitu"].items() for x, v in per_size.items()]
            print(f"{'quick' if quick else 'full ':5s} {time.perf_counter() - t0:5.1f} s  " + "; ".join(points),
                  flush=True)
