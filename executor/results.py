"""What a run measured: per rank (``RankResult``) and combined (``ExecutionResult``).

* step time of a step = the slowest rank's time from the step's common start (after a
  barrier) to the end of its optimizer step; ``step_time_s`` = median over the timed steps
  (after warm-up, excluding the memory-tracked step when another timed step exists). On CPU
  ranks of one host the common start is the first rank's exit from the barrier, on the host's
  one clock (``time.perf_counter``: CLOCK_MONOTONIC on Linux, the same in every process): a
  rank the scheduler woke late starts its step late, and its events and end are counted from
  that common start (``aligned``). Elsewhere (CUDA events, ranks on several hosts) each rank
  counts from its own exit;
* loss of a step = mean over DP replicas and microbatches of the microbatch mean token loss
  (= the mean token loss of the global batch, since every microbatch has as many tokens);
* peak memory per rank and its breakdown come from the memory-tracked step;
* ``trace`` = every rank's events of the representative step (the timed step whose time is
  the median), times in seconds from that step's start.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from parsim.trace import Event, Trace


@dataclass
class RankResult:
    rank: int
    coords: tuple[int, int, int]                           # (pp_rank, dp_rank, tp_rank)
    steps: list[int] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)   # this rank, per executed step
    microbatch_losses: list[list[float]] = field(default_factory=list)  # last stage only
    skipped: list[bool] = field(default_factory=list)       # fp16 steps skipped on overflow
    events: dict[int, list[Event]] = field(default_factory=dict)
    memory_step: int = -1
    peak_memory_bytes: int = 0
    memory_breakdown: dict[str, int] = field(default_factory=dict)
    params: dict[str, Any] | None = None                   # canonical full tensors this rank wrote
    grads: dict[str, Any] | None = None                    # canonical full gradients of the first step
    layer_probes: list[Any] = field(default_factory=list)  # ExecutorConfig.layer_probe: before every timed
                                                           # step and after the last (LayerProbe on rank 0)
    # per executed step, the moment its clock started on the host's monotonic clock (s; None on
    # CUDA), and the host that clock belongs to (``host_clock``): ``aligned`` lines the ranks up
    step_origins: list[float | None] = field(default_factory=list)
    clock_host: str = ""


@dataclass
class ExecutionResult:
    model: str
    plan: str
    world_size: int
    backend: str
    device: str
    steps: list[int]
    losses: list[float]
    step_times: list[float]
    timed_steps: list[int]
    step_time_s: float
    memory_step: int
    peak_memory_bytes_by_rank: list[int]
    memory_breakdown_by_rank: list[dict[str, int]]
    trace: Trace
    trace_step: int
    trace_files: list[str] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)
    params: dict[str, Any] | None = None    # full parameters after the last step (collect_params)
    grads: dict[str, Any] | None = None     # full gradients of the first step (collect_grads)
    # the layer probe right before every timed step and after the last (``LayerProbe.to_dict``), when
    # ``ExecutorConfig.layer_probe`` asked for it
    layer_probes: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "plan": self.plan, "world_size": self.world_size, "backend": self.backend,
            "device": self.device, "steps": self.steps, "losses": self.losses, "step_times_s": self.step_times,
            "timed_steps": self.timed_steps, "step_time_s": self.step_time_s, "memory_step": self.memory_step,
            "peak_memory_bytes": max(self.peak_memory_bytes_by_rank, default=0),
            "peak_memory_bytes_by_rank": self.peak_memory_bytes_by_rank,
            "memory_breakdown_by_rank": self.memory_breakdown_by_rank,
            "trace_step": self.trace_step, "num_events": len(self.trace.events), "trace_files": self.trace_files,
            "skipped_steps": self.skipped_steps,
        }


def timed_steps(steps: list[int], warmup: int, memory_step: int) -> list[int]:
    timed = steps[warmup:] or steps[-1:]
    if memory_step in timed and len(timed) > 1:
        timed = [s for s in timed if s != memory_step]
    return timed


def memory_step_of(first_step: int, last_step: int, warmup: int) -> int:
    """The step whose memory is tracked: the last warm-up step if it already holds optimizer
    state (not the very first training step), otherwise the last step."""
    candidate = first_step + warmup - 1
    if warmup >= 1 and candidate >= 1 and candidate <= last_step:
        return candidate
    return last_step


def host_clock() -> str:
    """Which monotonic clock this process reads: its host and that host's boot (proc(5)
    ``sys/kernel/random/boot_id``; cloned VMs may share a hostname). Ranks with equal values
    read one clock, so their ``step_origins`` compare."""
    import socket
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}|{boot}"


def aligned(results: list[RankResult]) -> list[list[float]]:
    """Per rank and executed step, the seconds its clock started after the step's common start
    (the earliest rank's): 0 for every rank unless all ranks read one host's clock."""
    zeros = [[0.0] * len(r.steps) for r in results]
    if len({r.clock_host for r in results}) != 1 or not results[0].clock_host:
        return zeros
    if any(len(r.step_origins) != len(r.steps) or None in r.step_origins for r in results):
        return zeros
    starts = [min(r.step_origins[i] for r in results) for i in range(len(results[0].steps))]
    return [[o - s for o, s in zip(r.step_origins, starts)] for r in results]


def combine(results: list[RankResult], *, model: str, plan_text: str, backend: str, device: str,
            warmup: int) -> ExecutionResult:
    results = sorted(results, key=lambda r: r.rank)
    steps = results[0].steps
    late = aligned(results)
    step_times = [max(r.step_times[i] + late[k][i] for k, r in enumerate(results)) for i in range(len(steps))]
    losses = []
    # the ranks holding the last stage (the last pipeline rank, or rank 0 under a V placement)
    loss_ranks = [r for r in results if r.coords[2] == 0 and r.microbatch_losses and r.microbatch_losses[0]]
    for i in range(len(steps)):
        per_replica = [statistics.fmean(r.microbatch_losses[i]) for r in loss_ranks]
        losses.append(statistics.fmean(per_replica))
    memory_step = results[0].memory_step
    timed = timed_steps(steps, warmup, memory_step)
    timed_times = [step_times[steps.index(s)] for s in timed]
    median = statistics.median(timed_times)
    trace_step = min(timed, key=lambda s: (abs(step_times[steps.index(s)] - median), s))
    at = steps.index(trace_step)
    events = [replace(e, start=e.start + late[k][at], end=e.end + late[k][at]) if late[k][at] else e
              for k, r in enumerate(results) for e in r.events.get(trace_step, [])]
    trace = Trace(events=events, meta={"engine": "executor", "model": model, "plan": plan_text,
                                       "world_size": len(results), "step": trace_step, "backend": backend})
    def merged(attr: str) -> dict | None:
        if all(getattr(r, attr) is None for r in results):
            return None
        out: dict = {}
        for r in results:
            out.update(getattr(r, attr) or {})
        return out

    skipped = sorted({steps[i] for r in results for i, s in enumerate(r.skipped) if s})
    return ExecutionResult(
        model=model, plan=plan_text, world_size=len(results), backend=backend, device=device, steps=steps,
        losses=losses, step_times=step_times, timed_steps=timed, step_time_s=median, memory_step=memory_step,
        peak_memory_bytes_by_rank=[r.peak_memory_bytes for r in results],
        memory_breakdown_by_rank=[dict(r.memory_breakdown) for r in results], trace=trace, trace_step=trace_step,
        skipped_steps=skipped, params=merged("params"), grads=merged("grads"),
        layer_probes=[p.to_dict() for p in results[0].layer_probes if p is not None])
