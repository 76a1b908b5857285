"""parsim.executor: the torch reference executor (DESIGN.md, "The reference executor").

Runs a Plan for real on torch.distributed (gloo on CPU, NCCL on CUDA) with the same rank
layout and the same Schedule IR action lists as the simulator, and measures step time,
losses, peak memory by category and the per-action timeline in the trace schema.

    from parsim.executor import run_plan
    result = run_plan("tiny", "dp=2 pp=2 gbs=8 schedule=1f1b dtype=fp32", steps=5, warmup=1)
    result.step_time_s, result.losses, result.peak_memory_bytes_by_rank, result.trace

Attributes are imported lazily so that ``import parsim.executor.config`` (used by the CLI's
argument parsing) does not import torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "run_plan": "launch", "run_plans": "launch", "check_executable": "checks", "ExecutorError": "checks",
    "ExecutionResult": "results", "RankResult": "results",
    "ExecutorConfig": "config", "FaultInjection": "config",
    "RunSpec": "worker",
    "run_reference": "reference",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(name)
