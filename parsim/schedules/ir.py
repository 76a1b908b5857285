"""The Schedule IR shared by the simulator and the executor (DESIGN.md, "The Schedule IR").

One ordered list of actions per pipeline rank. An action is ``(kind, stage, microbatch)``:
``kind`` is F (forward), B (full backward), or I (input-grad) / W (weight-grad) for
zero-bubble schedules; ``stage`` is the *virtual* stage index in ``range(pp * vpp)``, held by
rank ``stage % pp`` (loop placement: rank r holds stages r, r+pp, r+2pp, ...).
Sends and receives are implied by stage adjacency.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

KINDS = ("F", "B", "I", "W")


class Action(NamedTuple):
    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.stage}.{self.microbatch}"


@dataclass(frozen=True)
class Schedule:
    """A generated (or user-written) pipeline schedule."""

    name: str
    pp: int
    vpp: int
    num_microbatches: int
    actions: tuple[tuple[Action, ...], ...]   # actions[pp_rank] = ordered actions of that rank

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    def rank_of_stage(self, stage: int) -> int:
        return stage % self.pp

    def stages_of_rank(self, rank: int) -> list[int]:
        return [rank + v * self.pp for v in range(self.vpp)]
