"""In-situ cost of a synchronous collective: the seconds one adds to a chain of compute.

Megatron-LM tensor parallelism calls its collectives synchronously between the GEMMs of a
layer (Shoeybi et al. 2019, Fig. 3): every rank computes a few milliseconds, then blocks in
an all-reduce until its peers have arrived and the sum is done. ``comm._time_sizes`` times
the same call back to back (the OSU micro-benchmarks / nccl-tests method), which keeps the
communication threads busy and the ranks in lock-step. After compute the same call costs
more on gloo/CPU: the ranks' communication threads and the idle waiting rank have to be
woken again (a second mode of 2-5 ms latencies appears far more often), and the ranks
arrive skewed by their compute's jitter, so the earlier one waits. What a TP layer pays is
the sum of both, and that is what is measured here. (The wake-up part is the host's: on a KVM
guest a thread per rank that only wakes every millisecond cuts this probe's calls by 17-31 % and
the executor's tp=2 steps by 8-10 %, ``studies/validation_cpu/wakeup.txt``.)

One sample (every rank, after a barrier and one untimed [block, collective] that lines the
ranks up as a layer chain does, so the barrier's own exit skew is left out): ``iters`` times
[the compute block, then one collective]. Its value is

    mean over ranks of (wall time - compute time) / iters   [s]

the seconds one collective adds to a synchronous chain of compute, the wait for the slowest
peer included: the mean over ranks of the time spent inside the call, as the executor's
trace shows it. With more ranks than cores this grows with the block (4 ranks over 2 cores:
4-rank all-reduce 5.6 -> 10.2 ms over blocks of 0-8 GEMMs; ``studies/validation_cpu/
insitu_block.py`` -> ``insitu_block.txt``): over a block of a few milliseconds the scheduler runs
some ranks near solo speed and the others late, and the early ones wait in the call, a wait the
simulator also charges as GEMM contention. Read instead beyond the block at the host's fair
share (profile format 4, 2026-11-28, withdrawn) it under-priced the 4-rank TP plans about as
much as this reading over-prices them, and by more on SP with a pipeline (mean |error| 17.8 %
against 14.6 % over 9 plans; ``studies/validation_cpu/heldout/README.md``, fifth run). The
compute block is
the model's MLP-up GEMM at the smallest TP degree (``CommJob.contention_gemm``) called
``INSITU_GEMMS`` times: the up and down GEMMs of one MLP have equal FLOPs, so two calls are
the compute between the forward all-reduces of a Megatron layer's attention and MLP blocks.
Sizes are the TP activation buffers b*s*h (``runner``), ops the three TP collectives.
CPU only: on a GPU the collective is stream-ordered after the GEMM, with no thread hand-off.

A job of ``world`` ranks also measures every smaller TP group size n dividing ``world``: the
ranks split into world/n groups of n consecutive ranks (TP is the fastest-varying coordinate
of the rank layout), all computing and calling their group's collective at once, as the TP
groups of a dp x tp or tp x pp plan do; with more ranks than cores this costs more than n
ranks alone (``measure_subgroups``), and the more so the longer the compute before each call:
the scheduler time-slices it, and a peer arrives late. The group's block is then timed alone
(``solo_block_seconds``): the simulator prices a call after less compute with a share of the
premium (``CollectiveFit.shared_alpha``; ``studies/validation_cpu/tp_gap.py``).
"""
from __future__ import annotations

import time
from typing import Callable

# GEMM calls per compute block: one MLP block's up + down GEMMs (see the module docstring)
INSITU_GEMMS = 2
# collectives per sample (a sample lasts about INSITU_ITERS x (block + collective), ~0.1 s)
INSITU_ITERS = 8
# samples per (op, size) at least, whatever the calibration's repeats: the in-situ latency has a
# second mode of 2-5 ms (above), so a median of the quick calibration's 3 samples swung with it:
# the 2-rank all-gather read 0.46 ms in a quick profile against 0.91-1.16 ms in three full ones
# (10 samples) on the same VM within 2 hours (2026-11-28), and the demo's tp=2 SP plan read
# 18 % fast with it. A median of 10 still varies 15 % (1 sigma) from one probe to the next on an
# idle VM, independently (lag-1 autocorrelation -0.10 over 35 probes in 6 minutes, means of three
# 9.5 %: studies/validation_cpu/insitu_drift.txt), and a 2-rank TP plan makes ~200 calls a step
# (10 % of the deep held-out model's step per 0.5 ms). At 30 samples the medians of 16 probes in
# 6 minutes still spread 9-10 % (1 sigma), as much as a bootstrap of one probe's samples does, so
# the spread is the samples' own and shrinks with more: 3-7 % at 90 (7 probes; 2026-11-29, AMD
# EPYC VM). The demo's tp=2 SP plan spends ~35 % of its step in these calls; 60 samples (~7 %,
# some 4 s more on a 2-rank job) keep the probe's share of its error near 2-3 %.
INSITU_MIN_SAMPLES = 60
# the TP collectives, by the keys parsim.costs.timing reads (tensor forms, comm.CALLS)
INSITU_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def executor_groups(world: int, rank: int, device, timeout_s: float):
    """The process groups an executor rank holds (``executor.parallel_dims.build_parallel_dims``
    for tp = ``world``: its pipeline, data, tensor, world and two p2p groups beside the default
    one), created by the executor's own code and kept, idle, while the job measures. On gloo each
    group runs a TCP loop thread that wakes ~110 times a second even when idle (``/proc`` of an
    executor rank, cpu-small tp=2: seven such threads, 2026-11-29); on a KVM guest those wake-ups
    keep the vCPUs out of deep idle, and a collective called after compute then pays less to wake
    its peer: with the six extra groups, the in-situ probe read all-reduce 9-23 %, reduce-scatter
    10-15 % and all-gather 5-10 % lower (three A/B runs on the AMD EPYC VM, the last
    ``studies/validation_cpu/executor_groups.txt``). Measured without them, the probe priced the
    executor's SP calls 20-40 % high (``insitu_in_executor.txt``) and the demo's tp=2 SP plan
    +2.6..+14 % (six demos). CPU only: NCCL's collectives are stream-ordered, no wake-up."""
    from parsim.executor.parallel_dims import build_parallel_dims
    from parsim.specs import parse_plan
    return build_parallel_dims(parse_plan(f"tp={world}"), rank, device, timeout_s)


def per_rank_bytes(op: str, full_bytes: int, world: int) -> int:
    """The tensor passed to the call for a TP buffer of ``full_bytes`` (comm.CALLS convention:
    the shard for all-gather, the full buffer for all-reduce and reduce-scatter)."""
    return full_bytes // world if op == "all_gather" else full_bytes


def group_call(op: str, nbytes: int, group, n: int, device, dist, torch) -> Callable[[], object]:
    """The collective ``op`` of ``nbytes`` per rank (``comm.CALLS`` forms) over ``group`` of ``n``."""
    from parsim.executor.tp_communications import tensor_forms
    gather, scatter = tensor_forms(dist)
    x = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)    # zeros: sums stay finite
    if op == "all_reduce":
        return lambda: dist.all_reduce(x, group=group)
    if op == "all_gather":
        out = torch.empty(x.numel() * n, dtype=torch.float32, device=device)
        return lambda: gather(out, x, group=group)
    if op == "reduce_scatter":
        out = torch.empty(x.numel() // n, dtype=torch.float32, device=device)
        return lambda: scatter(out, x, group=group)
    raise ValueError(f"not a TP collective: {op!r}")


def measure_subgroups(block_for: Callable[[int], Callable[[], object] | None], sizes: tuple[int, ...],
                      samples: int, clock, dist, torch, device) -> dict[int, dict[str, dict[int, list[float]]]]:
    """``measure_insitu`` for every group size 2 <= n < world dividing world, all world/n
    groups at once: {n: {op: {per-rank bytes: [seconds]}}}. ``block_for(n)`` is the compute
    block of a TP group of n (None: the model does not split n ways, skipped)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    out = {}
    for n in range(2, world):
        block = block_for(n) if world % n == 0 else None
        if block is None:
            continue
        groups = [dist.new_group(list(range(g, g + n))) for g in range(0, world, n)]   # every rank creates all
        mine = groups[rank // n]
        out[n] = measure_insitu(block, lambda op, x: group_call(op, x, mine, n, device, dist, torch), sizes,
                                samples, clock, dist, torch, device, n=n)
    return out


def solo_block_seconds(gemm: Callable[[], object], clock, dist, torch, device, reps: int = 7,
                       gemms: int = INSITU_GEMMS) -> float:
    """Seconds of one compute block (``gemms`` calls of ``gemm``) on rank 0 alone, the other
    ranks waiting in a barrier: the median of ``reps``, the same on every rank. The shared
    probe's latency is priced against it (``CollectiveFit.insitu_block_s``): a call after
    less compute waits less for peers the host's scheduler time-sliced."""
    times = torch.zeros(reps, dtype=torch.float64, device=device)
    dist.barrier()
    if dist.get_rank() == 0:
        gemm()
        for i in range(reps):
            t0 = time.perf_counter()
            for _ in range(gemms):
                gemm()
            clock.sync()
            times[i] = time.perf_counter() - t0
    dist.all_reduce(times)          # rank 0's times; the others add zeros
    return float(times.median())


def measure_insitu(gemm: Callable[[], object], collective: Callable[[str, int], Callable[[], object]],
                   sizes: tuple[int, ...], samples: int, clock, dist, torch, device,
                   ops: tuple[str, ...] = INSITU_OPS, iters: int = INSITU_ITERS,
                   gemms: int = INSITU_GEMMS, n: int | None = None) -> dict[str, dict[int, list[float]]]:
    """{op: {per-rank bytes: [seconds per collective in situ, one per sample]}}, the same on
    every rank. ``collective(op, nbytes)`` returns the call (``comm._collective``); ``sizes``
    are full TP buffers in bytes; ``n`` the group size (default: the world). Samples of all
    (op, size) points are taken round-robin so a slow phase of the machine hits them alike;
    wall and compute are reduced over the whole world (every group does the same)."""
    world = dist.get_world_size()
    points = [(op, per_rank_bytes(op, s, n or world)) for op in ops for s in sizes]
    calls = [collective(op, x) for op, x in points]
    gemm()
    for fn in calls:        # warm-up: connections and buffers of every point
        fn()
    walls: list[float] = []
    computes: list[float] = []
    def block() -> float:
        c0 = time.perf_counter()
        for _ in range(gemms):
            gemm()
        clock.sync()
        return time.perf_counter() - c0

    for _ in range(samples):
        for fn in calls:
            clock.sync()
            dist.barrier()
            block()              # one untimed [block, collective]: the barrier's exit skew is not
            fn()                 # a TP layer's; from here on the ranks run as a layer chain does
            busy, t0 = 0.0, time.perf_counter()
            for _ in range(iters):
                busy += block()
                fn()
            clock.sync()
            walls.append(time.perf_counter() - t0)
            computes.append(busy)
    wall = torch.tensor(walls, dtype=torch.float64, device=device)
    comp = torch.tensor(computes, dtype=torch.float64, device=device)
    dist.all_reduce(wall)                                   # sums over ranks -> means below
    dist.all_reduce(comp)
    per_call = ((wall - comp) / world / iters).clamp(min=0.0).tolist()
    out: dict[str, dict[int, list[float]]] = {}
    for i, v in enumerate(per_call):
        op, x = points[i % len(points)]
        out.setdefault(op, {}).setdefault(x, []).append(v)
    return out
