"""ParallelDims: the one object that knows the degrees, this rank's coordinates and every
process group of a plan (torchtitan's ``ParallelDims`` + picotron's process-group manager,
without a global singleton).

Rank layout (DESIGN.md): ``rank = (pp_rank * dp + dp_rank) * tp + tp_rank``, i.e. the
DeviceMesh ``("pp", "dp", "tp")`` over ``arange(world).view(pp, dp, tp)``.

Groups are created with ``dist.new_group(..., timeout=...)`` so that every collective honours
the executor's timeout (``init_device_mesh`` would give sub-groups torch's 30-minute default),
then assembled into the DeviceMesh with ``DeviceMesh.from_group``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from parsim.costs.placement import rank_of_stage
from parsim.specs import Plan, RankLayout

MESH_DIMS = ("pp", "dp", "tp")


@dataclass
class ParallelDims:
    """Degrees, coordinates and process groups of one rank."""

    dp: int
    tp: int
    pp: int
    rank: int
    device: torch.device
    mesh: DeviceMesh | None = None
    tp_group: dist.ProcessGroup | None = None
    dp_group: dist.ProcessGroup | None = None
    pp_group: dist.ProcessGroup | None = None
    embedding_group: dist.ProcessGroup | None = None  # first + last pipeline rank (tied embeddings)
    p2p_up: dist.ProcessGroup | None = None     # pipeline messages to a higher pp rank
    p2p_down: dist.ProcessGroup | None = None   # pipeline messages to a lower pp rank
    world_group: dist.ProcessGroup | None = None
    layout: RankLayout = field(init=False)

    def __post_init__(self) -> None:
        self.layout = RankLayout(dp=self.dp, tp=self.tp, pp=self.pp)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def coords(self) -> tuple[int, int, int]:
        return self.layout.coords(self.rank)

    @property
    def pp_rank(self) -> int:
        return self.coords[0]

    @property
    def dp_rank(self) -> int:
        return self.coords[1]

    @property
    def tp_rank(self) -> int:
        return self.coords[2]

    def pp_peer(self, pp_rank: int) -> int:
        """Global rank of the same (dp, tp) position on pipeline rank ``pp_rank``."""
        return self.layout.rank(pp_rank, self.dp_rank, self.tp_rank)

    def dp_peer(self, dp_rank: int) -> int:
        return self.layout.rank(self.pp_rank, dp_rank, self.tp_rank)

    def dp_mesh(self) -> DeviceMesh:
        assert self.mesh is not None
        return self.mesh["dp"]


def build_parallel_dims(plan: Plan, rank: int, device: torch.device, timeout_s: float) -> ParallelDims:
    """Create every process group of ``plan`` (all ranks must call this, in the same order)."""
    dims = ParallelDims(dp=plan.dp, tp=plan.tp, pp=plan.pp, rank=rank, device=device)
    if dist.get_world_size() != dims.world_size:
        raise RuntimeError(f"world size {dist.get_world_size()} != dp*tp*pp = {dims.world_size}")
    timeout = timedelta(seconds=timeout_s)
    layout = dims.layout

    def mine(groups: list[list[int]]) -> dist.ProcessGroup | None:
        found = None
        for ranks in groups:   # every rank creates every group, in the same order
            group = dist.new_group(ranks, timeout=timeout)
            if rank in ranks:
                found = group
        return found

    dims.pp_group = mine(layout.pp_groups())
    dims.dp_group = mine(layout.dp_groups())
    dims.tp_group = mine(layout.tp_groups())
    everyone = list(range(dims.world_size))
    dims.world_group = dist.new_group(everyone, timeout=timeout)
    # Two world groups for pipeline p2p, one per direction: on NCCL every pair communicator then
    # carries traffic one way only, so a send can never queue ahead of a receive on the same
    # stream (the classic 1F1B deadlock); gloo does not need it but runs the same code.
    dims.p2p_up = dist.new_group(everyone, timeout=timeout)
    dims.p2p_down = dist.new_group(everyone, timeout=timeout)
    head = rank_of_stage(plan, plan.pp * plan.vpp - 1)       # the output layer's pipeline rank
    if plan.pp > 1 and head != 0:        # (a V-shaped placement keeps both ends on rank 0: no group)
        ends = [[layout.rank(0, d, t), layout.rank(head, d, t)] for d in range(plan.dp) for t in range(plan.tp)]
        dims.embedding_group = mine(ends)
    mesh = torch.arange(dims.world_size).view(plan.pp, plan.dp, plan.tp)
    dims.mesh = DeviceMesh.from_group([dims.pp_group, dims.dp_group, dims.tp_group], device.type,
                                      mesh=mesh, mesh_dim_names=MESH_DIMS)
    return dims
