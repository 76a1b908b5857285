"""Step time of a pipeline whose stages take different times: a list-scheduling dry run of
the plan's Schedule IR (``parsim.schedules``) with per-stage forward/backward durations.

Each rank runs its actions in order, an action starting when its rank is free and its
dependencies (``parsim.schedules.dependencies``) are done, plus the send time of the
activation / gradient when the dependency ran on another rank. For 1F1B with equal stages
this gives the textbook (m + p - 1)(t_f + t_b) (Narayanan et al. 2021, Sec. 2.2.1); with
unequal stages the slowest stage sets the steady state (Merak, Lai et al. 2023, Sec. 4).

When the pipeline ranks share one host's cores (calibrated CPU profiles), an action's
duration depends on how many ranks compute beside it at each moment: ``shared_host_run``
replays the schedule on the host model's processor sharing (``costs.host.HostModel``, as the
SimPy engine does), each action a job of (fixed, GEMM, memory-bound) solo seconds. A stage that computes while
the others idle runs at its solo speed; one that always overlaps the others runs at the
contended speed. Its per-stage times are the mean durations of the stage's actions, which is
what the executor's trace measures.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parsim.costs.host import HostModel
from parsim.schedules import build_schedule_for_plan
from parsim.schedules.check import ScheduleError, TimedAction, dependencies, list_schedule
from parsim.specs import Plan, SpecError

Job = tuple[float, float, float]          # (fixed, GEMM, memory-bound) solo seconds


@dataclass(frozen=True)
class PipelineRun:
    """One step's makespan and each virtual stage's mean forward / backward action duration (s)."""
    step_time_s: float
    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]


def pipeline_step_time(plan: Plan, fwd_s: Sequence[float], bwd_s: Sequence[float],
                       send_s: Sequence[float] | None = None) -> float:
    """Makespan in seconds of one step. ``fwd_s``/``bwd_s`` per virtual stage and microbatch;
    ``send_s[s]`` the time to send stage s's output to stage s+1 (and its gradient back)."""
    schedule, send = _checked(plan, len(fwd_s), len(bwd_s), send_s)
    timed = list_schedule(schedule, lambda a: fwd_s[a.stage] if a.kind == "F" else bwd_s[a.stage], _hop(send))
    return max((rank[-1].end for rank in timed if rank), default=0.0)


def shared_host_run(plan: Plan, fwd: Sequence[Job], bwd: Sequence[Job], send_s: Sequence[float] | None = None,
                    host: HostModel | None = None) -> PipelineRun:
    """One step of the plan's schedule with per-stage forward / backward jobs on ``host``:
    where its ranks share the cores (``HostModel.shared``), each pipeline rank standing for its
    dp x tp identical peers as in the SimPy engine; else (GPUs, or None) every rank owns its
    device and a job takes its solo seconds."""
    schedule, send = _checked(plan, len(fwd), len(bwd), send_s)
    hop = _hop(send)
    if host is None or not host.shared:
        timed = list_schedule(schedule, lambda a: sum(fwd[a.stage] if a.kind == "F" else bwd[a.stage]), hop)
    else:
        timed = _processor_sharing(schedule, lambda a: fwd[a.stage] if a.kind == "F" else bwd[a.stage], hop,
                                   host, plan.world_size / plan.pp)
    durations: dict[tuple[str, int], list[float]] = {}
    for rank in timed:
        for t in rank:
            durations.setdefault((t.action.kind, t.action.stage), []).append(t.end - t.start)

    def mean(kind: str, stage: int) -> float:
        d = durations.get((kind, stage), [])
        return sum(d) / len(d) if d else 0.0
    stages = range(schedule.num_stages)
    return PipelineRun(step_time_s=max((rank[-1].end for rank in timed if rank), default=0.0),
                       fwd_s=tuple(mean("F", s) for s in stages), bwd_s=tuple(mean("B", s) for s in stages))


def _checked(plan: Plan, n_fwd: int, n_bwd: int, send_s):
    schedule = build_schedule_for_plan(plan)
    stages = schedule.num_stages
    if n_fwd != stages or n_bwd != stages:
        raise SpecError("stage_times", n_fwd, f"one time per virtual stage: {stages}")
    return schedule, (list(send_s) if send_s is not None else [0.0] * stages)


def _hop(send: list[float]):
    def hop(dep, dep_rank, action, rank) -> float:   # activation from s-1 or gradient from s+1
        return send[min(dep.stage, action.stage)] if dep.stage != action.stage else 0.0
    return hop


def _processor_sharing(schedule, job, hop, host: HostModel, ranks_per_job: float) -> list[list[TimedAction]]:
    """``list_schedule`` with every action a job on the host's processor sharing (a SimPy
    replay: the engine's sharing law, so both price a shared host alike)."""
    import simpy      # only shared CPU hosts replay on an event loop

    env = simpy.Environment()
    sharing = host.processor_sharing(env, ranks_per_job)
    present = {a for order in schedule.actions for a in order}
    done = {a: env.event() for a in present}
    end: dict = {}
    rank_of: dict = {}
    timed: list[list[TimedAction]] = [[] for _ in range(schedule.pp)]

    def rank_process(rank: int, order):
        for action in order:
            needs = dependencies(schedule, action, present)
            if needs:
                yield simpy.AllOf(env, [done[d] for d in needs])
                ready = max(end[d] + hop(d, rank_of[d], action, rank) for d in needs)
                if ready > env.now:
                    yield env.timeout(ready - env.now)
            start = env.now
            yield sharing.run(*job(action))
            end[action], rank_of[action] = env.now, rank
            timed[rank].append(TimedAction(action, rank, start, env.now))
            done[action].succeed()

    for rank, order in enumerate(schedule.actions):
        env.process(rank_process(rank, order))
    env.run()
    if len(end) != len(present):
        raise ScheduleError(schedule, "deadlock in the shared-host replay")
    return timed
