"""How far one calibration's real-layer contention (``contention_layer``: the slowdown of one
rank's layer step while N ranks step it at once) can stray, and how much taking its rounds in
blocks spread over the collectives job narrows that.

    .venv/bin/python studies/validation_cpu/heldout/contention_rounds.py [--minutes 4] [--ranks 2]

N gloo ranks (the executor's launcher, one thread each) take blocks of ``CONTENTION_ROUNDS``
alternating rounds of the calibration's reference layer (``calibration.comm._alternating_rounds``,
the same call a collectives job makes) back to back for ``--minutes``; between blocks they run
all-reduces for about as long as a block, as a collectives job runs collectives between them.
Each block's ratio is what one calibration reads (``calibration.tables.contention_curve``: the
median of its rounds' ratios). It prints every block's median, then the spread of three
estimates over the run: one block (the calibration before), the median of the rounds of three
blocks next to each other, and of three blocks a third of the run apart (``CONTENTION_BLOCKS``)."""
from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta


def _rank(rank: int, port: int, world: int, seconds: float) -> list[list[list]]:
    import torch
    import torch.distributed as dist

    from parsim.calibration.comm import CONTENTION_ROUNDS, _alternating_rounds
    from parsim.calibration.grid import reference_layer
    from parsim.calibration.timer import Clock
    from parsim.executor.host_alloc import apply_host_memory_policy
    from parsim.executor.layer_probe import layer_step

    torch.set_num_threads(1)
    apply_host_memory_policy()
    device = torch.device("cpu")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        spec, mbs = reference_layer("cpu")
        forward, backward, _ = layer_step(spec, mbs, "fp32", device)
        clock = Clock(device)
        x = torch.zeros(2**20, dtype=torch.float32)
        blocks, t_end = [], time.perf_counter() + seconds
        while True:
            t0 = time.perf_counter()
            blocks.append(_alternating_rounds(lambda: (forward(), backward()), 2.0, clock, dist, torch, device,
                                              rounds=CONTENTION_ROUNDS))
            busy = time.perf_counter() - t0
            done = torch.tensor([float(time.perf_counter() > t_end)])
            dist.all_reduce(done)          # every rank stops after the same block
            if done.item() > 0:
                return blocks
            t1 = time.perf_counter()
            dist.all_reduce(x)
            calls = torch.tensor([busy / max(time.perf_counter() - t1, 1e-6)])
            dist.broadcast(calls, 0)       # as many on every rank: collectives in between, as a job runs them
            for _ in range(int(calls.item())):
                dist.all_reduce(x)
    finally:
        dist.destroy_process_group()


def _spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=10)
    return (f"median {statistics.median(values):.3f}, p10-p90 {q[0]:.3f}-{q[-1]:.3f}, "
            f"sd {statistics.pstdev(values):.3f} ({len(values)} estimates)")


def main() -> None:
    from parsim.calibration.tables import round_ratios
    from parsim.executor.processes import free_port, run_ranks

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    t0 = time.perf_counter()
    ranks = run_ranks(_rank, (free_port(), args.ranks, args.minutes * 60), args.ranks, start="exec")
    per_block = [round_ratios([{"r": r[i]} for r in ranks], "r") for i in range(len(ranks[0]))]
    print(f"{args.ranks} ranks, {len(per_block)} blocks of {len(per_block[0])} rounds in "
          f"{time.perf_counter() - t0:.0f} s")
    print("block medians: " + ", ".join(f"{statistics.median(b):.3f}" for b in per_block))
    n, gap = len(per_block), max(1, len(per_block) // 3)
    one = [statistics.median(b) for b in per_block]
    adjacent = [statistics.median(per_block[i] + per_block[i + 1] + per_block[i + 2]) for i in range(n - 2)]
    spread = [statistics.median(per_block[i] + per_block[i + gap] + per_block[i + 2 * gap])
              for i in range(n - 2 * gap)]
    print(f"one block:                 {_spread(one)}")
    print(f"three adjacent blocks:     {_spread(adjacent)}")
    print(f"three blocks {gap} apart:      {_spread(spread)}")
    every = [x for b in per_block for x in b]
    print(f"all rounds: {_spread(every)}")


if __name__ == "__main__":
    main()
