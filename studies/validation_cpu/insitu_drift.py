"""How steady is the in-situ TP latency the calibration measures once? A time series of it.

``parsim calibrate`` measures a synchronous collective's cost after a compute block once
(``calibration.insitu.measure_insitu``: the median of 10 samples of 8 calls each); a TP plan
validated minutes later pays whatever the host's wake-ups cost then. This script runs that same
function on 2 gloo ranks (256 KiB all-reduce, the deep held-out model's TP buffer, after a
block of two 128 x 512 x 1024 GEMMs, ~2 ms) every ``--every`` seconds for ``--minutes`` and
prints each point's median and the spread over the run, next to what the held-out runs'
calibrations read.

    .venv/bin/python studies/validation_cpu/insitu_drift.py [--minutes 6] [--every 10] \
        | tee studies/validation_cpu/insitu_drift.txt
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BYTES = 256 * 1024


def rank_main(rank: int, port: int, minutes: float, every: float) -> list[tuple[float, float]] | None:
    """(seconds since the start, median seconds per call) per point; rank 0 returns them."""
    import datetime

    import torch
    import torch.distributed as dist

    from parsim.calibration.insitu import group_call, measure_insitu
    from parsim.calibration.timer import Clock
    from parsim.executor.host_alloc import apply_host_memory_policy

    torch.set_num_threads(1)
    apply_host_memory_policy()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    dev = torch.device("cpu")
    x, w = torch.randn(128, 512), torch.randn(1024, 512)
    points, t0 = [], time.perf_counter()
    try:
        with torch.no_grad():
            while time.perf_counter() - t0 < minutes * 60:
                start = time.perf_counter() - t0
                res = measure_insitu(lambda: torch.nn.functional.linear(x, w),
                                     lambda op, nb: group_call(op, nb, None, 2, dev, dist, torch), (BYTES,), 10,
                                     Clock(dev), dist, torch, dev, ops=("all_reduce",))
                points.append((start, statistics.median(res["all_reduce"][BYTES])))
                stop = torch.tensor([float(time.perf_counter() - t0 + every >= minutes * 60)])
                dist.broadcast(stop, 0)             # both ranks leave the loop together
                if stop.item():
                    break
                time.sleep(every)
    finally:
        dist.destroy_process_group()
    return points if rank == 0 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--every", type=float, default=10.0)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("PARSIM_HOST_MEMORY", "keep")
    from parsim.executor.processes import free_port, run_ranks

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"in-situ 2-rank all-reduce of {BYTES // 1024} KiB after two 128x512x1024 GEMMs "
          f"(calibration.insitu.measure_insitu, 10 samples a point), {when}")
    points = run_ranks(rank_main, (free_port(), args.minutes, args.every), 2)[0]
    for start, median in points:
        print(f"  {start:6.0f} s  {median * 1e3:5.2f} ms")
    values = sorted(m for _, m in points)
    print(f"{len(values)} points: median {statistics.median(values) * 1e3:.2f} ms, "
          f"range {values[0] * 1e3:.2f}-{values[-1] * 1e3:.2f} ms")
    print(f"load average (1, 5, 15 min) {tuple(round(x, 2) for x in os.getloadavg())} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
