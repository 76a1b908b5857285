"""Checks on a Schedule: every action present once on the rank that holds its stage, every
dependency satisfiable in the rank's order, sends matched by receives, and no deadlock in a
unit-time dry run (``dryrun``). Each failure is one ScheduleError naming the action and rank.
"""
from __future__ import annotations

from dataclasses import dataclass

from .dryrun import (DryRun, TimedAction, dependencies, dry_run, list_schedule, peak_inflight_microbatches,
                     peak_inflight_per_rank, present_actions)
from .ir import (ALL_KINDS, COMM_KINDS, OVERLAP_F_B, STAGE_KINDS, Action, OverlapFB, Schedule, ScheduleError,
                 leaf_actions)

__all__ = ["ScheduleCheck", "ScheduleError", "check_schedule", "DryRun", "TimedAction", "dependencies", "dry_run",
           "list_schedule", "peak_inflight_microbatches", "peak_inflight_per_rank"]


@dataclass(frozen=True)
class ScheduleCheck:
    """What ``check_schedule`` learned about a schedule that passed."""

    name: str
    pp: int
    vpp: int
    num_microbatches: int
    num_actions: int
    unit_time_makespan: float            # dry run with t_f = 1, t_b = 2 (I = W = 1) per chunk
    unit_time_bubble_fraction: float
    peak_inflight_microbatches: tuple[int, ...]   # per virtual stage


def check_schedule(schedule: Schedule) -> ScheduleCheck:
    """Raise ScheduleError unless every action is present once, on the rank that holds its
    stage, after what it needs on its rank, with its sends and receives matched (when they are
    explicit), and the schedule runs to the end in a unit-time dry run (no deadlock)."""
    _check_shape(schedule)
    _check_items(schedule)
    _check_complete(schedule)
    if schedule.is_lowered:
        _check_comms(schedule)
    _check_same_rank_order(schedule)
    unit = dry_run(schedule, t_f=1, t_b=2)
    return ScheduleCheck(
        name=schedule.name, pp=schedule.pp, vpp=schedule.vpp,
        num_microbatches=schedule.num_microbatches,
        num_actions=sum(len(a) for a in schedule.actions),
        unit_time_makespan=unit.makespan, unit_time_bubble_fraction=unit.bubble_fraction,
        peak_inflight_microbatches=tuple(peak_inflight_microbatches(schedule)),
    )


def _check_shape(schedule: Schedule) -> None:
    for field in ("pp", "vpp", "num_microbatches"):
        value = getattr(schedule, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError(schedule, f"{field}={value!r} must be a positive integer")
    if len(schedule.actions) != schedule.pp:
        raise ScheduleError(schedule, f"has {len(schedule.actions)} action lists; needs one per rank, pp={schedule.pp}")
    placement = schedule.placement
    if placement is not None and (len(placement) != schedule.num_stages
                                  or any(not isinstance(r, int) or not 0 <= r < schedule.pp for r in placement)):
        raise ScheduleError(schedule, f"placement {list(placement)} must give a rank in 0..{schedule.pp - 1} "
                            f"for each of the {schedule.num_stages} stages")


def _check_items(schedule: Schedule) -> None:
    seen: set[Action] = set()
    for rank, order in enumerate(schedule.actions):
        for item in order:
            if item.kind == OVERLAP_F_B:
                if not (isinstance(item, OverlapFB) and item.forward.kind == "F" and item.backward.kind in ("B", "I")):
                    raise ScheduleError(schedule, f"overlapped slot {item} on rank {rank} must pair a forward (F) "
                                        "with a backward (B or I)", rank=rank, action=item)
                for sub in item.sub_actions:
                    _check_action(schedule, sub, rank, seen, item)
            else:
                _check_action(schedule, item, rank, seen, item)


def _check_action(schedule: Schedule, action, rank: int, seen: set[Action], item) -> None:
    def bad(problem: str) -> ScheduleError:
        return ScheduleError(schedule, f"action {action} on rank {rank}: {problem}", rank=rank, action=item)

    if not isinstance(action, Action) or action.kind not in ALL_KINDS or action.kind == OVERLAP_F_B:
        raise bad(f"kind must be one of {', '.join(k for k in ALL_KINDS if k != OVERLAP_F_B)}")
    kind, stage, j = action
    if not isinstance(stage, int) or not 0 <= stage < schedule.num_stages:
        raise bad(f"stage must be in 0..{schedule.num_stages - 1}")
    if kind in STAGE_KINDS:
        if j is not None:
            raise bad(f"{kind} acts on a whole stage and takes no microbatch")
    elif not isinstance(j, int) or not 0 <= j < schedule.num_microbatches:
        raise bad(f"microbatch must be in 0..{schedule.num_microbatches - 1}")
    if schedule.rank_of_stage(stage) != rank:
        raise ScheduleError(schedule, f"action {action} is on rank {rank} but stage {stage} lives on "
                            f"rank {schedule.rank_of_stage(stage)}", rank=rank, action=item)
    if kind in ("UNSHARD", "RESHARD"):
        return                      # a stage may be gathered and freed more than once
    if action in seen:
        raise ScheduleError(schedule, f"action {action} appears more than once", rank=rank, action=item)
    seen.add(action)


def _check_complete(schedule: Schedule) -> None:
    seen = present_actions(schedule)
    for s in range(schedule.num_stages):
        rank = schedule.rank_of_stage(s)
        for j in range(schedule.num_microbatches):
            f, b, i, w = (Action(k, s, j) in seen for k in "FBIW")
            if not f:
                raise ScheduleError(schedule, f"action {Action('F', s, j)} is missing", rank=rank)
            if b and (i or w):
                raise ScheduleError(schedule, f"stage {s} microbatch {j} has both B and I/W; use one or the other",
                                    rank=rank, action=Action("B", s, j))
            if not b and not (i and w):
                missing = Action("B", s, j) if not (i or w) else Action("W" if i else "I", s, j)
                raise ScheduleError(schedule, f"action {missing} is missing (microbatch {j} is never "
                                    f"fully backpropagated through stage {s})", rank=rank)


def _required_comms(schedule: Schedule) -> dict[Action, Action]:
    """Every send a schedule with explicit communication needs, mapped to its receive: one
    per microbatch for each pair of adjacent stages on different ranks, each direction."""
    pairs = {}
    last = schedule.num_stages - 1
    for s in range(last):
        if schedule.rank_of_stage(s) != schedule.rank_of_stage(s + 1):
            for j in range(schedule.num_microbatches):
                pairs[Action("SEND_F", s, j)] = Action("RECV_F", s + 1, j)
                pairs[Action("SEND_B", s + 1, j)] = Action("RECV_B", s, j)
    return pairs


def _check_comms(schedule: Schedule) -> None:
    present = {a for a in present_actions(schedule) if a.kind in COMM_KINDS}
    pairs = _required_comms(schedule)
    receives = {recv: send for send, recv in pairs.items()}
    rank = schedule.rank_of_stage
    for action in sorted(present, key=lambda a: (a.microbatch, a.stage, a.kind)):
        if action not in pairs and action not in receives:
            peer = action.stage + (1 if action.kind in ("SEND_F", "RECV_B") else -1)
            raise ScheduleError(schedule, f"{action} on rank {rank(action.stage)} has no peer: stage {peer} "
                                + ("does not exist" if not 0 <= peer < schedule.num_stages
                                   else "is on the same rank"), rank=rank(action.stage), action=action)
    for send, recv in pairs.items():
        if recv in present and send not in present:
            raise ScheduleError(schedule, f"{recv} on rank {rank(recv.stage)} has no matching {send} on rank "
                                f"{rank(send.stage)}", rank=rank(recv.stage), action=recv)
        if send in present and recv not in present:
            raise ScheduleError(schedule, f"{send} on rank {rank(send.stage)} has no matching {recv} on rank "
                                f"{rank(recv.stage)}", rank=rank(send.stage), action=send)
        if send not in present:
            raise ScheduleError(schedule, f"sends and receives are explicit but {send} (rank {rank(send.stage)}) "
                                f"and {recv} (rank {rank(recv.stage)}) are missing", rank=rank(send.stage))


def _check_same_rank_order(schedule: Schedule) -> None:
    """A dependency on the same rank must come earlier in that rank's order; a stage's
    REDUCE_GRAD comes after all of its weight gradients."""
    present = present_actions(schedule)
    for rank, order in enumerate(schedule.actions):
        position = {a: n for n, item in enumerate(order) for a in leaf_actions([item])}
        last_backward: dict[int, tuple[int, Action]] = {}
        for n, item in enumerate(order):
            for dep in dependencies(schedule, item, present):
                if position.get(dep, -1) > n:
                    raise ScheduleError(schedule, f"on rank {rank}, {item} comes before {dep}, which it needs",
                                        rank=rank, action=item)
            for a in leaf_actions([item]):
                if a.kind in ("B", "W"):
                    last_backward[a.stage] = (n, a)
        for n, item in enumerate(order):
            if item.kind == "REDUCE_GRAD" and last_backward.get(item.stage, (-1,))[0] > n:
                raise ScheduleError(schedule, f"on rank {rank}, {item} comes before {last_backward[item.stage][1]}, "
                                    "whose weight gradient it reduces", rank=rank, action=item)

