"""The engine's entry: ``simulate`` checks its what-ifs (per-rank compute and NIC factors),
builds the plan's schedule, plays it (``engine.Simulation``) and, on a CPU host whose stepped
actions share its cores, iterates the mean-field slowdown over whole runs."""
from __future__ import annotations

import gc
import math
import time

from parsim.costs.host import ComputeScale
from parsim.costs.stack import apply_stack
from parsim.schedules import Schedule, build_schedule_for_plan
from parsim.specs import (ClusterSpec, ModelSpec, Plan, RankLayout, SpecError, load_cluster, load_model, parse_plan,
                          validate)

from .engine import MODES, Simulation
from .record import Recorder
from .result import SimResult, assemble


def _run(model: ModelSpec, cluster: ClusterSpec, plan: Plan, schedule: Schedule, mode: str, slowdown: dict,
         record_events: bool, detail: bool, contention: ComputeScale | None, links: dict,
         symmetric: bool = True, host_busy: float | None = None) -> "Simulation":
    sim = Simulation(model, cluster, plan, schedule, mode, slowdown, Recorder(record_events, detail), contention,
                     links, symmetric, host_busy)
    sim.start()
    # A step allocates ~10 short-lived objects per SimPy event; the cyclic collector would
    # re-scan the growing trace again and again, so it waits until the run is over.
    collecting = gc.isenabled()
    gc.disable()
    try:
        sim.env.run()
    finally:
        if collecting:
            gc.enable()
    # SimPy numbers every event it schedules (the tie-break counter of its event queue, an
    # itertools.count); a run to completion processes them all. -1 if a SimPy release drops it.
    counter = getattr(sim.env, "_eid", None)
    sim.num_events = next(counter) if counter is not None else -1
    stuck = [r for r in sim.devices if r not in sim.recorder.finish]
    if stuck:
        raise SpecError("schedule", schedule.name, f"deadlocks: ranks {stuck[:8]} never finish their actions")
    if sim.classes.reduced:
        sim.recorder.stand_for(sim.classes.members)    # every rank's accounts and events: its class's
    return sim


def simulate(model: ModelSpec | str, cluster: ClusterSpec | str, plan: Plan | str, *, mode: str = "representative",
             slowdown: dict[int, float] | None = None, schedule: Schedule | None = None,
             record_events: bool = True, detail: bool = False,
             link_slowdown: dict[int, float] | None = None, symmetric: bool = True) -> SimResult:
    """One training step of ``plan`` through the SimPy engine.

    ``mode``: "representative" (one device per pipeline rank) or "full" (every device;
    needed for ``slowdown``: {global rank: factor on its compute time, 1.5 = 50% slower}). ``schedule``
    overrides the plan's generated one. ``record_events`` keeps the trace; ``detail`` adds
    per-layer compute and per-collective TP events to it (slower). ``link_slowdown``: {global
    rank: factor on the time of its NIC transfers} (a degraded NIC; module docstring).
    ``symmetric`` (full mode): one device per class of identical ranks, copied to the others
    (``symmetry``; the same numbers); False plays every device (the tests' reference)."""
    wall = time.perf_counter()
    model, cluster, plan = load_model(model), load_cluster(cluster), parse_plan(plan)
    warnings = validate(model, cluster, plan)
    asked = plan
    model, cluster, plan = apply_stack(model, cluster, plan)      # the software stack's physics (``costs.stack``)
    if mode not in MODES:
        raise SpecError("mode", mode, f"one of {', '.join(MODES)}")
    slowdown = _factors("slowdown", slowdown, plan.world_size)
    links = _factors("link_slowdown", link_slowdown, plan.world_size)
    layout = RankLayout(plan.dp, plan.tp, plan.pp)
    if mode != "full" and any(layout.coords(r)[1:] != (0, 0) for r in slowdown):
        raise SpecError("slowdown", ",".join(f"{r}={f}" for r, f in slowdown.items()),
                        "per-rank slowdowns need mode=full (every device simulated), or ranks of DP replica 0 "
                        "and TP rank 0 in representative mode")
    if schedule is None:
        schedule = build_schedule_for_plan(plan)
    elif (schedule.pp, schedule.vpp, schedule.num_microbatches) != (plan.pp, plan.vpp, plan.num_microbatches):
        raise SpecError("schedule", schedule.name, f"must have pp={plan.pp}, vpp={plan.vpp} and "
                        f"{plan.num_microbatches} microbatches to match the plan")
    sim = _run(model, cluster, plan, schedule, mode, slowdown, record_events, detail, None, links, symmetric)
    if sim.sharing is None and sim.host.shared:
        # stepped actions on a shared host: a pipeline rank idle in a bubble leaves its core to
        # the others, so iterate the mean-field slowdown (``HostModel.settle``) over whole runs;
        # with it the share of the step the ranks compute, where it prices TP collectives
        priced_by_share = plan.tp > 1 and cluster.network.collectives.prices_by_host_ranks
        share = None
        for _ in range(6):
            step = max(sim.recorder.finish.values(), default=0.0)
            busy = sum(sim.recorder.busy[r] for r in sim.devices) * plan.world_size / len(sim.devices)
            scale = sim.host.settle(busy, step, sim.contention)
            now = computing_share(sim, step) if priced_by_share else None
            moved = now is not None and (share is None or abs(now - share) > 0.01)
            if scale is None and not moved:
                break
            share = now
            sim = _run(model, cluster, plan, schedule, mode, slowdown, record_events, detail, scale or sim.contention,
                       links, symmetric, share)
    return assemble(sim, warnings, wall, asked)


def computing_share(sim: "Simulation", step_s: float) -> float | None:
    """Share of the step [0, 1] a simulated rank computes, TP collectives inside its actions
    left out (``Recorder.busy`` less ``exposed['tp']``), the mean over the simulated ranks: how
    often a shared host's other ranks want their cores (``CollectiveFit.shared_alpha``)."""
    if step_s <= 0 or not sim.devices:
        return None
    rec = sim.recorder
    computing = sum(max(rec.busy[r] - rec.exposed[r]["tp"], 0.0) for r in sim.devices)
    return min(computing / (len(sim.devices) * step_s), 1.0)


def _factors(name: str, given: dict[int, float] | None, world: int) -> dict[int, float]:
    """Checked {global rank: positive time factor}."""
    out = dict(given or {})
    for r, f in out.items():
        if not isinstance(r, int) or not 0 <= r < world:
            raise SpecError(name, f"{r}={f}", f"rank must be an integer in 0..{world - 1}")
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < math.inf:
            raise SpecError(name, f"{r}={f}", "factor must be a finite positive number (1.5 = 50% slower)")
    return out
