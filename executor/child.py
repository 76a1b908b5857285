"""Entry of one rank started by ``launch.run_plans``: ``python -m parsim.executor.child PAYLOAD RANK``."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from .worker import run_worker


def main(payload: str, rank: int) -> None:
    spec = torch.load(payload, weights_only=False)
    rdzv, runs = spec["rdzv"], spec["runs"]
    results = run_worker(rank, rank, rdzv, runs)
    if rank == 0:
        torch.save(results, Path(rdzv.run_dir, "result.pt"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalisation: tearing down gloo's and the store's C++ threads there can
    # std::terminate (SIGABRT) after all the work is done.
    os._exit(0)
