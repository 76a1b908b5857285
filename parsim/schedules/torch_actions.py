"""Conversion between the Schedule IR and ``torch.distributed.pipelining`` actions.

torch's ``_Action(stage_index, computation_type, microbatch_index, sub_actions)``
(schedules.py, torch 2.13) with ``_ComputationType`` F = FORWARD, B = FULL_BACKWARD,
I = BACKWARD_INPUT, W = BACKWARD_WEIGHT, SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD,
REDUCE_GRAD and OVERLAP_F_B -- the same strings as the IR's kinds, so the mapping is 1:1
(an overlapped slot is torch's ``_Action(-1, OVERLAP_F_B, None, (forward, backward))``).
torch is imported lazily: the rest of ``parsim.schedules`` must work without it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .ir import KINDS, OVERLAP_F_B, Action, Item, OverlapFB, Schedule

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.pipelining.schedules import _Action


def to_torch_actions(schedule: Schedule) -> dict[int, list["_Action"]]:
    """``{pp_rank: [torch _Action, ...]}`` in the rank's order (no ``None`` idle slots; torch's
    runtime waits on the send/recv instead): compute actions, and communication too when the
    schedule is lowered (``lowering.lower_schedule``)."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    def convert(item: Item) -> _Action:
        if item.kind == OVERLAP_F_B:
            return _Action(-1, _ComputationType.OVERLAP_F_B, None, tuple(convert(a) for a in item.sub_actions))
        return _Action(item.stage, _ComputationType(item.kind), item.microbatch)

    return {rank: [convert(a) for a in order] for rank, order in enumerate(schedule.actions)}


def from_torch_actions(pipeline_order: dict[int, list["_Action | None"]], *, name: str, pp: int,
                       num_microbatches: int, vpp: int = 1, with_comms: bool = False,
                       placement: tuple[int, ...] | None = None) -> Schedule:
    """A Schedule from a torch ``pipeline_order`` (or ``pipeline_order_with_comms``). Idle
    slots (``None``) are dropped, and so are the non-compute actions (send/recv,
    unshard/reshard, reduce_grad) unless ``with_comms``. The stage placement is read off the
    ranks that run each stage unless given (loop placement for stages that never appear)."""
    actions = []
    for rank in range(pp):
        order = []
        for a in pipeline_order.get(rank, []):
            if a is None:
                continue
            item = _from_torch(a)
            if with_comms or item.kind in KINDS or item.kind == OVERLAP_F_B:
                order.append(item)
        actions.append(tuple(order))
    if placement is None:
        placement = infer_placement(actions, pp, vpp)
    return Schedule(name=name, pp=pp, vpp=vpp, num_microbatches=num_microbatches, actions=tuple(actions),
                    placement=placement)


def infer_placement(actions, pp: int, vpp: int) -> tuple[int, ...]:
    """The rank of each of the pp * vpp stages: the rank that runs most of the stage's compute
    passes (the first such rank on a tie; any action counts for a stage no pass uses; loop
    placement for a stage nothing uses). For a consistent schedule this is the one rank that
    uses the stage, as torch's ``_validate_schedule`` infers it; for an inconsistent one it
    lets the checker point at the stray action."""
    votes: list[dict[int, int]] = [{} for _ in range(pp * vpp)]
    fallback: list[dict[int, int]] = [{} for _ in range(pp * vpp)]
    for rank, order in enumerate(actions):
        for item in order:
            for a in (item.sub_actions if item.kind == OVERLAP_F_B else (item,)):
                if isinstance(a.stage, int) and 0 <= a.stage < pp * vpp:
                    tally = votes if a.kind in KINDS else fallback
                    tally[a.stage][rank] = tally[a.stage].get(rank, 0) + 1
    placement = []
    for stage in range(pp * vpp):
        tally = votes[stage] or fallback[stage]
        placement.append(max(tally, key=tally.get) if tally else stage % pp)
    return tuple(placement)


def _from_torch(a) -> Item:
    kind = a.computation_type.value
    if kind == OVERLAP_F_B:
        forward, backward = (_from_torch(s) for s in a.sub_actions)
        return OverlapFB(forward, backward)
    return Action(kind, a.stage_index, a.microbatch_index)
