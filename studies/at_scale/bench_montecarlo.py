"""Benchmark of issue 22's "Done when": a 100-step Monte-Carlo of GPT-3 175B on 1,024 A100
(dp=8 tp=8 pp=16, 1F1B, gbs 1536) on the local process pool (target <= 60 s), and on a Dask
LocalCluster of 1 and then 2 worker processes, side by side (target >= 1.8x).

    .venv/bin/python studies/at_scale/bench_montecarlo.py [--steps 100] [--sigma 0.03]

A timing benchmark: run it on an idle machine with at least 2 free cores. Prints one line per
configuration and writes bench_montecarlo.json here.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL, CLUSTER, PLAN = "gpt3-175b", "a100-80g:1024", "dp=8 tp=8 pp=16 gbs=1536 schedule=1f1b"


def timed(**where) -> tuple[float, list[float]]:
    from parsim.api.run import monte_carlo
    t0 = time.perf_counter()
    res = monte_carlo(MODEL, CLUSTER, PLAN, **where)
    return time.perf_counter() - t0, res.step_times.tolist()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--sigma", type=float, default=0.03)
    ap.add_argument("--out", default=str(HERE / "bench_montecarlo.json"))
    args = ap.parse_args()
    from distributed import LocalCluster
    common = dict(steps=args.steps, variability=f"lognormal:{args.sigma}", seed=0)
    result = {"model": MODEL, "cluster": CLUSTER, "plan": PLAN, **common}
    local_s, reference = timed(**common)
    result["local_pool_s"] = local_s
    print(f"local process pool (one worker per core): {local_s:.1f} s for {args.steps} steps")
    for workers in (1, 2):
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as c:
            seconds, times = timed(address=c.scheduler_address, **common)
        assert times == reference, "a Dask run gave other step times than the local one"
        result[f"dask_{workers}_workers_s"] = seconds
        print(f"Dask LocalCluster, {workers} worker(s): {seconds:.1f} s")
    result["dask_speedup_2_over_1"] = result["dask_1_workers_s"] / result["dask_2_workers_s"]
    print(f"speed-up 2 workers over 1: {result['dask_speedup_2_over_1']:.2f}x")
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
