"""Step time of a pipeline whose stages take different times: a list-scheduling dry run of
the plan's Schedule IR (``parsim.schedules``) with per-stage forward/backward durations.

Each rank runs its actions in order, an action starting when its rank is free and its
dependencies (``parsim.schedules.dependencies``) are done, plus the send time of the
activation / gradient when the dependency ran on another rank. For 1F1B with equal stages
this gives the textbook (m + p - 1)(t_f + t_b) (Narayanan et al. 2021, Sec. 2.2.1); with
unequal stages the slowest stage sets the steady state (Merak, Lai et al. 2023, Sec. 4).
"""
from __future__ import annotations

from collections.abc import Sequence

from parsim.schedules import build_schedule_for_plan
from parsim.schedules.check import list_schedule
from parsim.specs import Plan, SpecError


def pipeline_step_time(plan: Plan, fwd_s: Sequence[float], bwd_s: Sequence[float],
                       send_s: Sequence[float] | None = None) -> float:
    """Makespan in seconds of one step. ``fwd_s``/``bwd_s`` per virtual stage and microbatch;
    ``send_s[s]`` the time to send stage s's output to stage s+1 (and its gradient back)."""
    schedule = build_schedule_for_plan(plan)
    stages = schedule.num_stages
    if len(fwd_s) != stages or len(bwd_s) != stages:
        raise SpecError("stage_times", len(fwd_s), f"one time per virtual stage: {stages}")
    send = list(send_s) if send_s is not None else [0.0] * stages

    def hop(dep, dep_rank, action, rank) -> float:   # activation from s-1 or gradient from s+1
        return send[min(dep.stage, action.stage)] if dep.stage != action.stage else 0.0

    timed = list_schedule(schedule, lambda a: fwd_s[a.stage] if a.kind == "F" else bwd_s[a.stage], hop)
    return max((rank[-1].end for rank in timed if rank), default=0.0)
