"""``python -m parsim.study.warm``: compile the fast path's numba kernels into their on-disk
cache (``fast.jit_cache``) once, when the package is installed (``make venv``), so that the
first sweep a user runs -- ``make demo``'s what-if study first of all -- does not wait for numba.

Measured on a 2-vCPU AMD EPYC (Zen 3) VM, 2026-11-30: the demo's what-if took 65 s with a cold
cache and 17 s with a warm one; numba spent 46 s compiling ``kernel.evaluate_all`` (the
split-backward timing 23 s of it, the plain timing 15 s, memory 5 s) and 5 s on
``dag._kahn_order``. The kernels are typed by their arrays' dtypes and ranks, not by a model's
size, so one small sweep compiles every signature a sweep of any size runs: the demo's model on
8 GPUs, every schedule of the default space (the graph-timed ones run ``dag``).
"""
from __future__ import annotations

import sys
import time

WARM_MODEL, WARM_CLUSTER, WARM_GBS = "llama3-8b", "h100-sxm:8", 16


def warm() -> float:
    """Run one small sweep through the fast path; returns its wall seconds."""
    from parsim.specs import load_cluster, load_model
    from parsim.study.space import build_space
    from parsim.study.sweep import run_sweep

    t0 = time.perf_counter()
    run_sweep(load_model(WARM_MODEL), load_cluster(WARM_CLUSTER), build_space(gbs=WARM_GBS))
    return time.perf_counter() - t0


def main() -> int:
    print("compiling the fast path's kernels into numba's cache (once per install; ~1 minute) ...",
          file=sys.stderr, flush=True)
    print(f"compiled in {warm():.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
