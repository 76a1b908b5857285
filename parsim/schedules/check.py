"""Checks on a Schedule: completeness, dependencies, a dry run, and activation in-flight counts.

Dependencies (DESIGN.md, "The Schedule IR"): F(s, j) needs F(s-1, j); the gradient pass of
stage s (B, or I for zero-bubble schedules) needs F(s, j) and the gradient pass of stage s+1;
W(s, j) needs I(s, j). Each rank runs its actions in its own order, one at a time.
"""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

from parsim.specs import SpecError

from .ir import KINDS, Action, Schedule


class ScheduleError(SpecError):
    """A schedule that cannot run: a missing, duplicated or misplaced action, or a deadlock."""

    def __init__(self, schedule: Schedule, problem: str):
        super().__init__("schedule", schedule.name, problem)
        self.problem = problem


@dataclass(frozen=True)
class TimedAction:
    action: Action
    rank: int
    start: float   # seconds from step start
    end: float


@dataclass(frozen=True)
class DryRun:
    """One step of a schedule with fixed per-chunk times (seconds)."""

    makespan: float                                     # seconds
    busy_time: tuple[float, ...]                        # per rank, seconds
    timed_actions: tuple[tuple[TimedAction, ...], ...]  # per rank, in that rank's order

    @property
    def bubble_fraction(self) -> float:
        """Idle share of pp x makespan: 1 - busy / (pp * makespan)."""
        # idle / total rather than 1 - busy / total: exact (correctly rounded) for integer and
        # Fraction times, so it compares equal to the textbook closed forms
        total = len(self.busy_time) * self.makespan
        return (total - sum(self.busy_time)) / total


@dataclass(frozen=True)
class ScheduleCheck:
    """What ``check_schedule`` learned about a schedule that passed."""

    name: str
    pp: int
    vpp: int
    num_microbatches: int
    num_actions: int
    unit_time_makespan: float            # dry run with t_f = 1, t_b = 2 per chunk
    unit_time_bubble_fraction: float
    peak_inflight_microbatches: tuple[int, ...]   # per virtual stage


def check_schedule(schedule: Schedule) -> ScheduleCheck:
    """Raise ScheduleError unless every action is present once, on the rank that holds its
    stage, and the schedule runs to the end in a unit-time dry run (no deadlock)."""
    _check_shape(schedule)
    _check_actions(schedule)
    _check_same_rank_order(schedule)
    unit = dry_run(schedule, t_f=1, t_b=2)
    return ScheduleCheck(
        name=schedule.name, pp=schedule.pp, vpp=schedule.vpp,
        num_microbatches=schedule.num_microbatches,
        num_actions=sum(len(a) for a in schedule.actions),
        unit_time_makespan=unit.makespan, unit_time_bubble_fraction=unit.bubble_fraction,
        peak_inflight_microbatches=tuple(peak_inflight_microbatches(schedule)),
    )


def dependencies(schedule: Schedule, action: Action, present: set[Action]) -> list[Action]:
    """The actions ``action`` must wait for. ``present`` tells whether the gradient of a stage
    comes from a full backward (B) or an input-gradient pass (I)."""
    kind, s, j = action
    last = schedule.num_stages - 1
    if kind == "F":
        return [Action("F", s - 1, j)] if s > 0 else []
    if kind == "W":
        return [Action("I", s, j)]
    needs = [Action("F", s, j)]
    if s < last:
        grad_from_next = Action("I", s + 1, j)
        needs.append(grad_from_next if grad_from_next in present else Action("B", s + 1, j))
    return needs


def dry_run(schedule: Schedule, t_f: float = 1.0, t_b: float = 2.0, t_comm: float = 0,
            t_w: float | None = None) -> DryRun:
    """Run the schedule with fixed durations: every rank starts its next action as soon as the
    previous one ended and its dependencies are done (plus ``t_comm`` when a dependency ran on
    another rank). Times are per virtual-stage chunk; for interleaved pass the stage time / vpp.
    For zero-bubble actions, W takes ``t_w`` (default t_b / 2) and I takes ``t_b - t_w``.
    Exact with ``fractions.Fraction`` inputs. Raises ScheduleError on a deadlock."""
    for name, value in (("t_f", t_f), ("t_b", t_b), ("t_comm", t_comm)):
        if not isinstance(value, Real) or value < 0:
            raise SpecError(name, value, "a non-negative number of seconds")
    t_w = t_b / 2 if t_w is None else t_w
    duration = {"F": t_f, "B": t_b, "I": t_b - t_w, "W": t_w}
    timed = list_schedule(schedule, lambda a: duration[a.kind],
                          lambda dep, rank_dep, action, rank: t_comm if rank_dep != rank else 0, zero=0 * t_f)
    busy = tuple(sum(t.end - t.start for t in rank) for rank in timed)
    makespan = max((rank[-1].end for rank in timed if rank), default=0 * t_f)
    return DryRun(makespan=makespan, busy_time=busy, timed_actions=tuple(tuple(r) for r in timed))


def list_schedule(schedule: Schedule, duration, hop, zero=0.0) -> list[list[TimedAction]]:
    """List-schedule the IR: each rank runs its actions in order, an action starting when its
    rank is free and every dependency has ended plus ``hop(dep, dep_rank, action, rank)`` (the
    transfer between them). ``duration(action)`` in seconds; ``zero`` sets the number type
    (a Fraction keeps exact arithmetic). Raises ScheduleError on a deadlock."""
    present = {a for rank in schedule.actions for a in rank}
    end: dict[Action, float] = {}
    rank_of: dict[Action, int] = {}
    timed: list[list[TimedAction]] = [[] for _ in range(schedule.pp)]
    free_at = [zero] * schedule.pp
    nxt = [0] * schedule.pp
    remaining = sum(len(a) for a in schedule.actions)
    while remaining:
        progressed = False
        for rank, order in enumerate(schedule.actions):
            while nxt[rank] < len(order):
                action = order[nxt[rank]]
                needs = dependencies(schedule, action, present)
                if any(d not in end for d in needs):
                    break
                ready = [end[d] + hop(d, rank_of[d], action, rank) for d in needs]
                start = max([free_at[rank], *ready])
                end[action] = free_at[rank] = start + duration(action)
                rank_of[action] = rank
                timed[rank].append(TimedAction(action, rank, start, end[action]))
                nxt[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ScheduleError(schedule, "deadlock in a dry run: " + _stuck(schedule, nxt, end, present))
    return timed


def peak_inflight_microbatches(schedule: Schedule) -> list[int]:
    """Per virtual stage: the most microbatches whose forward has run and whose backward
    (B, or W for zero-bubble) has not -- the multiplier on one microbatch's stored activations."""
    peaks = [0] * schedule.num_stages
    for order in schedule.actions:
        live = [0] * schedule.num_stages
        for kind, stage, _ in order:
            live[stage] += {"F": 1, "B": -1, "W": -1}.get(kind, 0)
            peaks[stage] = max(peaks[stage], live[stage])
    return peaks


def peak_inflight_per_rank(schedule: Schedule) -> list[int]:
    """Per rank: the most (stage, microbatch) pairs alive at once over all of the rank's
    stages. Each pair holds one chunk (1/vpp of a rank's layers) of activations."""
    peaks = []
    for order in schedule.actions:
        live = peak = 0
        for kind, _, _ in order:
            live += {"F": 1, "B": -1, "W": -1}.get(kind, 0)
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


# --- structural checks -----------------------------------------------------------------------

def _check_shape(schedule: Schedule) -> None:
    for field in ("pp", "vpp", "num_microbatches"):
        value = getattr(schedule, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError(schedule, f"{field}={value!r} must be a positive integer")
    if len(schedule.actions) != schedule.pp:
        raise ScheduleError(schedule, f"has {len(schedule.actions)} action lists; needs one per rank, pp={schedule.pp}")


def _check_actions(schedule: Schedule) -> None:
    seen: set[Action] = set()
    for rank, order in enumerate(schedule.actions):
        for action in order:
            kind, stage, j = action
            if kind not in KINDS:
                raise ScheduleError(schedule, f"action {action} on rank {rank}: kind must be one of {', '.join(KINDS)}")
            if not 0 <= stage < schedule.num_stages:
                raise ScheduleError(schedule, f"action {action} on rank {rank}: stage must be in 0..{schedule.num_stages - 1}")
            if not 0 <= j < schedule.num_microbatches:
                raise ScheduleError(schedule, f"action {action} on rank {rank}: microbatch must be in "
                                    f"0..{schedule.num_microbatches - 1}")
            if schedule.rank_of_stage(stage) != rank:
                raise ScheduleError(schedule, f"action {action} is on rank {rank} but stage {stage} lives on "
                                    f"rank {schedule.rank_of_stage(stage)}")
            if action in seen:
                raise ScheduleError(schedule, f"action {action} appears more than once")
            seen.add(action)
    for s in range(schedule.num_stages):
        for j in range(schedule.num_microbatches):
            f, b, i, w = (Action(k, s, j) in seen for k in "FBIW")
            if not f:
                raise ScheduleError(schedule, f"action {Action('F', s, j)} is missing")
            if b and (i or w):
                raise ScheduleError(schedule, f"stage {s} microbatch {j} has both B and I/W; use one or the other")
            if not b and not (i and w):
                missing = Action("B", s, j) if not (i or w) else Action("W" if i else "I", s, j)
                raise ScheduleError(schedule, f"action {missing} is missing")


def _check_same_rank_order(schedule: Schedule) -> None:
    """A dependency on the same rank must come earlier in that rank's order."""
    present = {a for rank in schedule.actions for a in rank}
    for rank, order in enumerate(schedule.actions):
        position = {a: n for n, a in enumerate(order)}
        for n, action in enumerate(order):
            for dep in dependencies(schedule, action, present):
                if position.get(dep, -1) > n:
                    raise ScheduleError(schedule, f"on rank {rank}, {action} comes before {dep}, which it needs")


def _stuck(schedule: Schedule, nxt: list[int], end: dict[Action, float], present: set[Action]) -> str:
    waits = []
    for rank, order in enumerate(schedule.actions):
        if nxt[rank] < len(order):
            action = order[nxt[rank]]
            missing = [str(d) for d in dependencies(schedule, action, present) if d not in end]
            waits.append(f"rank {rank} waits at {action} for {', '.join(missing)}")
    return "; ".join(waits)
