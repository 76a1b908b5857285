"""Data-parallel gradient all-reduce in buckets (PyTorch DDP's scheme, Li et al. 2020, VLDB:
"PyTorch Distributed", Sec. 3.2.3).

Gradients live in flat buckets of at most ``bucket_bytes``: each parameter's ``.grad`` is a view
into its bucket's persistent buffer, so backward accumulates straight into the buffer that is
all-reduced (DDP's ``gradient_as_bucket_view=True``; Megatron-LM's contiguous gradient buffer)
and no second copy of the gradients exists. A bucket's all-reduce is launched asynchronously as
soon as all of its gradients are final (their last microbatch's backward has accumulated into
``.grad``), overlapping the rest of the backward pass. ``finish`` launches what is left, waits
and averages over the replicas in place.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass(eq=False)
class GradientBucket:
    params: list[torch.nn.Parameter]
    ready: int = 0
    flat: torch.Tensor | None = None   # the persistent gradient buffer (``attach``)
    op: object = None   # timeline.AsyncOp

    def attach(self) -> None:
        """Allocate the bucket's buffer and make every parameter's ``.grad`` a view into it."""
        p0 = self.params[0]
        self.flat = torch.zeros(sum(p.numel() for p in self.params), dtype=p0.dtype, device=p0.device)
        self.views()

    def views(self) -> None:
        """(Re)point every ``.grad`` at its slice of the buffer (after ``zero_grad(set_to_none)``)."""
        offset = 0
        for p in self.params:
            p.grad = self.flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

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
        work = dist.all_reduce(bucket.flat, group=self.group, async_op=True)
        bucket.op = self.recorder.async_comm("dp", "dp_allreduce", bucket.flat.numel() * bucket.flat.element_size(),
                                             work, name=f"dp_allreduce {len(bucket.params)} grads")
        self.launched.append(bucket)

    def wait_all(self) -> None:
        for bucket in self.launched:
            bucket.op.wait()
            bucket.flat.div_(self.dp)
            bucket.op = None
        self.launched = []
