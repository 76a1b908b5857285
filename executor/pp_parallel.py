"""Pipeline parallelism: a small runtime that executes this rank's Schedule IR action list,
in exactly its order, with explicit messages (``pp_communications``).

``F s.j``: input = microbatch tokens (first stage) or the activation received from stage s-1;
run the stage; send the output to stage s+1, or keep the loss (last stage).
``B s.j``: backward from the loss (last stage; scaled by ``loss_multiplier``) or from the
gradient received from stage s+1; send the input gradient to stage s-1.

``before_backward(stage, last)`` runs just before each backward, ``last`` telling whether it is
the step's last backward of that stage (ZeRO-2 keeps FSDP's gathered parameters until then).

Loss scaling: each microbatch's mean token loss is multiplied by ``1 / num_microbatches``
(and the fp16 loss scale), so the accumulated gradient is the gradient of the mean loss of
the rank's batch; data parallelism then averages over replicas.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.distributed as dist

from parsim.schedules import Schedule

from .data import Microbatch
from .model import StageModule
from .pp_communications import Message, PipelineP2P


class PipelineRuntime:
    def __init__(self, schedule: Schedule, pp_rank: int, chunks: dict[int, StageModule], p2p: PipelineP2P | None,
                 recorder, autocast: Callable[[], contextlib.AbstractContextManager],
                 on_backward_done: Callable[[int], None] | None = None,
                 before_backward: Callable[[int, bool], None] | None = None):
        self.after_action: Callable[[object], None] = lambda action: None   # fault-injection point
        # around every action's compute (inside its recorded span): an injected straggler
        self.compute_slowdown: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
        self.schedule = schedule
        self.actions = schedule.actions[pp_rank]
        self.chunks = chunks
        self.p2p = p2p
        self.recorder = recorder
        self.autocast = autocast
        self.last_stage = schedule.num_stages - 1
        self.on_backward_done = on_backward_done or (lambda stage: None)
        self.before_backward = before_backward or (lambda stage, last: None)
        # index of each stage's last backward in the action list (interleaving: several stages)
        self.last_backward = {a.stage: i for i, a in enumerate(self.actions) if a.kind == "B"}
        unsupported = {a.kind for a in self.actions} - {"F", "B"}
        if unsupported:
            raise NotImplementedError(f"actions {sorted(unsupported)} (split backward) are not executed yet")

    def run(self, microbatches: list[Microbatch], loss_multiplier: float) -> list[float]:
        """Execute one step's actions; returns the microbatch losses if this rank holds the
        last stage (in microbatch order), else an empty list."""
        if self.p2p is not None:
            self.p2p.begin_step()
        stash: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        losses: dict[int, float] = {}
        for idx, action in enumerate(self.actions):
            s, j = action.stage, action.microbatch
            if action.kind == "F":
                x = self._forward_input(s, j, microbatches[j])
                with self.recorder.action("F", s, j), self.compute_slowdown():
                    with self.autocast():
                        out = self.chunks[s](x, microbatches[j].targets if s == self.last_stage else None)
                if s == self.last_stage:
                    losses[j] = out.detach()
                else:
                    self.p2p.send(Message("act", s, j), out)
                stash[(s, j)] = (x, out)
            else:
                x, out = stash.pop((s, j))
                grad = None if s == self.last_stage else self.p2p.recv(Message("grad", s + 1, j)).float()
                self.before_backward(s, idx == self.last_backward[s])
                with self.recorder.action("B", s, j), self.compute_slowdown():
                    if grad is None:
                        (out * loss_multiplier).backward()
                    else:
                        torch.autograd.backward(out, grad)
                    self.on_backward_done(s)
                if s > 0:
                    self.p2p.send(Message("grad", s, j), x.grad)
                del x, out
            if self.p2p is not None:
                self.p2p.poll()
            self.after_action(action)
        if self.p2p is not None:
            self.p2p.finish_step()
        assert not stash, f"actions left without backward: {sorted(stash)}"
        return [float(losses[j]) for j in sorted(losses)]

    def _forward_input(self, stage: int, j: int, microbatch: Microbatch) -> torch.Tensor:
        if stage == 0:
            return microbatch.tokens
        return self.p2p.recv(Message("act", stage - 1, j)).float().requires_grad_()


def allreduce_tied_embedding_grads(chunks: dict[int, StageModule], num_stages: int, group, recorder) -> None:
    """Tied embeddings over a pipeline: the first stage's word embedding and the last stage's
    output layer are two copies of one matrix; summing their gradients over the embedding group
    (first + last pipeline rank) keeps them equal (Megatron-LM ``_allreduce_embedding_grads``)."""
    copies = []
    if 0 in chunks and chunks[0].embed is not None and not chunks[0].tied_locally:
        copies.append(chunks[0].embed.token_weight)
    last = chunks.get(num_stages - 1)
    if last is not None and last.head is not None and not last.tied_locally:
        copies.append(last.head.weight)
    for p in copies:
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        with recorder.comm("dp", "dp_allreduce", g.numel() * g.element_size(), name="tied embedding grads"):
            dist.all_reduce(g, group=group)
