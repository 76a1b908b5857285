"""ZeRO (Rajbhandari et al. 2020) over the data-parallel group.

* Stage 1 (``ZeroOneAdamW``, P_os): gradients are all-reduced as in plain DP; each replica
  keeps AdamW state only for the parameters it owns (a greedy, size-balanced partition of
  whole parameters, like torch's ``ZeroRedundancyOptimizer``), updates them, and then every
  owner broadcasts its updated parameters to the others in flat buffers of at most
  ``dp_bucket_bytes``.
* Stages 2 and 3 (``apply_fsdp``): FSDP2 ``fully_shard`` per transformer layer and per model
  chunk, over the mesh's ``dp`` dimension. Gradients are reduce-scattered unit by unit in every
  microbatch's backward and accumulated as 1/dp shards; optimizer state is sharded.
* ZeRO-2 (P_os+g, Rajbhandari et al. 2020 Sec. 5.2; DeepSpeed stage 2): the parameters are
  replicated for the whole step. At rest between steps they are FSDP shards; the step's first
  forward all-gathers each unit once (``reshard_after_forward=False``), and they stay gathered
  across the gradient accumulation (``set_reshard_after_backward(False)``) until the stage's
  last backward of the step, which reshards them for the sharded optimizer step
  (``build.build_training`` -> ``PipelineRuntime.before_backward``). Per step: one all-gather
  per unit, one reduce-scatter per unit and microbatch.
* ZeRO-3 (P_os+g+p, Sec. 5.3): the parameters are freed after forward and gathered again in
  backward (``reshard_after_forward=True``), every microbatch.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .dp_communications import make_buckets
from .model import StageModule
from .optimizer import make_adamw


def partition_parameters(params: list[torch.nn.Parameter], dp: int) -> list[int]:
    """Owner replica of each parameter: largest first onto the least-loaded replica."""
    load = [0] * dp
    owner = [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: (-params[i].numel(), i)):
        r = min(range(dp), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += params[i].numel()
    return owner


class ZeroOneAdamW:
    """AdamW with optimizer state sharded over the DP group (ZeRO stage 1)."""

    def __init__(self, params: list[torch.nn.Parameter], group, dp_rank: int, dp_peers: list[int], recorder,
                 bucket_bytes: int):
        self.params = params
        self.bucket_bytes = bucket_bytes
        self.group = group
        self.dp_rank = dp_rank
        self.dp_peers = dp_peers          # global rank of each DP replica
        self.recorder = recorder
        self.owner = partition_parameters(params, len(dp_peers))
        self.owned = [p for p, o in zip(params, self.owner) if o == dp_rank]
        self.inner = make_adamw(self.owned) if self.owned else None
        self.state = self.inner.state if self.inner is not None else {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        if self.inner is not None:
            self.inner.step()
        for r, src in enumerate(self.dp_peers):
            mine = [p for p, o in zip(self.params, self.owner) if o == r]
            # one flat buffer of at most ``bucket_bytes`` in flight at a time (the simulator's
            # one parameter bucket in ``costs.memory``), freed before the next is built
            for bucket in make_buckets(mine, self.bucket_bytes):
                with self.recorder.memory.phase("other"):
                    flat = torch.cat([p.detach().reshape(-1) for p in bucket.params])
                with self.recorder.comm("dp", "dp_allgather", flat.numel() * flat.element_size(),
                                        name=f"zero1 params of dp{r}", tensors=(flat,)):
                    dist.broadcast(flat, src=src, group=self.group)
                if r != self.dp_rank:
                    offset = 0
                    with torch.no_grad():
                        for p in bucket.params:
                            p.copy_(flat[offset:offset + p.numel()].view_as(p))
                            offset += p.numel()
                del flat


def apply_fsdp(chunk: StageModule, dp_mesh, reshard_after_forward: bool, recorder=None) -> None:
    """Shard ``chunk`` over the DP mesh dimension: one FSDP unit per layer, one for the rest.
    With a recorder, FSDP's all-gathers and reduce-scatters appear on the ``dp`` stream."""
    from torch.distributed.fsdp import fully_shard   # heavy import (DTensor), only when used

    units = [(int(i), block) for i, block in chunk.layers.items()]
    for _, block in units:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(chunk, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    if recorder is not None:
        for layer, unit in units + [(-1, chunk)]:
            all_gather, reduce_scatter = recorded_fsdp_comms(recorder, layer)
            unit.set_custom_all_gather(all_gather)
            unit.set_custom_reduce_scatter(reduce_scatter)


def recorded_fsdp_comms(recorder, layer: int):
    """FSDP2's default collectives, timed into the step recorder (FSDP's comm-hook API)."""
    def timed(kind: str, output: torch.Tensor, async_op: bool, launch, buffers):
        nbytes = output.numel() * output.element_size()
        if not async_op:
            with recorder.comm("dp", kind, nbytes, layer=layer, tensors=buffers):
                return launch()
        work = launch()   # FSDP waits for it itself; the event ends when the work completes
        recorder.async_comm("dp", kind, nbytes, work, name=kind, layer=layer, watch=False)
        return work

    return fsdp_comm_hooks(timed)


def fsdp_comm_hooks(timed):
    """FSDP2's default all-gather and reduce-scatter (its comm-hook API: ``set_custom_all_gather``
    / ``set_custom_reduce_scatter``), each call passed through ``timed(kind, tensor, async_op,
    launch, buffers)``: ``kind`` "zero_allgather" or "zero_reducescatter", the tensor whose bytes
    it moves (the gathered output, the scattered input), ``launch()`` the default call,
    ``buffers`` both tensors of the call; returns what ``timed`` returns. The executor records
    them (``recorded_fsdp_comms``), the calibration times them (``calibration.sharded``)."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    class TimedAllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            return timed("zero_allgather", output_tensor, async_op,
                         lambda: super(TimedAllGather, self).__call__(output_tensor, input_tensor, group, async_op),
                         (output_tensor, input_tensor))

    class TimedReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            return timed("zero_reducescatter", input_tensor, async_op,
                         lambda: super(TimedReduceScatter, self).__call__(output_tensor, input_tensor, group, op,
                                                                          async_op),
                         (output_tensor, input_tensor))

    return TimedAllGather(), TimedReduceScatter()
