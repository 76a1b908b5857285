"""Fast-path throughput on the sweep space of this study: plans evaluated per second, one core.

Times ``parsim.fast.evaluate`` (cost tables built from ``parsim.costs`` + the numba kernel)
over every valid plan of GPT-3 175B on 1024 A100 at gbs 1536, after one warm-up call (JIT
compilation, cached on disk), and prints the median of several runs. Numba runs on one
thread (the kernel is a plain loop), so "per core" is plans over this process's CPU seconds
(``time.process_time``); wall-clock rates are printed beside them, since on a shared machine
other processes take turns on the same cores.

    .venv/bin/python studies/gpt3_175b_1024/bench_fast.py [--runs 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from parsim.fast import evaluate  # noqa: E402
from parsim.fast.tables import build_tables  # noqa: E402
from parsim.specs import load_cluster, load_model  # noqa: E402
from parsim.study.enumerate import enumerate_plans  # noqa: E402
from parsim.study.space import build_space  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args()
    model, cluster = load_model("gpt3-175b"), load_cluster("a100-80g:1024")
    plans = enumerate_plans(model, cluster, build_space(gbs=1536))
    evaluate(model, cluster, plans)                      # warm-up: JIT compile / load the cache
    cpu, wall, kernel_cpu = [], [], []
    for _ in range(args.runs):
        w0, c0 = time.perf_counter(), time.process_time()
        tables = build_tables(model, cluster, plans)
        c1 = time.process_time()
        evaluate(model, cluster, plans, tables)
        w2, c2 = time.perf_counter(), time.process_time()
        cpu.append(len(plans) / (c2 - c0))
        wall.append(len(plans) / (w2 - w0))
        kernel_cpu.append(len(plans) / (c2 - c1))
    print(f"plans: {len(plans)} (GPT-3 175B, a100-80g:1024, gbs 1536, every valid plan)")
    print(f"fast path (cost tables + kernel), per core: median {statistics.median(cpu):,.0f} plans/s "
          f"(runs: {', '.join(f'{x:,.0f}' for x in cpu)})")
    print(f"  same runs, wall clock: median {statistics.median(wall):,.0f} plans/s")
    print(f"  kernel alone (tables reused), per core: median {statistics.median(kernel_cpu):,.0f} plans/s")


if __name__ == "__main__":
    main()
