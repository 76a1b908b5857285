"""SimResult: one simulated step's metrics, memory, timeline and trace.

* ``step_time_s``: when the last simulated device finishes its optimizer step (and parameter
  update), seconds from the step start.
* ``tokens_per_s`` = gbs * seq_len / step_time.
* ``mfu`` / ``hfu``: model FLOPs (``costs.model_flops_per_step``, no recomputation) and
  hardware FLOPs (``costs.hardware_flops_per_step``, recomputation included) per step over
  step_time * devices * peak FLOP/s of the plan's dtype (Chowdhery et al. 2022, PaLM, App. B).
* ``bubble_fraction`` = 1 - sum_r busy_r / (ranks * step_time) over the simulated devices,
  busy = compute-stream time (actions and on-device optimizer step); uniform stages with free
  communication give (p - 1)/(m + p - 1) for GPipe/1F1B (Narayanan et al. 2021 Sec. 2.2.1).
* ``exposed_comm_s``: per stream, seconds the compute stream is blocked on communication,
  averaged over the simulated devices (``record`` states exactly what counts).
* ``memory_by_stage``: per pipeline rank, the breakdown at the peak of its memory timeline
  (max over its devices in ``full`` mode); ``fits`` compares the peak with the usable memory.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from parsim.costs import CATEGORIES, device_capacity, hardware_flops_per_step, model_flops_per_step
from parsim.trace.events import Trace

from .record import EXPOSED

if TYPE_CHECKING:
    from parsim.specs import Plan

    from .engine import Simulation
    from .memory import MemoryTimeline
    from .record import Recorder


@dataclass
class SimResult:
    step_time_s: float
    tokens_per_s: float
    mfu: float
    hfu: float
    bubble_fraction: float
    exposed_comm_s: dict[str, float]
    memory_by_stage: list[dict[str, float]]
    peak_memory_bytes: float
    capacity_bytes: float
    fits: bool
    model_flops_per_step: float
    hardware_flops_per_step: float
    num_events: int
    sim_wall_s: float
    plan: str
    model: str
    cluster: str
    mode: str
    simulated_ranks: list[int]
    stack: str = "torch"              # the software stack that ran the plan (``specs.stack``)
    warnings: list[str] = field(default_factory=list)
    timelines: dict[int, "MemoryTimeline"] = field(default_factory=dict, repr=False)
    recorder: "Recorder | None" = field(default=None, repr=False)
    trace_meta: dict[str, Any] = field(default_factory=dict, repr=False)
    devices_simulated: int = 0            # SimPy device processes: full mode plays one per class of identical ranks

    @cached_property
    def trace(self) -> Trace:
        """The step's events (parsim.trace schema), built on first use: a 1T-parameter step has
        ~2 x 10^5 of them and most callers only want the numbers."""
        events = self.recorder.events() if self.recorder is not None else []
        return Trace(events=events, meta=dict(self.trace_meta))

    @property
    def memory_timeline(self) -> dict[int, list[tuple[float, dict[str, float]]]]:
        """{rank: [(t seconds, {category: bytes})]}: the state at the start and after every change."""
        return {r: [(t, dict(zip(CATEGORIES, snap))) for t, snap in tl.samples] for r, tl in self.timelines.items()}

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``parsim simulate --json``."""
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "bubble_fraction": self.bubble_fraction,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_by_stage": self.memory_by_stage,
            "capacity_bytes": self.capacity_bytes,
            "fits": self.fits,
            "model_flops_per_step": self.model_flops_per_step,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "exposed_comm_s": self.exposed_comm_s,
            "num_events": self.num_events,
            "sim_wall_s": self.sim_wall_s,
            "mode": self.mode,
            "simulated_ranks": self.simulated_ranks,
            "plan": self.plan,
            "stack": self.stack,
            "model": self.model,
            "cluster": self.cluster,
            "warnings": self.warnings,
        }


def assemble(sim: "Simulation", warnings: list[str], wall_start: float, asked: "Plan | None" = None) -> SimResult:
    """The result of a finished run; ``asked``: the plan as the user gave it (its stack still
    ``auto``), which the result names (the run's plan names its stack: ``stack``)."""
    model, cluster, plan, rec = sim.model, sim.cluster, sim.plan, sim.recorder
    shown = (asked or plan).to_string()
    ranks = list(sim.classes.ranks)      # every rank: simulated, or standing in its class's representative
    step = max(rec.finish.values())
    n = plan.world_size
    peak_flops = cluster.device.flops(plan.dtype)
    mflops = model_flops_per_step(model, plan.gbs)
    hflops = hardware_flops_per_step(model, plan)
    busy = sum(rec.busy[r] for r in ranks)
    # >= 0: the difference can round below zero when no rank idles
    bubble = max(0.0, 1.0 - busy / (len(ranks) * step)) if step > 0 else 0.0
    exposed = {k: sum(rec.exposed[r][k] for r in ranks) / len(ranks) for k in EXPOSED}
    stages = []
    for p in range(plan.pp):
        devs = [d for d in sim.devices.values() if d.pp_rank == p]
        top = max(devs, key=lambda d: d.memory.peak).memory
        row = {"stage": p, **dict(zip(CATEGORIES, top.peak_breakdown))}
        row["total"] = top.peak
        stages.append(row)
    peak = max(s["total"] for s in stages)
    cap = device_capacity(cluster)
    meta = {"engine": "parsim.sim", "mode": sim.mode, "plan": shown, "stack": plan.stack, "model": model.name,
            "cluster": f"{cluster.name}:{cluster.num_devices}", "world_size": n, "simulated_ranks": ranks,
            "schedule": sim.schedule.name, "detail": rec.detail}
    return SimResult(
        step_time_s=step,
        tokens_per_s=plan.gbs * model.seq_len / step if step > 0 else 0.0,
        mfu=mflops / (step * n * peak_flops) if step > 0 else 0.0,
        hfu=hflops / (step * n * peak_flops) if step > 0 else 0.0,
        bubble_fraction=bubble,
        exposed_comm_s=exposed,
        memory_by_stage=stages,
        peak_memory_bytes=peak,
        capacity_bytes=cap,
        fits=peak <= cap,
        model_flops_per_step=mflops,
        hardware_flops_per_step=hflops,
        num_events=sim.num_events,
        sim_wall_s=time.perf_counter() - wall_start,
        plan=shown,
        model=model.name,
        cluster=f"{cluster.name}:{cluster.num_devices}",
        mode=sim.mode,
        simulated_ranks=ranks,
        stack=plan.stack,
        warnings=list(warnings),
        timelines={r: sim.devices[sim.classes.representative[r]].memory for r in ranks},
        recorder=rec,
        trace_meta=meta,
        devices_simulated=len(sim.devices),
    )
