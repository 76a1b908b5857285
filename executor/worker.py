"""One rank's process: rendezvous, process group, watchdog, the runs, and failure reporting.

Failure protocol (every rank exits within the timeout, with a message naming the failed rank
and the cause; nothing hangs):

* arrival: each rank checks in on the store and waits for all others; after ``timeout_s`` it
  fails with "peer rank(s) ... never arrived";
* a rank that raises writes its error, waits ``DEFER_S`` when it has peers (a peer's death makes
  the others' collectives fail too: the root cause, published by the launcher, should win), then publishes
  it as the run's *abort* message (the first failure wins: an atomic counter on the store) and
  exits 1;
* every rank runs a watchdog thread that polls the abort message and, when another rank set
  it, prints it and exits at once (``os._exit``: a rank blocked in a collective cannot unwind);
* a rank that dies without a word (SIGKILL, OOM) is noticed by the launcher (or torchrun's
  agent), which publishes the abort message for it;
* every collective also carries ``timeout_s``, so a silent hang ends as an error too.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from parsim.specs import ModelSpec, Plan

from .config import ExecutorConfig
from .host_alloc import apply_host_memory_policy
from .parallel_dims import build_parallel_dims
from .processes import error_file
from .results import ExecutionResult, combine
from .timeline import chrome_trace

# Store keys, under the run's namespace (``Rendezvous.namespace``).
ABORT_KEY = "abort"
ABORT_COUNT_KEY = "abort_count"
STEP_KEY = "step/{rank}"    # the step each rank is in (for failure messages)
ARRIVED_KEY = "arrived/{rank}"   # set by each rank when it checks in
POLL_S = 0.2
# A rank whose collective fails waits this long before blaming itself: if a peer died, the
# launcher (or that peer) publishes the root cause meanwhile and the watchdog exits with it.
DEFER_S = 2.0


@dataclass(frozen=True)
class RunSpec:
    model: ModelSpec
    plan: Plan
    config: ExecutorConfig


@dataclass(frozen=True)
class Rendezvous:
    host: str
    port: int
    world_size: int
    timeout_s: float
    run_dir: str | None = None     # where ranks write their errors (``processes.error_file``; launcher mode)
    host_store: bool = False       # this rank (0) hosts the TCPStore (torchrun without agent store)
    namespace: str = "parsim"      # key prefix; under torchrun it includes the restart count


def connect_store(rdzv: Rendezvous, rank: int, host: bool = False) -> dist.Store:
    store = dist.TCPStore(rdzv.host, rdzv.port, rdzv.world_size, is_master=host,
                          timeout=timedelta(seconds=rdzv.timeout_s), wait_for_workers=False)
    return dist.PrefixStore(rdzv.namespace, store)


def publish_abort(store: dist.Store, message: str) -> None:
    """Make ``message`` the run's abort message unless another failure came first."""
    if store.add(ABORT_COUNT_KEY, 1) == 1:
        store.set(ABORT_KEY, message)


def wait_for_peers(store: dist.Store, rank: int, world_size: int, timeout_s: float) -> None:
    store.set(ARRIVED_KEY.format(rank=rank), "1")
    keys = [ARRIVED_KEY.format(rank=r) for r in range(world_size)]
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"peer rank(s) {', '.join(map(str, missing))} never arrived within {timeout_s:g} s")
        time.sleep(0.05)


def start_watchdog(rdzv: Rendezvous, rank: int) -> threading.Event:
    """Exit this process as soon as another rank publishes an abort message. Returns the
    event that stops the watchdog."""
    store = connect_store(rdzv, rank)   # its own connection: the main thread may be blocked in one
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                if store.check([ABORT_KEY]):
                    message = store.get(ABORT_KEY).decode()
                    if not message.startswith(f"rank {rank}:"):
                        print(f"parsim executor: rank {rank} stopping because {message}", file=sys.stderr, flush=True)
                        os._exit(3)
                    return
            except Exception:   # the store went away: the launcher is gone, so are we
                os._exit(4)
            stop.wait(POLL_S)

    threading.Thread(target=watch, name="parsim-watchdog", daemon=True).start()
    return stop


def pick_device(local_rank: int) -> tuple[torch.device, str]:
    """NCCL on CUDA when available (one device per rank), else gloo on CPU."""
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device, "nccl"
    return torch.device("cpu"), "gloo"


def launched_rank(rank: int, rdzv: Rendezvous, runs: list[RunSpec]) -> list[ExecutionResult]:
    """One rank started by ``launch.run_plans`` on this machine (``processes.run_ranks``'s target)."""
    return run_worker(rank, rank, rdzv, runs)


def run_worker(rank: int, local_rank: int, rdzv: Rendezvous, runs: list[RunSpec]) -> list[ExecutionResult]:
    """Everything one rank does; returns the combined results on rank 0 (empty elsewhere)."""
    torch.set_num_threads(1)
    fault = runs[0].config.inject_fault
    if fault is not None and fault.kind == "absent" and fault.rank == rank:
        while True:     # a peer that never arrives
            time.sleep(3600)
    store = connect_store(rdzv, rank, host=rdzv.host_store and rank == 0)
    stop_watchdog = start_watchdog(rdzv, rank)
    try:
        wait_for_peers(store, rank, rdzv.world_size, rdzv.timeout_s)
        device, backend = pick_device(local_rank)
        if device.type == "cpu":
            apply_host_memory_policy()      # PARSIM_HOST_MEMORY (host_alloc)
        dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank,
                                world_size=rdzv.world_size, timeout=timedelta(seconds=rdzv.timeout_s),
                                device_id=device if device.type == "cuda" else None)
        outputs, groups = [], []
        trace_dirs = [r.config.trace_dir for r in runs]
        for index, run in enumerate(runs):
            dims = build_parallel_dims(run.plan, rank, device, rdzv.timeout_s)
            groups.append(dims)   # process groups live to the end: no gloo teardown between runs
            trace_dir = run.config.trace_dir
            if trace_dir and trace_dirs.count(trace_dir) > 1:   # runs sharing a directory get one each
                trace_dir = str(Path(trace_dir) / f"run{index}")
            outputs += _one_run(run, dims, rank, backend, rdzv, store, trace_dir)
        dist.barrier()
        stop_watchdog.set()
        dist.destroy_process_group()
        return outputs
    except BaseException as err:   # noqa: BLE001 -- every failure must be reported, then exit
        cause = f"{type(err).__name__}: {err}"
        message = f"rank {rank}: {cause}"
        if rdzv.run_dir:
            error_file(rdzv.run_dir, rank).write_text(cause)
        traceback.print_exc(file=sys.stderr)
        try:
            if rdzv.world_size > 1:   # no peer, no other root cause to wait for
                time.sleep(DEFER_S)   # the watchdog exits meanwhile if a root cause is published
            publish_abort(store, message)
        finally:
            print(f"parsim executor: {message}", file=sys.stderr, flush=True)
            os._exit(1)


def _one_run(run: RunSpec, dims, rank: int, backend: str, rdzv: Rendezvous, store,
             trace_dir: str | None) -> list[ExecutionResult]:
    from .trainer import train_rank   # imported here: the module pulls in the whole executor

    rank_result = train_rank(run.model, run.plan, run.config, dims,
                             progress=lambda step: store.set(STEP_KEY.format(rank=rank), str(step)))
    gathered = [None] * rdzv.world_size if rank == 0 else None
    dist.gather_object(rank_result, gathered, dst=0)
    if rank != 0:
        return []
    result = combine(gathered, model=run.model.name, plan_text=run.plan.to_string(), backend=backend,
                     device=str(dims.device), warmup=run.config.warmup)
    if trace_dir:
        result.trace_files = write_traces(result, trace_dir)
    return [result]


def write_traces(result: ExecutionResult, trace_dir: str) -> list[str]:
    import json

    from parsim.specs.files import write_text
    out = Path(trace_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for rank in range(result.world_size):
        events = [e for e in result.trace.events if e.rank == rank]
        path = write_text(out / f"rank{rank}.json", json.dumps(chrome_trace(events, dict(result.trace.meta))),
                          "trace_dir")
        files.append(str(path))
    return files
