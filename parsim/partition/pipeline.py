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
from parsim.costs.split_backward import overlapped_time
from parsim.schedules import OVERLAP_F_B, build_schedule_for_plan
from parsim.schedules.check import ScheduleError, TimedAction, dependencies, list_schedule
from parsim.schedules.dryrun import present_actions
from parsim.schedules.ir import leaf_actions
from parsim.specs import Plan, SpecError

Job = tuple[float, float, float]          # (fixed, GEMM, memory-bound) solo seconds


# The weight-gradient share of a backward where the cost graph gives none: dX = dY W^T and
# dW = X^T dY of every GEMM have equal FLOPs (Narayanan et al. 2021, Sec. 5.1).
WEIGHT_SHARE = 0.5


@dataclass(frozen=True)
class PipelineRun:
    """One step's makespan and each virtual stage's mean forward / backward action duration (s)."""
    step_time_s: float
    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]


def pipeline_step_time(plan: Plan, fwd_s: Sequence[float], bwd_s: Sequence[float],
                       send_s: Sequence[float] | None = None, weight_share: float = WEIGHT_SHARE) -> float:
    """Makespan in seconds of one step. ``fwd_s``/``bwd_s`` per virtual stage and microbatch;
    ``send_s[s]`` the time to send stage s's output to stage s+1 (and its gradient back);
    ``weight_share`` of a backward is its weight-gradient pass W (split-backward schedules)."""
    schedule, send = _checked(plan, len(fwd_s), len(bwd_s), send_s)
    jobs = _jobs([(0.0, f, 0.0) for f in fwd_s], [(0.0, b, 0.0) for b in bwd_s], weight_share)
    timed = list_schedule(schedule, lambda a: sum(jobs(a)), _hop(send))
    return max((rank[-1].end for rank in timed if rank), default=0.0)


def shared_host_run(plan: Plan, fwd: Sequence[Job], bwd: Sequence[Job], send_s: Sequence[float] | None = None,
                    host: HostModel | None = None, weight_share: float = WEIGHT_SHARE,
                    send_bytes: Sequence[float] | None = None,
                    split_extra: Sequence[float] | None = None) -> PipelineRun:
    """One step of the plan's schedule with per-stage forward / backward jobs on ``host``:
    where its ranks share the cores (``HostModel.shared``), each pipeline rank standing for its
    dp x tp identical peers as in the SimPy engine; else (GPUs, or None) every rank owns its
    device and a job takes its solo seconds. ``weight_share``: ``_jobs``. ``send_bytes``: the
    bytes crossing each stage boundary (stage k to k + 1), for the messages' CPU on a shared
    host (``_with_messages``; None: their fixed part only). ``split_extra``: seconds each stage's
    split weight-gradient pass W costs beyond its ops (``costs.split_backward.
    split_weight_overhead``; None: nothing)."""
    schedule, send = _checked(plan, len(fwd), len(bwd), send_s)
    hop = _hop(send)
    jobs = _jobs(fwd, bwd, weight_share, split_extra)
    if host is None or not host.shared:
        timed = list_schedule(schedule, lambda a: _solo(a, jobs), hop)
    else:
        timed = _processor_sharing(schedule, _with_messages(jobs, plan, host, send_bytes), hop, host, plan)
    durations: dict[tuple[str, int], list[float]] = {}
    for rank in timed:
        for t in rank:
            if t.action.kind == OVERLAP_F_B:       # an overlapped slot's time, split by its solo jobs
                f, b = (sum(jobs(x)) for x in t.action.sub_actions)
                for x, share in zip(t.action.sub_actions, (f, b)):
                    durations.setdefault((x.kind, x.stage), []).append((t.end - t.start) * share / (f + b))
            else:
                durations.setdefault((t.action.kind, t.action.stage), []).append(t.end - t.start)

    def mean(kind: str, stage: int) -> float:
        d = durations.get((kind, stage), [])
        return sum(d) / len(d) if d else 0.0
    stages = range(schedule.num_stages)
    # a split backward's time is its I's and its W's
    return PipelineRun(step_time_s=max((rank[-1].end for rank in timed if rank), default=0.0),
                       fwd_s=tuple(mean("F", s) for s in stages),
                       bwd_s=tuple(mean("B", s) or mean("I", s) + mean("W", s) for s in stages))


def _jobs(fwd: Sequence[Job], bwd: Sequence[Job], weight_share: float, split_extra: Sequence[float] | None = None):
    """An action's (fixed, GEMM, memory-bound) job: F the stage's forward, B its backward, I and W
    its input- and weight-gradient parts (W ``weight_share`` of the GEMM and memory-bound work
    plus the split's own cost ``split_extra[stage]``, host work like the GEMMs'; the fixed part
    -- collectives -- with I; the first stage's I nothing and its W all, as in
    ``costs.split_backward``), an overlapped F&B slot both jobs (``_solo`` overlaps them)."""
    def job(a) -> Job:
        if a.kind == OVERLAP_F_B:
            f, b = (job(x) for x in a.sub_actions)
            return (f[0] + b[0], f[1] + b[1], f[2] + b[2])
        if a.kind == "F":
            return fwd[a.stage]
        fixed, gemm, membound = bwd[a.stage]
        if a.stage == 0 and a.kind in ("I", "W"):     # the first stage's W is its whole backward
            return bwd[0] if a.kind == "W" else (0.0, 0.0, 0.0)
        if a.kind == "I":
            return (fixed, gemm * (1 - weight_share), membound * (1 - weight_share))
        if a.kind == "W":
            extra = split_extra[a.stage] if split_extra is not None else 0.0
            return (0.0, gemm * weight_share + extra, membound * weight_share)
        return bwd[a.stage]
    return job


def _with_messages(jobs, plan: Plan, host: HostModel, send_bytes: Sequence[float] | None):
    """``jobs`` with each action's pipeline messages' CPU added to its GEMM-like work, as the
    SimPy engine adds it (``HostModel.action_message_seconds``; 0 with a core per rank)."""
    def nbytes(boundary: int) -> float:
        return send_bytes[boundary] if send_bytes is not None and 0 <= boundary < len(send_bytes) else 0.0

    def job(a) -> Job:
        fixed, gemm, membound = jobs(a)
        leaves = [(x.stage, x.kind) for x in (a.sub_actions if a.kind == OVERLAP_F_B else (a,))]
        return fixed, gemm + host.action_message_seconds(plan, leaves, nbytes), membound
    return job


def _solo(a, jobs) -> float:
    """Seconds of an action alone on its device; an overlapped F&B slot hides each pass's fixed
    (communication) part behind the other's compute (``costs.split_backward.overlapped_time``)."""
    if a.kind != OVERLAP_F_B:
        return sum(jobs(a))
    f, b = (jobs(x) for x in a.sub_actions)
    return overlapped_time(f[1] + f[2], f[0], b[1] + b[2], b[0])


def _checked(plan: Plan, n_fwd: int, n_bwd: int, send_s):
    schedule = build_schedule_for_plan(plan)
    stages = schedule.num_stages
    if n_fwd != stages or n_bwd != stages:
        raise SpecError("stage_times", n_fwd, f"one time per virtual stage: {stages}")
    return schedule, (list(send_s) if send_s is not None else [0.0] * stages)


def _hop(send: list[float]):
    def hop(dep, dep_rank, action, rank) -> float:   # activation from s-1 or gradient from s+1
        stage = next((a.stage for a in leaf_actions([action]) if abs(a.stage - dep.stage) == 1), dep.stage)
        return send[min(dep.stage, stage)] if dep.stage != stage else 0.0
    return hop


def _processor_sharing(schedule, job, hop, host: HostModel, plan: Plan) -> list[list[TimedAction]]:
    """``list_schedule`` with every action a job on the host's processor sharing (a SimPy
    replay: the engine's sharing law, so both price a shared host alike); an action whose input
    comes from another rank starts ``HostModel.message_hold`` late, and its rank is held for its
    send calls after it (``HostModel.action_send_hold``), as in the engine. Each pipeline rank
    stands for ``plan``'s dp x tp identical peers."""
    import simpy      # only shared CPU hosts replay on an event loop

    env = simpy.Environment()
    sharing, late = host.processor_sharing(env, plan.world_size / plan.pp), host.message_hold
    present = present_actions(schedule)          # leaves: an overlapped slot's forward and backward
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
                ready = max(ready, env.now) + (late if any(rank_of[d] != rank for d in needs) else 0.0)
                if ready > env.now:
                    yield env.timeout(ready - env.now)
            start = env.now
            yield sharing.run(*job(action))
            for leaf in leaf_actions([action]):
                end[leaf], rank_of[leaf] = env.now, rank
                done[leaf].succeed()
            timed[rank].append(TimedAction(action, rank, start, env.now))
            held = host.action_send_hold(plan, [(leaf.stage, leaf.kind) for leaf in leaf_actions([action])])
            if held:
                yield env.timeout(held)

    for rank, order in enumerate(schedule.actions):
        env.process(rank_process(rank, order))
    env.run()
    if len(end) != len(present):
        raise ScheduleError(schedule, "deadlock in the shared-host replay")
    return timed
