"""Start the ranks of a plan and collect what they measured.

* ``run_plan`` / ``run_plans`` (Python API, and ``parsim execute`` on one machine): start
  dp*tp*pp fresh interpreters (``python -m parsim.executor.child``: unlike multiprocessing's
  spawn they never re-import the caller's ``__main__``), host the rendezvous store here,
  watch the children, and on the first failure publish it as the abort message,
  give the others a moment to exit on their own, then kill what is left. Several runs with
  the same world size share one set of processes (start-up dominates small runs).
* ``python -m parsim.executor.launch ...`` under ``torchrun`` (many nodes): every process is
  one rank; rank 0 prints the result. Example:
  ``torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400
  -m parsim.executor.launch --model gpt3-1.3b --plan "dp=2 tp=8" --steps 10``
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from parsim.calibration.host_alloc import host_memory_policy
from parsim.specs import ModelSpec, Plan, SpecError, load_cluster, load_model, parse_plan, validate

from .config import ExecutorConfig
from .results import ExecutionResult
from .worker import ABORT_KEY, STEP_KEY, Rendezvous, RunSpec, publish_abort, run_worker

GRACE_S = 5.0   # after a failure, how long the others get to exit by themselves


class ExecutorError(RuntimeError):
    """A run failed; the message names the first failing rank and the cause. ``pids`` are the
    rank processes (all gone by now); ``shutdown_s`` is how long they took to stop after the
    launcher noticed the failure."""

    def __init__(self, message: str, pids: list[int] | None = None, shutdown_s: float | None = None):
        super().__init__(message)
        self.pids = pids or []
        self.shutdown_s = shutdown_s


def check_executable(model: ModelSpec, plan: Plan, config: ExecutorConfig | None = None) -> list[str]:
    """Validate the plan against the model, plus what this executor does not do."""
    warnings = validate(model, load_cluster(f"cpu:{plan.world_size}"), plan)
    if plan.offload != "none":
        where = "on CPU the host memory is the device memory" if not torch.cuda.is_available() else \
            "ZeRO-Offload is not implemented by the reference executor"
        raise SpecError("offload", plan.offload, f"none ({where}; use offload=none)")
    if plan.dp_impl != "allreduce":
        raise SpecError("dp_impl", plan.dp_impl, "allreduce (the executor has no parameter server)")
    if config is not None and config.inject_fault is not None and config.inject_fault.rank >= plan.world_size:
        raise SpecError("inject_fault", config.inject_fault.rank, f"a rank below world size {plan.world_size}")
    return warnings


def run_plan(model: ModelSpec | str, plan: Plan | str, steps: int = 5, warmup: int = 1, **options) -> ExecutionResult:
    """Run ``plan`` for ``steps`` steps on this machine; see ``ExecutorConfig`` for ``options``."""
    config = ExecutorConfig(steps=steps, warmup=warmup, **options)
    return run_plans([RunSpec(load_model(model), parse_plan(plan), config)])[0]


def run_plans(runs: list[RunSpec]) -> list[ExecutionResult]:
    """Run several plans of the same world size one after another in one set of processes."""
    world = runs[0].plan.world_size
    if any(r.plan.world_size != world for r in runs):
        raise SpecError("plans", [r.plan.to_string() for r in runs], "plans of one world size per launch")
    for r in runs:
        check_executable(r.model, r.plan, r.config)
    host_memory_policy()          # a bad PARSIM_HOST_MEMORY fails here, not in every rank
    timeout_s = max(r.config.timeout_s for r in runs)
    server = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timedelta(seconds=timeout_s),
                           wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="parsim-exec-") as run_dir:
        rdzv = Rendezvous("127.0.0.1", server.port, world, timeout_s, run_dir=run_dir)
        store = dist.PrefixStore(rdzv.namespace, server)
        payload = Path(run_dir, "runs.pt")
        torch.save({"rdzv": rdzv, "runs": runs}, payload)
        env = dict(os.environ, OMP_NUM_THREADS="1")   # one thread per rank
        procs = [subprocess.Popen([sys.executable, "-m", "parsim.executor.child", str(payload), str(rank)],
                                  env=env, stdout=_child_stdout(), stdin=subprocess.DEVNULL)
                 for rank in range(world)]
        try:
            failure, shutdown_s = _supervise(procs, store, run_dir)
        except BaseException:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            raise
        if failure:
            raise ExecutorError(failure, [p.pid for p in procs], shutdown_s)
        return torch.load(Path(run_dir, "result.pt"), weights_only=False)


def _child_stdout():
    """Children print to our stderr: our stdout is kept for the one JSON object."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL


def _supervise(procs: list, store: dist.Store, run_dir: str) -> tuple[str | None, float | None]:
    """Wait for the children; on the first failure stop them all. Returns the failure message
    and the seconds from noticing it to the last child gone."""
    failure: str | None = None
    deadline = noticed = None
    while True:
        alive = [p for p in procs if p.poll() is None]
        for rank, p in enumerate(procs):
            if p.returncode not in (None, 0) and failure is None:
                if not store.check([ABORT_KEY]):
                    publish_abort(store, f"rank {rank}: {_exit_cause(p.returncode, run_dir, rank, store)}")
                failure = store.get(ABORT_KEY).decode()
                noticed = time.monotonic()
                deadline = noticed + GRACE_S
        if not alive:
            break
        if deadline is not None and time.monotonic() > deadline:
            for p in alive:
                p.kill()
            break
        time.sleep(0.05)
    for p in procs:
        p.wait()
    return failure, (time.monotonic() - noticed if noticed is not None else None)


def _exit_cause(exitcode: int, run_dir: str, rank: int, store) -> str:
    error = Path(run_dir, f"rank{rank}.error")
    if error.exists():
        return error.read_text().split(": ", 1)[-1]
    key = STEP_KEY.format(rank=rank)
    where = f" during step {store.get(key).decode()}" if store.check([key]) else " before its first step"
    if exitcode < 0:
        return f"process died ({signal.Signals(-exitcode).name}){where}"
    return f"process exited with code {exitcode}{where}"


# ----------------------------------------------------------------------------- torchrun entry

def main(argv: list[str] | None = None) -> int:
    """Entry for ``torchrun ... -m parsim.executor.launch``: run this process's rank."""
    from parsim.cli import execute   # the same arguments and printing as ``parsim execute``

    import argparse
    parser = argparse.ArgumentParser(prog="parsim.executor.launch")
    execute.add_arguments(parser)
    args = parser.parse_args(argv)
    return execute.run(args)


def run_this_rank(runs: list[RunSpec]) -> list[ExecutionResult]:
    """Run as one rank of a job started by torchrun (or any launcher setting RANK/WORLD_SIZE/
    MASTER_ADDR/MASTER_PORT); returns the results on rank 0, [] elsewhere."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    for r in runs:
        check_executable(r.model, r.plan, r.config)
        if r.plan.world_size != world:
            raise SpecError("dp*tp*pp", r.plan.world_size, f"must equal WORLD_SIZE={world}")
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    attempt = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    rdzv = Rendezvous(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                      max(r.config.timeout_s for r in runs), host_store=not agent_store,
                      namespace=f"parsim/{attempt}")
    if rank != 0:
        os.dup2(2, 1)
    return run_worker(rank, local_rank, rdzv, runs)


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # see child.py: no finalisation of gloo/store threads
