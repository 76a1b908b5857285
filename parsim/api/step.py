"""One plan: ``simulate`` (SimPy engine) and ``memory`` (analytic model)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from parsim.specs import SpecError

from .inputs import ClusterLike, ModelLike, PlanLike, load_specs

if TYPE_CHECKING:
    import pandas as pd

    from parsim.sim.result import SimResult
    from parsim.trace import Trace


def parse_slowdown(text: str | dict[int, float] | None) -> dict[int, float]:
    """``"3=1.5,5=1.2"`` (or a dict) -> {global rank: factor on its compute time}, checked as
    every per-rank what-if's (``study.faults.parse_factors``; the engine checks the ranks
    against the world size)."""
    from parsim.study.faults import parse_factors
    return parse_factors("slowdown", text)


@dataclass(frozen=True)
class Result:
    """One simulated training step: the numbers of ``parsim simulate --json`` as attributes.

    Seconds: ``step_time_s``, ``exposed_comm_s`` ({tp, dp, pp}: compute stream blocked on each,
    mean per device), ``sim_wall_s`` (the simulator's own run time). Bytes: ``peak_memory_bytes``
    (max over ranks), ``capacity_bytes`` (usable per device), ``memory_by_stage`` (per pipeline
    stage: params, grads, optimizer, activations, other, total at its peak). Fractions: ``mfu``,
    ``hfu``, ``bubble_fraction``. FLOP per step: ``model_flops_per_step``,
    ``hardware_flops_per_step`` (with recomputation). ``tokens_per_s``: tokens per second.
    ``stack``: the software stack that ran the plan (the plan's, or the profile's default)."""
    step_time_s: float
    tokens_per_s: float
    mfu: float
    hfu: float
    bubble_fraction: float
    peak_memory_bytes: float
    memory_by_stage: list[dict[str, float]]
    capacity_bytes: float
    fits: bool
    model_flops_per_step: float
    hardware_flops_per_step: float
    exposed_comm_s: dict[str, float]
    num_events: int
    sim_wall_s: float
    mode: str
    simulated_ranks: list[int]
    plan: str
    stack: str
    model: str
    cluster: str
    warnings: list[str]
    sim: "SimResult" = field(repr=False, compare=False)   # the engine's result (timelines, trace meta)

    @classmethod
    def from_sim(cls, sim: "SimResult") -> "Result":
        return cls(**{f.name: getattr(sim, f.name) for f in fields(cls) if f.name != "sim"}, sim=sim)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``parsim simulate --json``."""
        return self.sim.to_dict()

    @property
    def events(self) -> "Trace":
        """The step's events in the ``parsim.trace`` schema (times in seconds)."""
        return self.sim.trace

    @property
    def memory_timeline(self) -> dict[int, list[tuple[float, dict[str, float]]]]:
        """{simulated rank: [(t seconds, {category: bytes})]}, at the start and after every change."""
        return self.sim.memory_timeline

    @overload
    def trace(self, path: None = None) -> dict[str, Any]: ...
    @overload
    def trace(self, path: str | Path) -> Path: ...

    def trace(self, path: str | Path | None = None) -> dict[str, Any] | Path:
        """The Chrome/Perfetto trace (open in ui.perfetto.dev): with ``path``, written there as
        JSON and the path returned; without, the trace object (microsecond timestamps)."""
        from parsim.trace.chrome import save_chrome_trace, to_chrome
        if path is None:
            return to_chrome(self.events)
        return save_chrome_trace(self.events, path)

    def to_pandas(self, what: str = "events") -> "pd.DataFrame":
        """``events``: one row per event (rank, stage, stream, kind, microbatch, layer, start,
        end, duration in seconds, bytes, flops, name); ``memory``: bytes per category and total
        per simulated rank after every change (time_s in seconds); ``stages``: ``memory_by_stage``."""
        import pandas as pd
        if what == "events":
            from parsim.trace.frame import to_dataframe
            return to_dataframe(self.events)
        if what == "memory":
            rows = [{"rank": rank, "time_s": t, **parts, "total": sum(parts.values())}
                    for rank, samples in self.memory_timeline.items() for t, parts in samples]
            return pd.DataFrame(rows)
        if what == "stages":
            return pd.DataFrame(self.memory_by_stage)
        raise SpecError("what", what, "one of events, memory, stages")


def simulate(model: ModelLike, cluster: ClusterLike, plan: PlanLike, *, profile: str | Path | None = None,
             mode: str | None = None, slowdown: str | dict[int, float] | None = None,
             detail: bool = False, link_slowdown: dict[int, float] | None = None,
             max_events: int | None = None) -> Result:
    """One training step of ``plan`` through the SimPy engine (``parsim simulate``).

    ``mode``: "representative" (one device per pipeline rank; the default) or "full" (every
    device; the default with ``slowdown``). ``slowdown``: straggler what-if, {global rank:
    factor} or "3=1.5,5=1.2" (1.5 = compute 50% slower). ``detail``: also record per-layer
    compute and per-collective TP events in the trace (slower). ``link_slowdown``: {global rank:
    factor} on the time of that rank's NIC transfers (a degraded NIC). A plan whose simulation
    would play more than ``max_events`` events [$PARSIM_MAX_EVENTS, 10,000,000] is refused
    before it starts (``parsim.specs.bounds``)."""
    from parsim.sim import simulate as run_engine
    from parsim.costs.work import check_simulation
    model, cluster, plan, _ = load_specs(model, cluster, plan, profile)
    slow = parse_slowdown(slowdown)
    mode = mode or ("full" if slow else "representative")
    if mode not in ("representative", "full"):
        raise SpecError("mode", mode, "representative or full")
    replicas = None
    if mode == "full" and plan.world_size <= 10**6:      # one device per class of identical ranks
        from parsim.sim.symmetry import full_mode_classes
        replicas = len(full_mode_classes(cluster, plan, slow, link_slowdown).simulated) // plan.pp
    check_simulation(model, cluster, plan, mode=mode, detail=detail, limit=max_events, replicas=replicas)
    result = Result.from_sim(run_engine(model, cluster, plan, mode=mode, slowdown=slow, detail=detail,
                                      link_slowdown=link_slowdown))
    check_finite(result.to_dict(), cluster)
    return result


def check_finite(numbers: Any, cluster, where: str = "") -> None:
    """No NaN, infinite or negative number leaves the program (every number of a simulated
    step or a memory report is a time, a count, bytes or a fraction): such a result comes
    from device or network numbers the engine cannot use (a zero bandwidth, a NaN peak)."""
    if isinstance(numbers, dict):
        for k, v in numbers.items():
            check_finite(v, cluster, f"{where}.{k}" if where else str(k))
    elif isinstance(numbers, (list, tuple)):
        for i, v in enumerate(numbers):
            check_finite(v, cluster, f"{where}[{i}]")
    elif isinstance(numbers, (int, float)) and not isinstance(numbers, bool):
        if not (math.isfinite(numbers) and numbers >= 0):
            raise SpecError("cluster", f"{cluster.name}:{cluster.num_devices}",
                            f"device and network numbers that give a finite, non-negative {where} (got {numbers!r}): "
                            "bandwidths, latencies, peak FLOP/s and memory must be positive and finite")


# ------------------------------------------------------------------------------------- memory

@dataclass(frozen=True)
class MemoryReport:
    """Per-stage memory of a plan from the analytic model (``parsim memory``), in bytes."""
    model: str
    cluster: str
    plan: str
    memory_by_stage: list[dict[str, float]]   # per stage: params, grads, optimizer, activations, other, total
    peak_memory_bytes: float                  # max over stages
    capacity_bytes: float                     # usable per device
    fits: bool
    warnings: list[str]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``parsim memory --json``."""
        return {"model": self.model, "plan": self.plan, "memory_by_stage": self.memory_by_stage,
                "peak_memory_bytes": self.peak_memory_bytes, "capacity_bytes": self.capacity_bytes,
                "fits": self.fits, "warnings": self.warnings}

    def to_pandas(self) -> "pd.DataFrame":
        import pandas as pd
        return pd.DataFrame(self.memory_by_stage)


def memory(model: ModelLike, cluster: ClusterLike, plan: PlanLike, *,
           profile: str | Path | None = None) -> MemoryReport:
    """Per pipeline stage: parameters, gradients, optimizer state, activations and other bytes
    at the stage's peak, and whether the plan fits the device (``parsim memory``)."""
    from parsim.costs import device_capacity, memory_by_stage
    from parsim.costs.stack import apply_stack
    model, cluster, plan, warnings = load_specs(model, cluster, plan, profile)
    stages = [s.to_dict() for s in memory_by_stage(model, plan, cluster)]
    cap = device_capacity(apply_stack(model, cluster, plan)[1])     # under the plan's stack
    peak = max(s["total"] for s in stages)
    check_finite({"peak_memory_bytes": peak, "capacity_bytes": cap, "memory_by_stage": stages}, cluster)
    return MemoryReport(model.name, f"{cluster.name}:{cluster.num_devices}", plan.to_string(), stages, peak, cap,
                        peak <= cap, warnings)

