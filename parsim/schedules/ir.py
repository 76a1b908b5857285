"""The Schedule IR shared by the simulator and the executor (DESIGN.md, "The Schedule IR").

One ordered list of actions per pipeline rank. An action is ``(kind, stage, microbatch)``:
``kind`` is F (forward), B (full backward), or I (input-grad) / W (weight-grad) for
zero-bubble schedules; ``stage`` is the *virtual* stage index in ``range(pp * vpp)``.
Stage s runs on rank ``placement[s]``: by default the loop placement (rank r holds stages
r, r+pp, r+2pp, ...); V-shaped schedules (ZBV, DualPipeV) place stage s and stage
``2 pp - 1 - s`` on the same rank (the chunks go down the ranks and back up).

``OverlapFB(forward, backward)`` is one slot in which a forward and a backward of two
different stages run together (DualPipe's overlapped F&B chunk, DeepSeek-AI 2024, Sec 3.2.1;
torch's OVERLAP_F_B).

Sends and receives are implied by stage adjacency. ``parsim.schedules.lowering`` makes them
explicit in torch 2.13's vocabulary -- SEND_F / RECV_F / SEND_B / RECV_B (stage, microbatch)
and the per-stage UNSHARD / RESHARD (FSDP all-gather / free) and REDUCE_GRAD (data-parallel
gradient reduction), whose microbatch is None.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Union

from parsim.specs import SpecError

KINDS = ("F", "B", "I", "W")                               # compute kinds
COMM_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")      # point-to-point, per (stage, microbatch)
STAGE_KINDS = ("UNSHARD", "RESHARD", "REDUCE_GRAD")        # per stage, microbatch None
OVERLAP_F_B = "OVERLAP_F_B"
ALL_KINDS = KINDS + COMM_KINDS + STAGE_KINDS + (OVERLAP_F_B,)


class Action(NamedTuple):
    kind: str
    stage: int
    microbatch: int | None

    def __str__(self) -> str:
        if self.microbatch is None:
            return f"{self.kind}{self.stage}"
        return f"{self.kind}{self.stage}.{self.microbatch}"


class OverlapFB(NamedTuple):
    """A forward and a backward (B or I) of another stage in one overlapped slot."""

    forward: Action
    backward: Action

    @property
    def kind(self) -> str:
        return OVERLAP_F_B

    @property
    def sub_actions(self) -> tuple[Action, Action]:
        return (self.forward, self.backward)

    def __str__(self) -> str:
        return f"({self.forward};{self.backward})"


Item = Union[Action, OverlapFB]


def loop_placement(pp: int, vpp: int) -> tuple[int, ...]:
    """Stage s on rank s % pp (Megatron-LM interleaving; torch ``style="loop"``)."""
    return tuple(s % pp for s in range(pp * vpp))


def v_placement(pp: int, vpp: int) -> tuple[int, ...]:
    """Stages snake down and up the ranks: chunk c runs over ranks 0..pp-1 for even c and
    pp-1..0 for odd c, so rank r holds r and 2 pp - 1 - r for vpp = 2 (torch
    ``generate_stage_to_rank_mapping(style="v")``; Qi et al. 2023, Sec 6)."""
    return tuple(s % pp if (s // pp) % 2 == 0 else pp - 1 - s % pp for s in range(pp * vpp))


@dataclass(frozen=True)
class Schedule:
    """A generated (or user-written) pipeline schedule."""

    name: str
    pp: int
    vpp: int
    num_microbatches: int
    actions: tuple[tuple[Item, ...], ...]   # actions[pp_rank] = ordered actions of that rank
    placement: tuple[int, ...] | None = None   # rank of each virtual stage; None = loop placement

    def __post_init__(self) -> None:
        # one spelling for the default, so schedules compare equal however they were built
        if self.placement is not None:
            placement = tuple(self.placement)
            if placement == _loop_or_none(self.pp, self.vpp):
                placement = None
            object.__setattr__(self, "placement", placement)

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    def rank_of_stage(self, stage: int) -> int:
        return stage % self.pp if self.placement is None else self.placement[stage]

    def stages_of_rank(self, rank: int) -> list[int]:
        if self.placement is None:
            return [rank + v * self.pp for v in range(self.vpp)]
        return [s for s, r in enumerate(self.placement) if r == rank]

    @property
    def is_lowered(self) -> bool:
        """Whether sends/receives are explicit (the output of ``lowering.lower_schedule``)."""
        return any(a.kind in COMM_KINDS for order in self.actions for a in order)


class ScheduleError(SpecError):
    """A schedule that cannot run: a missing, duplicated or misplaced action, or a deadlock.
    ``rank`` and ``action`` locate the offending action when there is one (None otherwise)."""

    def __init__(self, schedule: Schedule, problem: str, *, rank: int | None = None, action: Item | None = None):
        super().__init__("schedule", schedule.name, problem)
        self.args = (schedule, problem)      # type(e)(*e.args) rebuilds it (SimPy re-raises that way)
        self.problem = problem
        self.rank = rank
        self.action = action


def _loop_or_none(pp, vpp) -> tuple[int, ...] | None:
    if not all(isinstance(x, int) and x >= 1 for x in (pp, vpp)):
        return None
    return loop_placement(pp, vpp)


def compute_items(order) -> list[Item]:
    """The compute items of one rank's order (F, B, I, W and overlapped F&B), in order."""
    return [a for a in order if a.kind in KINDS or a.kind == OVERLAP_F_B]


def leaf_actions(order):
    """Every Action of a rank's order with overlapped slots expanded into their F and B."""
    for item in order:
        if item.kind == OVERLAP_F_B:
            yield from item.sub_actions
        else:
            yield item
