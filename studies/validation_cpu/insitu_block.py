"""Does the in-situ TP price depend on the compute between the collectives?

``parsim calibrate`` prices a TP collective in situ (``calibration.insitu``): 4 gloo ranks on
this host run [a compute block, then the collective] over and over, and the seconds the call
adds to the chain are its price. The block is two MLP-up GEMMs of the reference layer. The
executor's TP layers run whole attention or MLP blocks between their collectives, and in their
traces the 4-rank all-reduce and the shared all-gather took less than that price. This script
re-runs the probe with blocks of 0 (back to back), 1, 2, 4 and 8 GEMMs, interleaved over
``ROUNDS`` rounds so the machine's drift hits all alike, for the whole world (n = 4) and for
two groups of 2 at once (n = 2, the shared case):

    .venv/bin/python studies/validation_cpu/insitu_block.py [--rounds 4] [--out insitu_block.txt]

Prints, per (group size, op, GEMMs per block): the median in-situ seconds per call, the block's
median seconds, and how the price moves with the block. About 3 minutes on a 2-vCPU VM; run it
on a quiet machine (nothing else timing).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

WORLD = 4
BLOCKS = (0, 1, 2, 4, 8)
OPS = ("all_reduce", "all_gather")
SAMPLES = 3


def _chain(block, call, k: int, iters: int, clock, dist, torch) -> tuple[float, float]:
    """One in-situ sample as ``calibration.insitu.measure_insitu`` takes it: after a barrier and
    one untimed [block, call], ``iters`` x [k GEMMs, the call]; (wall, compute) seconds per
    iteration, each the mean over the world's ranks."""
    clock.sync()
    dist.barrier()
    for _ in range(k):
        block()
    call()
    busy, t0 = 0.0, time.perf_counter()
    for _ in range(iters):
        c0 = time.perf_counter()
        for _ in range(k):
            block()
        busy += time.perf_counter() - c0
        call()
    wall = time.perf_counter() - t0
    both = torch.tensor([wall, busy], dtype=torch.float64)
    dist.all_reduce(both)
    wall, busy = (both / dist.get_world_size() / iters).tolist()
    return wall, busy


def _rank(rank: int, port: int, rounds: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from parsim.calibration.compute import gemm_callable
    from parsim.calibration.grid import reference_layer
    from parsim.calibration.insitu import INSITU_ITERS, group_call, per_rank_bytes
    from parsim.calibration.runner import insitu_gemm, insitu_sizes
    from parsim.calibration.shapes import GemmPoint
    from parsim.calibration.timer import Clock

    torch.set_num_threads(1)
    device = torch.device("cpu")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    spec, mbs = reference_layer("cpu")
    size = insitu_sizes(spec, "fp32", (mbs,))[0]
    clock = Clock(device)
    groups = {2: [dist.new_group([0, 1]), dist.new_group([2, 3])], 4: [None]}
    gemms = {n: gemm_callable(GemmPoint(insitu_gemm(spec, n, mbs), 1, "linear", "block"), "fp32", device)
             for n in (4, 2)}
    calls = {(n, op): group_call(op, per_rank_bytes(op, size, n), groups[n][rank // n] if n < WORLD else None, n,
                                 device, dist, torch) for n in (4, 2) for op in OPS}
    for fn in [*gemms.values(), *calls.values()]:
        fn()
    out: dict = {}

    def solo(fn, repeats: int = 20) -> float:
        """rank 0 alone (the others wait in the barrier): median seconds of one GEMM."""
        dist.barrier()
        t = 0.0
        if rank == 0:
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            t = statistics.median(times)
        dist.barrier()
        return t

    def together(fn, seconds: float = 0.3) -> float:
        """every rank at once for ``seconds``: mean over ranks of the seconds per GEMM."""
        dist.barrier()
        count, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn()
            count += 1
        per = torch.tensor([(time.perf_counter() - t0) / count], dtype=torch.float64)
        dist.all_reduce(per)
        return float(per) / WORLD

    with torch.no_grad():
        for _ in range(rounds):
            for n in (4, 2):
                out.setdefault((n, "solo"), []).append(solo(gemms[n]))
                out.setdefault((n, "together"), []).append(together(gemms[n]))
                for op in OPS:
                    for k in BLOCKS:
                        for _ in range(SAMPLES):
                            out.setdefault((n, op, k), []).append(
                                _chain(gemms[n], calls[(n, op)], k, INSITU_ITERS, clock, dist, torch))
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    import torch.multiprocessing as mp

    from parsim.executor.processes import free_port

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, args.rounds, queue)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    out = queue.get(timeout=1800)
    for proc in procs:
        proc.join(timeout=60)
    lines = []
    for n in (4, 2):
        alone = statistics.median(v for v in out[(n, "solo")] if v > 0)
        shared = statistics.median(out[(n, "together")])
        lines.append(f"group of {n} ({WORLD // n} at once): a GEMM alone {alone * 1e3:.2f} ms, with every rank "
                     f"computing {shared * 1e3:.2f} ms (x{shared / alone:.2f})")
        lines.append(f"{'op':>10s} {'GEMMs':>5s} {'wall/iter':>9s} {'compute':>8s} {'in situ':>8s} "
                     f"{'vs fair share':>13s}   (ms; in situ = wall - each rank's compute, as calibrate; "
                     f"vs fair share = wall - GEMMs x the shared GEMM time)")
        for op in OPS:
            for k in BLOCKS:
                wall = statistics.median(w for w, _ in out[(n, op, k)])
                comp = statistics.median(c for _, c in out[(n, op, k)])
                lines.append(f"{op:>10s} {k:5d} {wall * 1e3:9.2f} {comp * 1e3:8.2f} {(wall - comp) * 1e3:8.2f} "
                             f"{(wall - k * shared) * 1e3:13.2f}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
