"""Conversion between the Schedule IR and ``torch.distributed.pipelining`` compute actions.

torch's ``_Action(stage_index, computation_type, microbatch_index)`` (schedules.py, torch
2.13) with ``_ComputationType`` F = FORWARD, B = FULL_BACKWARD, I = BACKWARD_INPUT,
W = BACKWARD_WEIGHT -- the same letters as the IR, so the mapping is 1:1. torch is imported
lazily: the rest of ``parsim.schedules`` must work without it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .ir import KINDS, Action, Schedule

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.pipelining.schedules import _Action


def to_torch_actions(schedule: Schedule) -> dict[int, list["_Action"]]:
    """``{pp_rank: [torch _Action, ...]}`` holding only compute actions, in the rank's order
    (no ``None`` idle slots; torch's runtime waits on the implied send/recv instead)."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    return {
        rank: [_Action(a.stage, _ComputationType(a.kind), a.microbatch) for a in order]
        for rank, order in enumerate(schedule.actions)
    }


def from_torch_actions(pipeline_order: dict[int, list["_Action | None"]], *, name: str, pp: int,
                       num_microbatches: int, vpp: int = 1) -> Schedule:
    """A Schedule from a torch ``pipeline_order``; idle slots (``None``) and non-compute
    actions (send/recv, unshard/reshard, reduce_grad) are dropped."""
    actions = []
    for rank in range(pp):
        order = []
        for a in pipeline_order.get(rank, []):
            if a is None:
                continue
            kind = a.computation_type.value
            if kind in KINDS:
                order.append(Action(kind, a.stage_index, a.microbatch_index))
        actions.append(tuple(order))
    return Schedule(name=name, pp=pp, vpp=vpp, num_microbatches=num_microbatches, actions=tuple(actions))
