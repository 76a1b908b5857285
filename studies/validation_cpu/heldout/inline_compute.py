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
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

def blocks() -> dict:
    """{name: a compute block}."""
    torch.manual_seed(0)
    a = torch.randn(512, 512); w1 = torch.randn(1024, 512); w2 = torch.randn(512, 1024)
    def gemm2():
        F.linear(F.linear(a, w1), w2)
    x = torch.randn(256, 256); w = torch.randn(256, 256); ln = torch.nn.LayerNorm(256)
    def small():
        y = x
        for _ in range(6):
            y = ln(y); y = F.linear(y, w); y = F.gelu(y); y = y + x
    return {'gemm2': gemm2, 'small24': small}

def worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=2, timeout=__import__('datetime').timedelta(seconds=60))
    buf = torch.zeros(65536)  # 256 KiB
    res = {}
    for name, blk in blocks().items():
        for _ in range(20): blk()
        rows = []
        for rep in range(12):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(10): blk()
            b2b = (time.perf_counter() - t0) / 10
            dist.barrier()
            dist.all_reduce(buf)            # untimed: the barrier's exit skew is not a call's
            t0 = time.perf_counter()
            for _ in range(10): dist.all_reduce(buf)
            cc = (time.perf_counter() - t0) / 10
            dist.barrier(); blk(); dist.all_reduce(buf)
            busy = 0.0; t0 = time.perf_counter()
            for _ in range(10):
                c0 = time.perf_counter(); blk(); busy += time.perf_counter() - c0
                dist.all_reduce(buf)
            wall = (time.perf_counter() - t0) / 10
            rows.append((b2b, cc, busy / 10, wall))
        t = torch.tensor(rows, dtype=torch.float64); dist.all_reduce(t); t /= 2
        res[name] = t.tolist()
    if rank == 0:
        for name, rows in res.items():
            med = lambda i: statistics.median(r[i] for r in rows) * 1e3
            added = statistics.median((r[3] - r[0]) for r in rows) * 1e3
            slowed = statistics.median((r[2] - r[0]) for r in rows) * 1e3
            call = statistics.median((r[3] - r[2]) for r in rows) * 1e3
            print(f"{name:8s} block b2b {med(0):6.3f} ms  inline {med(2):6.3f}  call b2b {med(1):5.3f}  "
                  f"in situ as timed {call:5.3f}  compute slowed {slowed:+5.3f}  added per call {added:5.3f}")
    dist.destroy_process_group()

if __name__ == '__main__':
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        free = s.getsockname()[1]
    os.environ['OMP_NUM_THREADS'] = '1'
    mp.spawn(worker, args=(free,), nprocs=2)
