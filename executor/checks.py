"""What the reference executor checks before any rank starts, without importing torch.

``check_executable`` validates a plan against its model (the simulator's rules, ``specs.validate``)
plus what this executor does not do, and the run's files; ``check_launch`` checks every run of a
launch in order; ``ExecutorError`` is how a launch fails; ``under_torchrun`` tells whether this
process is one rank of a job another launcher started. Kept apart from ``launch`` (which imports
torch, ~2.5 s) so that ``parsim execute`` rejects bad input before torch is imported and starts
its fork server beside that import (``forked.start_early``).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from parsim.specs import ClusterSpec, ModelSpec, Plan, SpecError, load_cluster, validate

from .config import ExecutorConfig
from .processes import LaunchError

if TYPE_CHECKING:
    from .worker import RunSpec


class ExecutorError(LaunchError):
    """A run failed; the message names the first failing rank and the cause. ``pids`` are the
    rank processes (all gone by now); ``shutdown_s`` is how long they took to stop after the
    launcher noticed the failure."""


def check_executable(model: ModelSpec, plan: Plan, config: ExecutorConfig | None = None,
                     planned: dict[str, tuple[int, str]] | None = None,
                     cluster: ClusterSpec | None = None) -> list[str]:
    """Validate the plan against the model on ``cluster`` [``cpu:<world size>``], plus what this
    executor does not do, and the run's files (``ExecutorConfig.check_files``; ``planned``:
    checkpoints earlier runs of the launch write)."""
    warnings = validate(model, cluster or load_cluster(f"cpu:{plan.world_size}"), plan)
    if plan.offload != "none":
        import torch
        where = "on CPU the host memory is the device memory" if not torch.cuda.is_available() else \
            "ZeRO-Offload is not implemented by the reference executor"
        raise SpecError("offload", plan.offload, f"none ({where}; use offload=none)")
    if plan.dp_impl != "allreduce":
        raise SpecError("dp_impl", plan.dp_impl, "allreduce (the executor has no parameter server)")
    if config is not None and config.inject_fault is not None and config.inject_fault.rank >= plan.world_size:
        raise SpecError("inject_fault", config.inject_fault.rank, f"a rank below world size {plan.world_size}")
    if config is not None:
        config.check_files(model, planned)      # checkpoint, data and output folders: before any rank starts
    return warnings


def check_launch(runs: list[RunSpec]) -> None:
    """Every run of a launch, in order: a run may resume from the checkpoint an earlier one saves."""
    planned: dict[str, tuple[int, str]] = {}
    for r in runs:
        check_executable(r.model, r.plan, r.config, planned)
        if r.config.save_dir is not None:
            planned[str(r.config.save_dir)] = (r.config.save_at, r.model.name)


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
