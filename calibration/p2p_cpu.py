"""CPU seconds a pipeline message costs on a host the ranks share (``costs.host.message_cpu``).

A pipeline stage receives an activation, computes, and sends its output on. On a CPU host every
part of a message is CPU work: gloo's send and receive calls, its communication threads, the
loopback copies, and the receiving rank's wake-up. With a core per
rank that work runs while the rank would wait anyway; with more ranks than cores it is taken
from the ranks that compute, so a schedule with more (shorter) actions loses more of the host.
On this project's 2-vCPU VM, 4 ranks passing a 128 KiB activation down a line lost 0.9-1.7 ms
per hop over four runs whatever the block (0.4-6.4 ms), and the ranks' process CPU time held
the difference; flat from 32 to 128 KiB, x1.5 at 1 MiB, x3 at 4 MiB
(``studies/validation_cpu/p2p_line.txt``).

One sample (every rank, the same ``messages`` blocks of compute both times):

1. ``blocks``: all ranks compute the blocks at once, no messages: each rank's process CPU
   seconds (``time.process_time``: all its threads, gloo's included);
2. ``line``: rank r receives a message from r - 1 (r > 0), computes the block, and sends it to
   r + 1 (r < world - 1; non-blocking, waited at the end), for every block: the same CPU
   seconds.

A line of ``world`` ranks carries world - 1 messages a block, so one message costs the ranks'
summed extra CPU

    c(x) = sum over ranks of (line - blocks) / messages, over world - 1      [s]

at two message sizes x (the caller's activation and ``LARGE_FACTOR`` x it), fitted as c(x) =
c0 + k x (Hockney's alpha-beta form, as the collectives): c0 split into sending and receiving by
the end ranks' shares at the first size (the first rank only sends, the last only receives), k
(seconds per byte: the loopback copies) half each, the sender copying into the socket and the
receiver out of it (``calibration.tables.message_cpu_curves``, the median over samples per rank).
CPU only: on a GPU a send is a kernel on its own stream and the host's cores are not shared.

The same pass also times, on one clock for every process (``time.monotonic``: CLOCK_MONOTONIC on
Linux), when each send was called and when each receive was called and returned. A receive
returns some time after ``max(its call, the matching send's call)``: the transfer, and -- with more
ranks than cores -- the wait of gloo's thread and then of the woken rank for a core, which costs
no CPU, only time (``calibration.tables.message_hold_curve`` keeps it as ``p2p_hold``). And
how long each ``isend`` call held its rank, with the calling thread's CPU in it: gloo writes the
message in the calling thread when it can and waits on the pair's lock while its I/O thread
holds it (``calibration.tables.send_hold_curve`` keeps the hold as ``p2p_send_hold``).
"""
from __future__ import annotations

import time
from typing import Callable

# messages (and blocks) per sample: ~ messages x (block x ranks / cores + hop) seconds, ~0.2 s
LINE_MESSAGES = 24
# the second message size, in multiples of the first: the copies' bytes show from ~1 MiB on
# (studies/validation_cpu/p2p_line.txt: flat from 32 to 128 KiB, x2.7 at 4 MiB)
LARGE_FACTOR = 16


def run_line(block: Callable[[], object], messages: int, payload, inbox, dist) -> tuple[list[float], ...]:
    """One pass of the line: ``messages`` times, receive from the previous rank (not on the
    first), compute ``block``, send ``payload`` on to the next (not on the last; non-blocking,
    all waited at the end). Returns this rank's (send calls, receive calls, receive returns,
    send returns) on ``time.monotonic``, and each send call's CPU seconds on the calling thread
    (``time.thread_time``; empty where it sends or receives nothing)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pending, sends, calls, returns, sent, send_cpu = [], [], [], [], [], []
    for _ in range(messages):
        if rank > 0:
            calls.append(time.monotonic())
            dist.recv(inbox, rank - 1)
            returns.append(time.monotonic())
        block()
        if rank < world - 1:
            cpu = time.thread_time()
            sends.append(time.monotonic())
            pending.append(dist.isend(payload, rank + 1))
            sent.append(time.monotonic())
            send_cpu.append(time.thread_time() - cpu)
    for work in pending:
        work.wait()
    return sends, calls, returns, sent, send_cpu


def measure_message_cpu(block: Callable[[], object], nbytes: int, messages: int, repeats: int, dist, torch,
                        device) -> tuple[dict[int, list[float]], dict[int, list[tuple[list[float], ...]]]]:
    """Per message size (``nbytes`` and ``LARGE_FACTOR`` x it), per sample, this rank's process
    CPU seconds per message beyond its compute (the module docstring): a send on rank 0, a
    receive on the last rank, both between; and, per size and sample, ``run_line``'s stamps."""
    block()
    out: dict[int, list[float]] = {}
    stamps: dict[int, list[tuple[list[float], ...]]] = {}
    for size in (nbytes, LARGE_FACTOR * nbytes):
        payload = torch.zeros(max(size // 4, 1), dtype=torch.float32, device=device)
        inbox = torch.empty_like(payload)
        out[size], stamps[size] = [], []
        for _ in range(repeats):
            dist.barrier()
            c0 = time.process_time()
            for _ in range(messages):
                block()
            blocks = time.process_time() - c0
            dist.barrier()
            c0 = time.process_time()
            stamps[size].append(run_line(block, messages, payload, inbox, dist))
            out[size].append((time.process_time() - c0 - blocks) / messages)
    dist.barrier()
    return out, stamps
