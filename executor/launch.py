"""Start the ranks of a plan and collect what they measured.

* ``run_plan`` / ``run_plans`` (Python API, and ``parsim execute`` on one machine): start
  dp*tp*pp ranks with the one launcher (``processes.run_ranks``: fresh interpreters), host the
  rendezvous store here, and on the first failure publish it as the abort message, so the
  others' watchdogs stop them (the launcher kills what is left after a grace period).
  Several runs with the same world size share one set of processes (start-up dominates small
  runs).
* ``python -m parsim.executor.launch ...`` under ``torchrun`` (many nodes): every process is
  one rank (``run_this_rank``); rank 0 prints the result. The arguments and the printout are
  ``parsim execute``'s (``entry``). Example:
  ``torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400
  -m parsim.executor.launch --model gpt3-1.3b --plan "dp=2 tp=8" --steps 10``
"""
from __future__ import annotations

import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist

from parsim.specs import ModelSpec, Plan, SpecError, load_model, parse_plan

from .checks import ExecutorError, check_executable, check_launch, under_torchrun  # noqa: F401 (the API's names)
from .config import ExecutorConfig
from .host_alloc import host_memory_policy
from .processes import LaunchError, exit_cause, run_ranks
from .results import ExecutionResult
from .worker import ABORT_KEY, ARRIVED_KEY, STEP_KEY, Rendezvous, RunSpec, launched_rank, publish_abort, run_worker


def run_plan(model: ModelSpec | str, plan: Plan | str, steps: int = 5, warmup: int = 1, **options) -> ExecutionResult:
    """Run ``plan`` for ``steps`` steps on this machine; see ``ExecutorConfig`` for ``options``."""
    config = ExecutorConfig(steps=steps, warmup=warmup, **options)
    return run_plans([RunSpec(load_model(model), parse_plan(plan), config)])[0]


def run_plans(runs: list[RunSpec]) -> list[ExecutionResult]:
    """Run several plans of the same world size one after another in one set of processes."""
    world = runs[0].plan.world_size
    if any(r.plan.world_size != world for r in runs):
        raise SpecError("plans", [r.plan.to_string() for r in runs], "plans of one world size per launch")
    check_launch(runs)
    host_memory_policy()          # a bad PARSIM_HOST_MEMORY fails here, not in every rank
    timeout_s = max(r.config.timeout_s for r in runs)
    server = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timedelta(seconds=timeout_s),
                           wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="parsim-exec-") as run_dir:
        rdzv = Rendezvous("127.0.0.1", server.port, world, timeout_s, run_dir=run_dir)
        store = dist.PrefixStore(rdzv.namespace, server)

        def abort_message(rank: int, exitcode: int | None) -> str:
            """The run's abort message: a rank's own if it published one first, else this one's cause."""
            if not store.check([ABORT_KEY]):
                key = STEP_KEY.format(rank=rank)
                where = f" during step {store.get(key).decode()}" if store.check([key]) else " before its first step"
                publish_abort(store, f"rank {rank}: {exit_cause(run_dir, rank, exitcode, where)}")
            return store.get(ABORT_KEY).decode()

        def never_arrived(rank: int) -> bool:
            """No watchdog stops a rank that never checked in: killed at once after a failure."""
            return not store.check([ARRIVED_KEY.format(rank=rank)])

        try:
            # a rank silent for half the timeout is named before its peers' collectives time out
            return run_ranks(launched_rank, (rdzv, runs), world, run_dir=run_dir, on_failure=abort_message,
                             stall_s=timeout_s / 2, stranded=never_arrived)[0]
        except LaunchError as err:
            raise ExecutorError(str(err), err.pids, err.shutdown_s) from None


# ----------------------------------------------------------------------------- torchrun

def run_this_rank(runs: list[RunSpec]) -> list[ExecutionResult]:
    """Run as one rank of a job started by torchrun (or any launcher setting RANK/WORLD_SIZE/
    MASTER_ADDR/MASTER_PORT); returns the results on rank 0, [] elsewhere."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    check_launch(runs)
    for r in runs:
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


if __name__ == "__main__":
    from .entry import main   # the arguments and printout of ``parsim execute``
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # see child.py: no finalisation of gloo/store threads
