"""What a pipeline message costs on gloo when the host's cores are busy (issue 20).

Ranks 0 and 1 pass a 128 KiB activation back and forth; each hop, the receiver computes a
~3.5 ms block (4 GEMMs of 256 x 512 x 512) before it sends on, as a pipeline stage does. With 4
ranks, ranks 2 and 3 either wait in a barrier (the host has a free core for every woken rank) or
multiply matrices the whole time (4 ranks on 2 cores, as a pp=4 plan on this VM). Rank 0's round
trip is rank 1's block plus two message latencies, so per message

    latency = median over hops of (round trip - rank 1's block in it) / 2      [s; 200 hops]

    .venv/bin/python studies/validation_cpu/p2p_oversubscribed.py > studies/validation_cpu/p2p_oversubscribed.txt

About 30 s. A timing study: run it on a quiet machine."""
from __future__ import annotations

import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HOPS = 200
MESSAGE_ELEMENTS = 32768          # 128 KiB of fp32
BUSY_S = 60.0                     # the busy ranks stop earlier, when rank 0 is done


def _rank(rank: int, world: int, port: int, busy: bool, done: str, q) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    a, w = torch.randn(256, 512), torch.randn(512, 512)

    def block() -> float:
        t0 = time.perf_counter()
        for _ in range(4):
            a @ w
        return time.perf_counter() - t0

    buf = torch.zeros(MESSAGE_ELEMENTS)
    dist.barrier()
    if rank >= 2:
        t_end = time.time() + BUSY_S
        while busy and time.time() < t_end and not os.path.exists(done):
            for _ in range(20):
                a @ w
    else:
        trips, blocks = [], []
        for _ in range(HOPS):
            if rank == 0:
                block()
                t0 = time.perf_counter()
                dist.send(buf, 1)
                dist.recv(buf, 1)
                trips.append(time.perf_counter() - t0)
            else:
                dist.recv(buf, 0)
                blocks.append(block())
                dist.send(buf, 0)
        q.put(("trip", trips) if rank == 0 else ("block", blocks))
        if rank == 0:
            open(done, "w").close()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ctx = mp.get_context("spawn")
    print("ranks  other ranks  round trip ms  rank 1 block ms  per message ms")
    for world, busy in ((2, False), (4, False), (4, True)):
        with tempfile.TemporaryDirectory() as tmp:
            q = ctx.SimpleQueue()
            port = 29600 + 10 * world + busy
            mp.start_processes(_rank, args=(world, port, busy, os.path.join(tmp, "done"), q), nprocs=world,
                               start_method="spawn")
            got = dict(q.get() for _ in range(2))
        trip, blk = statistics.median(got["trip"]), statistics.median(got["block"])
        per = statistics.median((t - b) / 2 for t, b in zip(got["trip"], got["block"]))
        print(f"{world:5d}  {'busy' if busy else ('idle' if world > 2 else '-'):>11}  {trip * 1e3:13.2f}"
              f"  {blk * 1e3:15.2f}  {per * 1e3:14.2f}")


if __name__ == "__main__":
    main()
