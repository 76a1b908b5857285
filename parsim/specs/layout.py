"""Rank layout: rank = (pp_rank * dp + dp_rank) * tp + tp_rank (TP fastest, PP slowest;
torchtitan / Megatron-LM / LiBai). Consecutive ranks fill a node. And the layer layout: how
many transformer layers each virtual stage holds (``stage_layers``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import ModelSpec
    from .plan import Plan


@dataclass(frozen=True)
class RankLayout:
    dp: int
    tp: int
    pp: int

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def rank(self, pp_rank: int, dp_rank: int, tp_rank: int) -> int:
        return (pp_rank * self.dp + dp_rank) * self.tp + tp_rank

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp_rank, dp_rank, tp_rank) of a global rank."""
        tp_rank = rank % self.tp
        dp_rank = (rank // self.tp) % self.dp
        pp_rank = rank // (self.tp * self.dp)
        return pp_rank, dp_rank, tp_rank

    def tp_groups(self) -> list[list[int]]:
        return [[self.rank(p, d, t) for t in range(self.tp)] for p in range(self.pp) for d in range(self.dp)]

    def dp_groups(self) -> list[list[int]]:
        return [[self.rank(p, d, t) for d in range(self.dp)] for p in range(self.pp) for t in range(self.tp)]

    def pp_groups(self) -> list[list[int]]:
        return [[self.rank(p, d, t) for p in range(self.pp)] for d in range(self.dp) for t in range(self.tp)]

    def stage_ranks(self, pp_rank: int) -> list[int]:
        """All ranks of one pipeline rank (its dp x tp block)."""
        return [self.rank(pp_rank, d, t) for d in range(self.dp) for t in range(self.tp)]

    def group_nodes(self, group: list[int], devices_per_node: int) -> int:
        """How many distinct nodes a group spans."""
        return len({r // devices_per_node for r in group})


def stage_layers(model: "ModelSpec", plan: "Plan") -> list[int]:
    """Transformer layers held by each virtual stage (explicit partition, or balanced:
    the remainder goes to the middle stages, since the first and last stages also hold the
    embedding and the output layer)."""
    stages = plan.pp * plan.vpp
    if plan.partition is not None:
        return list(plan.partition)
    base, rem = divmod(model.layers, stages)
    counts = [base] * stages
    # give extra layers to the stages farthest from both ends (they carry no embedding/logits)
    order = sorted(range(stages), key=lambda s: -min(s, stages - 1 - s))
    for s in order[:rem]:
        counts[s] += 1
    return counts
