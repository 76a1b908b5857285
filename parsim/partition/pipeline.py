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

from parsim.schedules import build_schedule_for_plan, dependencies
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
    present = {a for order in schedule.actions for a in order}
    end: dict = {}
    free_at = [0.0] * schedule.pp
    nxt = [0] * schedule.pp
    remaining = len(present)
    while remaining:
        progressed = False
        for rank, order in enumerate(schedule.actions):
            while nxt[rank] < len(order):
                action = order[nxt[rank]]
                needs = dependencies(schedule, action, present)
                if any(d not in end for d in needs):
                    break
                ready = [free_at[rank]]
                for d in needs:
                    hop = 0.0
                    if d.stage != action.stage:   # activation from s-1 or gradient from s+1
                        hop = send[min(d.stage, action.stage)]
                    ready.append(end[d] + hop)
                duration = fwd_s[action.stage] if action.kind == "F" else bwd_s[action.stage]
                end[action] = free_at[rank] = max(ready) + duration
                nxt[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:   # generated schedules are checked deadlock-free; defensive
            raise SpecError("schedule", plan.schedule, "a schedule that runs to completion")
    return max(free_at)
