"""Dependencies between a schedule's actions, the list scheduler, the fixed-time dry run and
activation in-flight counts.

Dependencies (DESIGN.md, "The Schedule IR"): F(s, j) needs F(s-1, j); the gradient pass of
stage s (B, or I for zero-bubble schedules) needs F(s, j) and the gradient pass of stage s+1;
W(s, j) needs I(s, j). Stages are ordered by index whatever their placement, so a V-placed
F(p, j) needs F(p-1, j) on the same rank. Each rank runs its actions in its own order, one at
a time; an overlapped F&B slot starts when both passes could.

With explicit communication (``lowering``), a pass whose input comes from another rank waits
for its RECV (posted earlier on its own rank) and for the peer's SEND; SEND, RECV, UNSHARD,
RESHARD and REDUCE_GRAD take no time on the rank (posted, not waited on: torch 2.13's runtime
issues them as non-blocking ops and waits where the data is used).
"""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

from parsim.specs import SpecError

from .ir import OVERLAP_F_B, Action, Item, Schedule, ScheduleError, leaf_actions


@dataclass(frozen=True)
class TimedAction:
    action: Item
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


def present_actions(schedule: Schedule) -> set[Action]:
    """Every Action of the schedule, overlapped slots expanded."""
    return {a for order in schedule.actions for a in leaf_actions(order)}


def dependencies(schedule: Schedule, action: Item, present: set[Action]) -> list[Action]:
    """The actions ``action`` must wait for. ``present`` tells whether the gradient of a stage
    comes from a full backward (B) or an input-gradient pass (I), and whether sends and
    receives are explicit."""
    return [Action(*d) for d in dependency_keys(schedule, action, present)]


def dependency_keys(schedule: Schedule, action: Item, present: set[Action]) -> list[tuple]:
    """``dependencies`` as plain (kind, stage, microbatch) tuples (equal to the Actions and hashed
    alike; cheaper to build where graphs of 10^5 actions are walked)."""
    if action.kind == OVERLAP_F_B:
        inner = set(action.sub_actions)
        return [d for sub in action.sub_actions for d in dependency_keys(schedule, sub, present) if d not in inner]
    kind, s, j = action
    # membership is tested with plain tuples (equal to and hashed as the Action): cheaper
    if kind == "F":
        if s == 0:
            return []
        if ("RECV_F", s, j) in present:
            return [("RECV_F", s, j), ("SEND_F", s - 1, j)]
        return [("F", s - 1, j)]
    if kind == "W":
        return [("I", s, j)]
    if kind in ("B", "I"):
        if s == schedule.num_stages - 1:
            return [("F", s, j)]
        if ("RECV_B", s, j) in present:
            return [("F", s, j), ("RECV_B", s, j), ("SEND_B", s + 1, j)]
        return [("F", s, j), ("I" if ("I", s + 1, j) in present else "B", s + 1, j)]
    if kind == "SEND_F":
        return [("F", s, j)]
    if kind == "SEND_B":
        return [("I", s, j) if ("I", s, j) in present else ("B", s, j)]
    return []    # RECV_F, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD are posted without waiting


def dry_run(schedule: Schedule, t_f: float = 1.0, t_b: float = 2.0, t_comm: float = 0,
            t_w: float | None = None, t_i: float | None = None, t_fb: float | None = None) -> DryRun:
    """Run the schedule with fixed durations: every rank starts its next action as soon as the
    previous one ended and its dependencies are done (plus ``t_comm`` when a dependency ran on
    another rank). Times are per virtual-stage chunk; for interleaved pass the stage time / vpp.
    For zero-bubble actions, W takes ``t_w`` (default t_b / 2) and I takes ``t_i`` (default
    t_b - t_w): with the defaults F = I = W = 1 unit, the units of Qi et al. 2023's bubble
    analysis. An overlapped F&B slot takes ``t_fb`` (default t_f + t_b: no overlap gain).
    Exact with ``fractions.Fraction`` inputs. Raises ScheduleError on a deadlock."""
    for name, value in (("t_f", t_f), ("t_b", t_b), ("t_comm", t_comm), ("t_w", t_w), ("t_i", t_i),
                        ("t_fb", t_fb)):
        if value is not None and (not isinstance(value, Real) or value < 0):
            raise SpecError(name, value, "a non-negative number of seconds")
    t_w = t_b / 2 if t_w is None else t_w
    t_i = t_b - t_w if t_i is None else t_i
    t_fb = t_f + t_b if t_fb is None else t_fb
    duration = {"F": t_f, "B": t_b, "I": t_i, "W": t_w, OVERLAP_F_B: t_fb}
    zero = 0 * t_f
    timed = list_schedule(schedule, lambda a: duration.get(a.kind, zero),
                          lambda dep, rank_dep, action, rank: t_comm if rank_dep != rank else 0, zero=zero)
    busy = tuple(sum(t.end - t.start for t in rank) for rank in timed)
    makespan = max((max(t.end for t in rank) for rank in timed if rank), default=zero)
    return DryRun(makespan=makespan, busy_time=busy, timed_actions=tuple(tuple(r) for r in timed))


def list_schedule(schedule: Schedule, duration, hop, zero=0.0) -> list[list[TimedAction]]:
    """List-schedule the IR: each rank runs its actions in order, an action starting when its
    rank is free and every dependency has ended plus ``hop(dep, dep_rank, action, rank)`` (the
    transfer between them). ``duration(action)`` in seconds; ``zero`` sets the number type
    (a Fraction keeps exact arithmetic). Raises ScheduleError on a deadlock."""
    present = present_actions(schedule)
    end: dict[Action, float] = {}
    rank_of: dict[Action, int] = {}
    timed: list[list[TimedAction]] = [[] for _ in range(schedule.pp)]
    free_at = [zero] * schedule.pp
    nxt = [0] * schedule.pp
    remaining = sum(len(a) for a in schedule.actions)
    # A rank runs its actions in order until one needs an action not yet ended; it then waits
    # on that action and is woken when it ends (O(actions x dependencies) in all). Start times
    # depend only on dependencies' ends and the rank's own previous action, so the order in
    # which ranks are advanced does not change the result.
    waiting: dict[Action, list[int]] = {}
    ready_ranks = list(range(schedule.pp))
    while ready_ranks:
        rank = ready_ranks.pop()
        order = schedule.actions[rank]
        while nxt[rank] < len(order):
            action = order[nxt[rank]]
            needs = dependencies(schedule, action, present)
            missing = next((d for d in needs if d not in end), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(rank)
                break
            ready = [end[d] + hop(d, rank_of[d], action, rank) for d in needs]
            start = max([free_at[rank], *ready])
            finish = free_at[rank] = start + duration(action)
            for leaf in (action.sub_actions if action.kind == OVERLAP_F_B else (action,)):
                end[leaf] = finish
                rank_of[leaf] = rank
                ready_ranks.extend(waiting.pop(leaf, ()))
            timed[rank].append(TimedAction(action, rank, start, finish))
            nxt[rank] += 1
            remaining -= 1
    if remaining:
        raise ScheduleError(schedule, "deadlock in a dry run: " + _stuck(schedule, nxt, end, present))
    return timed


def peak_inflight_microbatches(schedule: Schedule) -> list[int]:
    """Per virtual stage: the most microbatches whose forward has run and whose backward
    (B, or W for zero-bubble) has not -- the multiplier on one microbatch's stored activations."""
    peaks = [0] * schedule.num_stages
    for order in schedule.actions:
        live = [0] * schedule.num_stages
        for kind, stage, _ in leaf_actions(order):
            live[stage] += _LIVE_STEP.get(kind, 0)
            peaks[stage] = max(peaks[stage], live[stage])
    return peaks


def peak_inflight_per_rank(schedule: Schedule) -> list[int]:
    """Per rank: the most (stage, microbatch) pairs alive at once over all of the rank's
    stages. Each pair holds one chunk (1/vpp of a rank's layers) of activations."""
    peaks = []
    for order in schedule.actions:
        live = peak = 0
        for kind, _, _ in leaf_actions(order):
            live += _LIVE_STEP.get(kind, 0)
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


# A forward stores a microbatch's activations; the pass that finishes its backward (B, or W
# after I) releases them. In an overlapped F&B slot the forward counts first.
_LIVE_STEP = {"F": 1, "B": -1, "W": -1}


def _stuck(schedule: Schedule, nxt: list[int], end: dict[Action, float], present: set[Action]) -> str:
    waits = []
    for rank, order in enumerate(schedule.actions):
        if nxt[rank] < len(order):
            action = order[nxt[rank]]
            missing = [str(d) for d in dependencies(schedule, action, present) if d not in end]
            waits.append(f"rank {rank} waits at {action} for {', '.join(missing)}")
    return "; ".join(waits)
