"""Do the synthetic stages run at one speed in every process? The level of every compute price
of a calibrated CPU profile is set by the stages' times (``layer_terms.composition_terms``),
and a calibration times them in its one process. Here ``--processes`` fresh processes, one after
another, each time the calibration's CPU stages in ``--rounds`` rounds (``stages.StageRounds``,
the calibration's 10 samples a stage, host memory kept as ``run.sh`` sets it, one thread).

    .venv/bin/python studies/validation_cpu/heldout/stage_processes.py [--processes 6] [--rounds 2]   # ~20 s a process

Per process: each round's sum over the stages of forward + backward medians (ms). The spread
between processes against the spread within one says whether a calibration's level is a
draw of its process as much as a reading of the machine."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CHILD = """
import os, sys, torch
torch.set_num_threads(1)
from parsim.executor.host_alloc import apply_host_memory_policy
from parsim.calibration.grid import stages
from parsim.calibration.stages import StageRounds
from parsim.calibration.timer import Clock
apply_host_memory_policy()
r = StageRounds(stages("cpu"), "fp32", Clock(torch.device("cpu")), 10)
for _ in range(int(sys.argv[1])):
    r.round()
print(" ".join(f"{x * 1e3:.1f}" for x in r.rounds))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PARSIM_HOST_MEMORY": os.environ.get("PARSIM_HOST_MEMORY", "keep")}
    print(time.strftime("%Y-%m-%d %H:%M:%S"), f"{args.processes} processes x {args.rounds} rounds of the CPU stages",
          flush=True)
    firsts, within = [], []
    for k in range(args.processes):
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.rounds)], env=env, capture_output=True, text=True,
                             check=True).stdout.split()
        rounds = [float(x) for x in out]
        firsts.append(statistics.median(rounds))
        within.append(max(rounds) / min(rounds) - 1)
        print(f"process {k + 1}: rounds " + " / ".join(f"{x:.1f}" for x in rounds) + " ms", flush=True)
    print(f"between processes (median of each's rounds): {min(firsts):.1f}-{max(firsts):.1f} ms, "
          f"{max(firsts) / min(firsts) - 1:.1%} apart; within a process: median {statistics.median(within):.1%}, "
          f"max {max(within):.1%} apart")
    print(time.strftime("%Y-%m-%d %H:%M:%S"))


if __name__ == "__main__":
    main()
