"""2 gloo ranks on this host: what a synchronous all-reduce (256 KiB) adds to a chain of
compute, split into the call as the executor's trace and the calibration's in-situ probe time
it (wall less the compute timed in line) and the compute it slows after it (the compute timed
in line less the same blocks timed back to back, with no call between them).

Two blocks: ``gemm2``, two MLP GEMMs (512 x 512 x 1024 and back, fp32) as the in-situ probe
computes (``calibration.insitu``), and ``small24``, 24 small ops (layernorm, 256 x 256 GEMM,
GELU, add, six times) like the deep held-out model's. Per block, 12 repeats of: 10 blocks back
to back, 10 calls back to back, then 10 [block, call] in a chain; medians over the repeats of
the two ranks' mean.

    .venv/bin/python studies/validation_cpu/heldout/inline_compute.py   # ~13 s
"""
from __future__ import annotations

import datetime
import os
import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from parsim.executor.processes import free_port

REPEATS, CALLS, WARMUP = 12, 10, 20     # repeats per block; blocks / calls per timed run; warm-up blocks


def blocks() -> dict[str, Callable[[], object]]:
    """{name: a compute block}."""
    torch.manual_seed(0)
    a, w1, w2 = torch.randn(512, 512), torch.randn(1024, 512), torch.randn(512, 1024)
    x, w, norm = torch.randn(256, 256), torch.randn(256, 256), torch.nn.LayerNorm(256)

    def gemm2():
        return F.linear(F.linear(a, w1), w2)

    def small24():
        y = x
        for _ in range(6):
            y = F.gelu(F.linear(norm(y), w)) + x
        return y
    return {"gemm2": gemm2, "small24": small24}


def per_call(fn: Callable[[], object]) -> float:
    """Seconds per call of ``fn`` over ``CALLS`` calls back to back."""
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - t0) / CALLS


def one_repeat(block: Callable[[], object], call: Callable[[], object]) -> tuple[float, float, float, float]:
    """(block back to back, call back to back, block in line, wall of [block, call]) [s], per
    block or call."""
    dist.barrier()
    b2b = per_call(block)
    dist.barrier()
    call()                       # untimed: the barrier's exit skew is not a call's
    calls = per_call(call)
    dist.barrier()
    block()                      # untimed [block, call]: the ranks run as a chain from here
    call()
    busy, t0 = 0.0, time.perf_counter()
    for _ in range(CALLS):
        c0 = time.perf_counter()
        block()
        busy += time.perf_counter() - c0
        call()
    return b2b, calls, busy / CALLS, (time.perf_counter() - t0) / CALLS


def report(name: str, rows: list[list[float]]) -> str:
    """One line: medians over the repeats [ms]."""
    def med(f) -> float:
        return statistics.median(f(r) for r in rows) * 1e3
    return (f"{name:8s} block b2b {med(lambda r: r[0]):6.3f} ms  inline {med(lambda r: r[2]):6.3f}  "
            f"call b2b {med(lambda r: r[1]):5.3f}  in situ as timed {med(lambda r: r[3] - r[2]):5.3f}  "
            f"compute slowed {med(lambda r: r[2] - r[0]):+5.3f}  added per call {med(lambda r: r[3] - r[0]):5.3f}")


def worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    buf = torch.zeros(65536)     # 256 KiB of fp32
    lines = []
    for name, block in blocks().items():
        for _ in range(WARMUP):
            block()
        rows = torch.tensor([one_repeat(block, lambda: dist.all_reduce(buf)) for _ in range(REPEATS)],
                            dtype=torch.float64)
        dist.all_reduce(rows)    # the two ranks' mean
        lines.append(report(name, (rows / 2).tolist()))
    if rank == 0:
        print("\n".join(lines))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ["OMP_NUM_THREADS"] = "1"
    mp.spawn(worker, args=(free_port(),), nprocs=2)
