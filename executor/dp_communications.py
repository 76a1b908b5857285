"""Data-parallel gradient all-reduce in buckets (PyTorch DDP's scheme, Li et al. 2020, VLDB:
"PyTorch Distributed", Sec. 3.2.3).

Gradients are packed into flat buckets of at most ``bucket_bytes``; a bucket's all-reduce is
launched asynchronously as soon as all of its gradients are final (their last microbatch's
backward has accumulated into ``.grad``), overlapping the rest of the backward pass. ``finish``
launches what is left, waits, averages over the replicas and copies back into ``.grad``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass(eq=False)
class GradientBucket:
    params: list[torch.nn.Parameter]
    ready: int = 0
    flat: torch.Tensor | None = None
    op: object = None   # timeline.AsyncOp

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)


def make_buckets(params: list[torch.nn.Parameter], bucket_bytes: int) -> list[GradientBucket]:
    """Consecutive runs of ``params`` of at most ``bucket_bytes`` (a larger parameter gets its own)."""
    buckets: list[GradientBucket] = []
    current: list[torch.nn.Parameter] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > bucket_bytes:
            buckets.append(GradientBucket(current))
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        buckets.append(GradientBucket(current))
    return buckets


@dataclass(eq=False)
class BucketAllReduce:
    """Launches and completes the all-reduce of gradient buckets over one DP group."""

    group: dist.ProcessGroup
    dp: int
    recorder: object
    launched: list[GradientBucket] = field(default_factory=list)

    def launch(self, bucket: GradientBucket) -> None:
        with self.recorder.memory.phase("other"):
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params]
            bucket.flat = torch.cat([g.reshape(-1) for g in grads])
        work = dist.all_reduce(bucket.flat, group=self.group, async_op=True)
        bucket.op = self.recorder.async_comm("dp", "dp_allreduce", bucket.flat.numel() * bucket.flat.element_size(),
                                             work, name=f"dp_allreduce {len(bucket.params)} grads")
        self.launched.append(bucket)

    def wait_all(self) -> None:
        for bucket in self.launched:
            bucket.op.wait()
            bucket.flat.div_(self.dp)
            offset = 0
            for p in bucket.params:
                n = p.numel()
                chunk = bucket.flat[offset:offset + n].view_as(p)
                if p.grad is None:
                    p.grad = chunk.clone()
                else:
                    p.grad.copy_(chunk)
                offset += n
            bucket.flat, bucket.op = None, None
        self.launched = []
