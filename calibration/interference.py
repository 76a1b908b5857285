"""The compute an overlapped collective takes from its rank, measured inside a collectives job
(``comm.run_comm_job``, on every rank of a real process group): ``comm_interference`` in the
profile (``tables.interference_curve``), which ``parsim.costs.host.comm_interference`` charges
a CPU rank per second of collective that overlapped its compute."""
from __future__ import annotations

import time
from typing import Callable

from .comm import slowest

INTERFERENCE_BYTES = 4 * 2**20     # a DP gradient bucket's order of magnitude (fp32, 1M elements)


def measure_interference(gemm: Callable[[], object], budget_s: float, clock, dist, torch, device) -> list[float]:
    """Compute lost to an overlapped collective, per second of collective: every rank runs
    ``n`` GEMMs alone (T0), ``k`` all-reduces of 4 MiB alone (C), then the same ``k``
    all-reduces issued asynchronously while it runs the ``n`` GEMMs (T1); a sample is
    (T1 - T0) / C, 0 when the collective costs the compute nothing (its own engines), about
    1 when they share one core. ``k`` keeps the collectives to about half of T0 so they end
    inside the compute, and ``n`` GEMMs last about ``budget_s / 2`` (the job's contention
    budget). Three samples."""
    x = torch.zeros(INTERFERENCE_BYTES // 4, dtype=torch.float32, device=device)

    def timed(fn, calls: int) -> float:
        clock.sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        clock.sync()
        return time.perf_counter() - t0

    gemm()
    dist.all_reduce(x)
    per_gemm, = slowest([timed(gemm, 4) / 4], dist, torch, device)
    per_reduce, = slowest([timed(lambda: dist.all_reduce(x), 4) / 4], dist, torch, device)
    n = max(4, int(budget_s / 2 / per_gemm))
    k = max(1, int(0.5 * n * per_gemm / per_reduce))
    samples = []
    for _ in range(3):
        alone = timed(gemm, n)
        comm = timed(lambda: dist.all_reduce(x), k)
        clock.sync()
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.all_reduce(x, async_op=True) for _ in range(k)]
        for _ in range(n):
            gemm()
        clock.sync()
        both = time.perf_counter() - t0
        for w in works:
            w.wait()
        samples.append(max(both - alone, 0.0) / comm)
    return samples
