"""Does a collective after compute cost less in a process that holds the executor's idle groups?

    .venv/bin/python studies/validation_cpu/executor_groups.py [--reps 3] [--samples 60] \\
        | tee studies/validation_cpu/executor_groups.txt               # about 1 minute

An executor rank holds seven gloo process groups (the default one and, from
``executor.parallel_dims.build_parallel_dims``, its pipeline, data, tensor, world and two p2p
groups); each runs a TCP loop thread that wakes ~110 times a second while idle (``/proc/<pid>/
task/*/status`` of a cpu-small tp=2 rank: seven ``gloo_tcp_loop`` threads at 107-110 voluntary
switches a second, 2026-11-29). Before profile format 13 the calibration's collectives ran in
ranks holding only the default group. Here the calibration's in-situ TP probe
(``calibration.insitu.measure_insitu``: cpu-small's tp=2 buffer after two of its MLP-up GEMMs)
runs on 2 gloo ranks with and without the executor's groups held (``calibration.insitu.
executor_groups``), alternating fresh rank pairs so a slow minute hits both; the median ms per
call of each TP collective, per repetition. It measures the host; the calibration holds the
groups since format 13.
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = (128, 1024, 512)            # cpu-small's MLP-up at tp=2, mbs 1: tokens, ffn / 2, hidden
BYTES = 128 * 512 * 4               # its TP buffer b*s*h in fp32
SETTINGS = ("default group only", "executor's groups held")


def probe_rank(rank: int, port: int, held: bool, samples: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from parsim.calibration.insitu import executor_groups
    from parsim.calibration.insitu import group_call, measure_insitu
    from parsim.calibration.timer import Clock
    from parsim.executor.host_alloc import apply_host_memory_policy

    torch.set_num_threads(1)
    apply_host_memory_policy()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    dev = torch.device("cpu")
    if held:                  # kept in torch's group registry until destroy_process_group
        executor_groups(2, rank, dev, 120.0)
    x, w = torch.randn(BLOCK[0], BLOCK[2]), torch.randn(BLOCK[1], BLOCK[2])
    try:
        with torch.no_grad():
            res = measure_insitu(lambda: torch.nn.functional.linear(x, w),
                                 lambda op, nb: group_call(op, nb, None, 2, dev, dist, torch), (BYTES,),
                                 samples, Clock(dev), dist, torch, dev)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        queue.put({op: 1e3 * statistics.median(next(iter(v.values()))) for op, v in res.items()})


def one_pair(held: bool, samples: int) -> dict[str, float]:
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=probe_rank, args=(r, port, held, samples, queue)) for r in range(2)]
    for p in procs:
        p.start()
    out = queue.get(timeout=600)
    for p in procs:
        p.join()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="alternations of the two settings [3]")
    ap.add_argument("--samples", type=int, default=60, help="probe samples per point [60]")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("PARSIM_HOST_MEMORY", "keep")
    sys.path.insert(0, str(ROOT))
    got: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.reps):
        for held, setting in zip((False, True), SETTINGS):
            for op, ms in one_pair(held, args.samples).items():
                got.setdefault((op, setting), []).append(ms)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"in-situ probe, 2 gloo ranks, {os.cpu_count()} cores, {now}: median ms per call, per repetition")
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        base = statistics.fmean(got[(op, SETTINGS[0])])
        for setting in SETTINGS:
            v = got[(op, setting)]
            print(f"  {op:15s} {setting:24s} " + " ".join(f"{x:5.2f}" for x in v)
                  + f"   mean {statistics.fmean(v):5.2f}  ({statistics.fmean(v) / base - 1:+.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
