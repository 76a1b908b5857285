"""CPU seconds a pipeline message costs on a host the ranks share (``costs.host.message_cpu``).

A pipeline stage receives an activation, computes, and sends its output on. On a CPU host every
part of a message is CPU work: gloo's send and receive calls, its communication threads, the
loopback copies, and the receiving rank's wake-up (which polls before it sleeps). With a core per
rank that work runs while the rank would wait anyway; with more ranks than cores it is taken
from the ranks that compute, so a schedule with more (shorter) actions loses more of the host.
On this project's 2-vCPU VM, 4 ranks passing a 128 KiB activation down a line lost 1.2-1.6 ms
per hop whatever the block (0.4-6.4 ms), and the ranks' process CPU time held the difference.

One sample (every rank, the same ``messages`` blocks of compute both times):

1. ``blocks``: all ranks compute the blocks at once, no messages: each rank's process CPU
   seconds (``time.process_time``: all its threads, gloo's included);
2. ``line``: rank r receives a message from r - 1 (r > 0), computes the block, and sends it to
   r + 1 (r < world - 1; non-blocking, waited at the end), for every block: the same CPU
   seconds.

The first rank only sends and the last only receives, so per message

    send = (line - blocks) / messages on rank 0,   receive = the same on rank world - 1   [s]

(the ranks between do both: their sum is the check). The profile keeps the median over
samples (``calibration.tables.message_cpu_curves``). CPU only: on a GPU a send is a kernel on its
own stream and the host's cores are not shared.
"""
from __future__ import annotations

import time
from typing import Callable

# messages (and blocks) per sample: ~ messages x (block x ranks / cores + hop) seconds, ~0.2 s
LINE_MESSAGES = 24


def measure_message_cpu(block: Callable[[], object], nbytes: int, messages: int, repeats: int, dist, torch,
                        device) -> list[float]:
    """Per sample, this rank's process CPU seconds per message beyond its compute (the module
    docstring): a send on rank 0, a receive on the last rank, both between."""
    rank, world = dist.get_rank(), dist.get_world_size()
    payload = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32, device=device)
    inbox = torch.empty_like(payload)
    block()
    out = []
    for _ in range(repeats):
        dist.barrier()
        c0 = time.process_time()
        for _ in range(messages):
            block()
        blocks = time.process_time() - c0
        dist.barrier()
        c0 = time.process_time()
        pending = []
        for _ in range(messages):
            if rank > 0:
                dist.recv(inbox, rank - 1)
            block()
            if rank < world - 1:
                pending.append(dist.isend(payload, rank + 1))
        for work in pending:
            work.wait()
        line = time.process_time() - c0
        out.append((line - blocks) / messages)
    dist.barrier()
    return out
