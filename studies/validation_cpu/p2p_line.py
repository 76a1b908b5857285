"""What a pipeline message costs when 4 gloo ranks share 2 cores (issues 20 and 21).

A forward-only pipeline on 4 ranks: rank r receives an activation from r - 1, computes a
block (GEMMs of 64 x 512 x 512), and sends it on to r + 1, for M = 40 blocks; against the same
blocks computed by all ranks at once without messages (the host's contention g(4), as
``parsim calibrate`` measures it). Were the messages free, the last block would leave rank 3
after M + 3 block times at g(4); per hop the pipeline loses

    (pipeline - (M + 3) x block x g(4)) / (M + 3)        [s]

and the ranks' process CPU seconds (``time.process_time``: every thread, gloo's included) beyond
their blocks' show where it went. Three block lengths at 128 KiB: a cost per message that does
not depend on the block is a cost per message (``costs.host.message_cpu``, calibrated by
``calibration.p2p_cpu`` at one size, the activation of its reference layer); then four message
sizes at the middle block, to show where the message's bytes start to count.

    .venv/bin/python studies/validation_cpu/p2p_line.py > studies/validation_cpu/p2p_line.txt

About 40 s. A timing study: run it on a quiet machine."""
from __future__ import annotations

import datetime
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parsim.calibration.p2p_cpu import run_line

M, REPEATS, WORLD = 40, 5, 4


def _rank(rank: int, port: int, gemms: int, elements: int, q) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    a, w = torch.randn(64, 512), torch.randn(512, 512)

    def block() -> None:
        for _ in range(gemms):
            a @ w
    for _ in range(20):
        block()
    buf, inbox = torch.zeros(elements), torch.zeros(elements)
    out = {"solo": [], "together": [], "line": [], "line_cpu": [], "blocks_cpu": []}
    for _ in range(REPEATS):
        dist.barrier()
        if rank == 0:                       # one rank alone: the block's solo time
            t0 = time.perf_counter()
            for _ in range(M):
                block()
            out["solo"].append((time.perf_counter() - t0) / M)
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(M):
            block()
        out["together"].append(time.perf_counter() - t0)
        out["blocks_cpu"].append(time.process_time() - c0)
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        run_line(block, M, buf, inbox, dist)
        out["line"].append(time.perf_counter() - t0)
        out["line_cpu"].append(time.process_time() - c0)
    q.put((rank, out))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ctx = mp.get_context("spawn")
    print(f"{WORLD} ranks on this host, M = {M} blocks, medians of {REPEATS} samples; CPU ms per message beyond the "
          "blocks: rank 0 sends, rank 3 receives, ranks 1-2 both")
    print("message KiB  block ms  g(4)  pipeline ms  free-message bound ms  lost per hop ms   "
          "CPU ms/message r0 r1 r2 r3")
    cases = [(gemms, 32768) for gemms in (2, 8, 32)] + [(8, n) for n in (8192, 262144, 1048576)]
    for k, (gemms, elements) in enumerate(cases):
        q = ctx.SimpleQueue()
        mp.start_processes(_rank, args=(29950 + k, gemms, elements, q), nprocs=WORLD, start_method="spawn")
        res = dict(q.get() for _ in range(WORLD))
        solo = statistics.median(res[0]["solo"])
        together = statistics.median(max(res[r]["together"][i] for r in range(WORLD)) for i in range(REPEATS))
        g4 = together / (M * solo)
        line = statistics.median(res[WORLD - 1]["line"])
        bound = (M + 3) * solo * g4
        cpu = [statistics.median((lc - bc) / M for lc, bc in zip(res[r]["line_cpu"], res[r]["blocks_cpu"]))
               for r in range(WORLD)]
        lost = (line - bound) / (M + 3)
        print(f"{elements * 4 // 1024:11d}  {solo * 1e3:8.2f}  {g4:4.2f}  {line * 1e3:11.1f}  {bound * 1e3:21.1f}  "
              f"{lost * 1e3:15.2f}   {'  '.join(f'{c * 1e3:.2f}' for c in cpu)}", flush=True)


if __name__ == "__main__":
    main()
