"""What makes a large gloo all-gather slow on this VM: its output buffer's pages, not the wire.
Four gloo ranks (the wide ZeRO-2 plan's world) all-gather a shard of 8-32 MiB into a buffer of 4x
that, three ways, under each host memory policy (``executor.host_alloc``):

* reused: one output buffer for every call, calls back to back (how ``parsim calibrate`` times
  its collectives: ``calibration.comm._collective``);
* after compute: the same buffer, each call after ~0.1-0.2 s of GEMMs on every rank (as a
  step's gathers sit between compute);
* fresh: a new output tensor for every call (as FSDP2 allocates a unit's gathered buffer each
  step).

Median of calls 2-6 of each way, rank 0's clock, after a barrier.

    .venv/bin/python studies/validation_cpu/heldout/gather_buffers.py > studies/validation_cpu/heldout/gather_buffers.txt

About 1.5 minutes; times the machine, so run it alone.
"""
from __future__ import annotations

import os
import statistics
import time
import warnings

SIZES_MIB = (8, 16, 23.4, 32)      # 23.4 MiB: the wide model's root unit on 4 ranks
WAYS = ("reused", "after compute", "fresh")
WORLD, CALLS = 4, 6


def rank_main(rank: int, port: int, nbytes: int, policy: str, queue) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PARSIM_HOST_MEMORY=policy)
    from parsim.executor.host_alloc import apply_host_memory_policy
    apply_host_memory_policy()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", FutureWarning)      # all_gather_into_tensor's rename notice
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    n = nbytes // 4
    shard, out = torch.zeros(n), torch.empty(n * WORLD)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    medians = {}
    for way in WAYS:
        seconds = []
        for _ in range(CALLS):
            if way == "after compute":
                for _ in range(40):
                    a @ b
            dist.barrier()
            target = torch.empty(n * WORLD) if way == "fresh" else out
            t0 = time.perf_counter()
            dist.all_gather_into_tensor(target, shard)
            seconds.append(time.perf_counter() - t0)
        medians[way] = statistics.median(seconds[1:])
    if rank == 0:
        queue.put(medians)
    dist.destroy_process_group()


def measure(nbytes: int, policy: str) -> dict[str, float]:
    import torch.multiprocessing as mp

    from parsim.executor.processes import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, nbytes, policy, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    medians = queue.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    return medians


def main() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    print(f"{WORLD} gloo ranks, all_gather_into_tensor, median ms of calls 2-{CALLS}")
    print(f"{'policy':7s} {'shard MiB':>9s} " + " ".join(f"{w:>14s}" for w in WAYS))
    for policy in ("system", "keep"):
        for mib in SIZES_MIB:
            m = measure(int(mib * 2**20) // 4 * 4, policy)
            print(f"{policy:7s} {mib:9.1f} " + " ".join(f"{m[w] * 1e3:14.1f}" for w in WAYS), flush=True)


if __name__ == "__main__":
    main()
