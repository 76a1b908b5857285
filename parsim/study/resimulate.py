"""Re-run plans through the SimPy engine: in worker processes (one per core by default), or
on a Dask cluster (``workers.run_tasks``)."""
from __future__ import annotations

import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from tqdm import tqdm

from parsim.specs import ClusterSpec, ModelSpec, parse_plan

from .workers import cluster_address, default_workers, may_start_processes, run_tasks


def simulate_plan(task: tuple[ModelSpec, ClusterSpec, str]) -> dict:
    """One plan through ``parsim.sim.simulate``: the metrics a sweep row carries."""
    from parsim.sim import simulate

    model, cluster, plan_text = task
    t0 = time.perf_counter()
    res = simulate(model, cluster, parse_plan(plan_text), record_events=False)
    exposed = res.exposed_comm_s
    return {
        "plan": plan_text,
        "step_time_s": float(res.step_time_s),
        "tokens_per_s": float(res.tokens_per_s),
        "mfu": float(res.mfu),
        "hfu": float(getattr(res, "hfu", float("nan"))),
        "bubble_fraction": float(res.bubble_fraction),
        "exposed_tp_s": float(exposed.get("tp", 0.0)),
        "exposed_dp_s": float(exposed.get("dp", 0.0)),
        "exposed_pp_s": float(exposed.get("pp", 0.0)),
        "peak_memory_bytes": float(res.peak_memory_bytes),
        "fits": bool(res.fits),
        "sim_wall_s": time.perf_counter() - t0,
    }


def resimulate(model: ModelSpec, cluster: ClusterSpec, plans: list[str], workers: int | None = None,
               progress: bool = False, address: str | None = None) -> list[dict]:
    """SimPy results for ``plans`` (in their order): ``workers`` processes [one per core], or
    the Dask scheduler at ``address`` (or ``$PARSIM_DASK_SCHEDULER``)."""
    tasks = [(model, cluster, p) for p in plans]
    if cluster_address(address):
        return run_tasks(simulate_plan, tasks, address=address)
    workers = workers or default_workers()
    bar = tqdm(total=len(tasks), desc="SimPy re-simulation", unit="plan", file=sys.stderr, disable=not progress,
               leave=False)
    results: list[dict] = []
    if workers <= 1 or len(tasks) <= 1 or not may_start_processes():
        for t in tasks:
            results.append(simulate_plan(t))
            bar.update(1)
    else:
        # fork: the workers inherit the imported engine and the JIT-compiled fast path
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            for res in pool.map(simulate_plan, tasks, chunksize=1):
                results.append(res)
                bar.update(1)
    bar.close()
    return results
