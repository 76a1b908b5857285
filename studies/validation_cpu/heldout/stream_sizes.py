"""Does a memory-bound op slow down as much with 2 ranks at once when its tensors fit in cache?
The profile's ``contention_membound`` is measured on one streaming add of 3 x 16 MiB
(``calibration.comm._contention_blocks``) and priced on every memory-bound op of a plan
(``costs.host.host_contention``), whose tensors on the held-out models are mostly 0.25-8 MiB.

    .venv/bin/python studies/validation_cpu/heldout/stream_sizes.py [--rounds N]   # ~1 min

Two processes (one thread each), as the calibration's rounds run them: per round and size, rank 0
alone (rank 1 waits in a barrier), then both at once over the same number of calls; prints per
size the median over rounds of the ratio (both at once: mean of the two ranks' seconds per call,
over rank 0's alone) and rank 0's alone rate in GB/s (3 tensors' bytes a call)."""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

SIZES = [2**k for k in range(14, 24, 1)]        # fp32 elements a tensor: 64 KiB .. 32 MiB


def _calls(n: int) -> int:
    return max(20, int(4e9 / (12 * n)))           # ~4 GB of traffic a phase: 40-200 ms


def _rank(rank: int, barrier, out, rounds: int) -> None:
    import torch
    torch.set_num_threads(1)
    results = {}
    for n in SIZES:
        a, b, c = (torch.rand(n) for _ in range(3))
        calls = _calls(n)
        for _ in range(3):
            torch.add(a, b, out=c)
        rows = []
        for _ in range(rounds):
            barrier.wait()
            solo = None
            if rank == 0:
                t0 = time.perf_counter()
                for _ in range(calls):
                    torch.add(a, b, out=c)
                solo = (time.perf_counter() - t0) / calls
            barrier.wait()
            t0 = time.perf_counter()
            for _ in range(calls):
                torch.add(a, b, out=c)
            rows.append((solo, (time.perf_counter() - t0) / calls))
        results[n] = rows
    out.put((rank, results))


def main(rounds: int) -> None:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, barrier, out, rounds)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get() for _ in procs)
    for p in procs:
        p.join()
    print(f"{'MiB a tensor':>12s} {'alone GB/s':>10s} {'2 at once / alone':>18s}  (rounds: ratios)")
    for n in SIZES:
        ratios = [(b0 + b1) / 2 / s0 for (s0, b0), (_, b1) in zip(got[0][n], got[1][n])]
        alone = statistics.median(s for s, _ in got[0][n])
        print(f"{n * 4 / 2**20:12.2f} {12 * n / alone / 1e9:10.1f} {statistics.median(ratios):18.2f}  "
              + ", ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    main(parser.parse_args().rounds)
