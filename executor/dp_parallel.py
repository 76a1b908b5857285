"""Data parallelism with DDP-style bucketed gradient all-reduce (``apply_ddp``).

Gradient accumulation: a parameter's gradient is final after the backward of the step's last
microbatch through its stage (``num_microbatches`` accumulations). A post-accumulate-grad hook
counts them and marks the parameter ready; a bucket whose parameters are all ready starts its
all-reduce at once when ``plan.dp_overlap`` is set (otherwise all buckets start after the last
backward). Buckets are formed per model chunk, in reverse parameter order -- roughly the order
in which backward produces the gradients (as in PyTorch DDP).
"""
from __future__ import annotations

import torch

from .dp_communications import BucketAllReduce, GradientBucket, make_buckets
from .model import StageModule


class DataParallelGradients:
    def __init__(self, chunks: list[StageModule], group, dp: int, bucket_bytes: int, overlap: bool,
                 accumulations: int, recorder):
        self.comm = BucketAllReduce(group=group, dp=dp, recorder=recorder)
        self.overlap = overlap
        self.accumulations = accumulations
        self.buckets: list[GradientBucket] = []
        self.bucket_of: dict[torch.nn.Parameter, GradientBucket] = {}
        self.count: dict[torch.nn.Parameter, int] = {}
        self._hooks = []
        for chunk in chunks:
            params = [p for p in chunk.parameters() if p.requires_grad]
            for bucket in make_buckets(list(reversed(params)), bucket_bytes):
                bucket.attach()
                self.buckets.append(bucket)
                for p in bucket.params:
                    self.bucket_of[p] = bucket
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._on_accumulated))

    def begin_step(self) -> None:
        """Zero the gradient buffers (Megatron-LM's ``zero_grad_buffer``) and re-attach the views."""
        self.count = {p: 0 for p in self.bucket_of}
        for bucket in self.buckets:
            bucket.ready = 0
            bucket.flat.zero_()
            bucket.views()

    def accumulated(self, params: list[torch.nn.Parameter]) -> None:
        """Gradients added into ``.grad`` without autograd's hooks (a split backward's W,
        ``split_backward``): counted as the hook would."""
        for p in params:
            if p in self.bucket_of:
                self._on_accumulated(p)

    def buffers(self) -> list[torch.Tensor]:
        return [b.flat for b in self.buckets]

    def _on_accumulated(self, p: torch.nn.Parameter) -> None:
        self.count[p] += 1
        if self.count[p] != self.accumulations:
            return
        bucket = self.bucket_of[p]
        bucket.ready += 1
        if self.overlap and bucket.ready == len(bucket.params):
            self.comm.launch(bucket)

    def finish(self) -> None:
        """Launch the buckets not started yet, wait for all, average over replicas."""
        started = {id(b) for b in self.comm.launched}
        for bucket in self.buckets:
            if id(bucket) not in started:
                self.comm.launch(bucket)
        self.comm.wait_all()


def apply_ddp(chunks: list[StageModule], group, dp: int, bucket_bytes: int, overlap: bool, accumulations: int,
              recorder) -> DataParallelGradients:
    """Attach bucketed gradient all-reduce to this rank's model chunks."""
    return DataParallelGradients(chunks, group, dp, bucket_bytes, overlap, accumulations, recorder)
