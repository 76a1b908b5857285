"""probe-gqa as one stage (forward with the loss, backward) alone, then two processes running it at
once on the two cores, fp32 and bf16: how much a second rank slows each dtype.

    OMP_NUM_THREADS=1 .venv/bin/python studies/validation_cpu/probe_gqa/contention.py   # ~1 min

A timing script: run it on an idle machine. Each line is one round: the medians of 8 passes alone
and, for the pair, the slower process's."""
from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

MODEL = Path(__file__).with_name("model.yaml")


def stage_times(dtype: str, queue=None, start=None, reps: int = 8) -> tuple[float, float]:
    """(forward, backward) medians in seconds of the whole model as one stage at mbs 2, one thread,
    the executor's host-memory policy (``calibration.stages.stage_step``)."""
    os.environ.setdefault("PARSIM_HOST_MEMORY", "keep")
    import torch

    from parsim.calibration.stages import stage_step
    from parsim.executor.host_alloc import apply_host_memory_policy
    from parsim.specs import load_model

    apply_host_memory_policy()
    torch.set_num_threads(1)
    forward, backward, _ = stage_step(load_model(str(MODEL)), 2, dtype, torch.device("cpu"))
    for _ in range(2):
        forward()
        backward()
    if start is not None:
        start.wait()
    fwd, bwd = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        forward()
        t1 = time.perf_counter()
        backward()
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
    out = (statistics.median(fwd), statistics.median(bwd))
    if queue is not None:
        queue.put(out)
    return out


def main() -> None:
    ctx = mp.get_context("spawn")
    for dtype in ("fp32", "bf16", "fp32", "bf16"):
        with ctx.Pool(1) as pool:
            alone = pool.apply(stage_times, (dtype,))
        queue, start = ctx.Queue(), ctx.Barrier(2)
        procs = [ctx.Process(target=stage_times, args=(dtype, queue, start)) for _ in range(2)]
        for p in procs:
            p.start()
        pair = [queue.get(), queue.get()]
        for p in procs:
            p.join()
        f2, b2 = max(x[0] for x in pair), max(x[1] for x in pair)
        print(f"{dtype}: alone fwd {alone[0] * 1e3:6.1f} bwd {alone[1] * 1e3:6.1f} ms | two at once fwd "
              f"{f2 * 1e3:6.1f} (x{f2 / alone[0]:.2f}) bwd {b2 * 1e3:6.1f} (x{b2 / alone[1]:.2f})", flush=True)


if __name__ == "__main__":
    main()
