"""Pipeline parallelism: a small runtime that executes this rank's Schedule IR action list,
in exactly its order, with explicit messages (``pp_communications``).

``F s.j``: input = microbatch tokens (first stage) or the activation received from stage s-1
(handed over on the rank itself at a V's turn); run the stage; send the output to stage s+1,
or keep the loss (last stage).
``B s.j``: backward from the loss (last stage; scaled by ``loss_multiplier``) or from the
gradient received from stage s+1; send the input gradient to stage s-1.
``I s.j`` / ``W s.j`` (zero-bubble schedules): the input-gradient half first -- its gradient is
sent on at once -- and the weight-gradient half later (``split_backward``).
``(F;B)`` overlapped slot (DualPipeV): its forward, then its backward. On a CPU there is nothing
to overlap compute with but the other pass's collectives, which gloo runs synchronously; the
slot is the two passes back to back.

``before_backward(stage, last)`` runs just before each backward, ``last`` telling whether it is
the step's last backward of that stage (ZeRO-2 keeps FSDP's gathered parameters until then);
``on_backward_done(stage)`` after every pass that produced weight gradients (B, W) and
``on_weights(params)`` after a W, whose gradients torch adds into ``.grad`` without firing
autograd's accumulation hooks.

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
from parsim.schedules.ir import leaf_actions

from .data import Microbatch
from .model import StageModule
from .pp_communications import Message, PipelineP2P
from .split_backward import backward_input, backward_weight


class PipelineRuntime:
    def __init__(self, schedule: Schedule, pp_rank: int, chunks: dict[int, StageModule], p2p: PipelineP2P | None,
                 recorder, autocast: Callable[[], contextlib.AbstractContextManager],
                 on_backward_done: Callable[[int], None] | None = None,
                 before_backward: Callable[[int, bool], None] | None = None,
                 on_weights: Callable[[list[torch.nn.Parameter]], None] | None = None):
        self.after_action: Callable[[object], None] = lambda action: None   # fault-injection point
        # around every action's compute (inside its recorded span): an injected straggler
        self.compute_slowdown: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
        self.schedule = schedule
        self.pp_rank = pp_rank
        self.actions = schedule.actions[pp_rank]
        self.chunks = chunks
        self.p2p = p2p
        self.recorder = recorder
        self.autocast = autocast
        self.last_stage = schedule.num_stages - 1
        self.on_backward_done = on_backward_done or (lambda stage: None)
        self.before_backward = before_backward or (lambda stage, last: None)
        self.on_weights = on_weights or (lambda params: None)
        # index of each stage's last backward in the action list (interleaving: several stages)
        self.last_backward = {a.stage: i for i, item in enumerate(self.actions) for a in leaf_actions([item])
                              if a.kind in ("B", "I")}
        unsupported = {a.kind for item in self.actions for a in leaf_actions([item])} - {"F", "B", "I", "W"}
        if unsupported:
            raise NotImplementedError(f"actions {sorted(unsupported)} are not executed (the runtime implies "
                                      "sends, receives and gradient reductions)")

    def run(self, microbatches: list[Microbatch], loss_multiplier: float) -> list[float]:
        """Execute one step's actions; returns the microbatch losses if this rank holds the
        last stage (in microbatch order), else an empty list."""
        if self.p2p is not None:
            self.p2p.begin_step()
        self.stash: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.pending_w: dict[tuple[int, int], object] = {}       # (stage, microbatch) -> I's state for W
        self.local: dict[Message, torch.Tensor] = {}             # handed over at a V's turn
        self.losses: dict[int, float] = {}
        self.microbatches, self.loss_multiplier = microbatches, loss_multiplier
        for idx, item in enumerate(self.actions):
            for action in leaf_actions([item]):
                {"F": self._forward, "W": self._weight}.get(action.kind, self._backward)(action, idx)
            if self.p2p is not None:
                self.p2p.poll()
            self.after_action(item)
        if self.p2p is not None:
            self.p2p.finish_step()
        assert not self.stash and not self.pending_w, \
            f"actions left without backward: {sorted(self.stash)} {sorted(self.pending_w)}"
        return [float(self.losses[j]) for j in sorted(self.losses)]

    def _forward(self, action, idx: int) -> None:
        s, j = action.stage, action.microbatch
        x = self._input(Message("act", s - 1, j)) if s > 0 else self.microbatches[j].tokens
        if s > 0:
            x = x.float().requires_grad_()
        with self.recorder.action("F", s, j), self.compute_slowdown():
            with self.autocast():
                out = self.chunks[s](x, self.microbatches[j].targets if s == self.last_stage else None)
        if s == self.last_stage:
            self.losses[j] = out.detach()
        else:
            self._output(Message("act", s, j), out)
        self.stash[(s, j)] = (x, out)

    def _backward(self, action, idx: int) -> None:
        """B (full backward) or I (input gradients; W later)."""
        s, j = action.stage, action.microbatch
        x, out = self.stash.pop((s, j))
        grad = None if s == self.last_stage else self._input(Message("grad", s + 1, j)).float()
        self.before_backward(s, idx == self.last_backward[s])
        loss = out * self.loss_multiplier if grad is None else out
        with self.recorder.action(action.kind, s, j), self.compute_slowdown():
            if action.kind == "I":
                self.pending_w[(s, j)] = backward_input(loss, grad, x, self.chunks[s])
            elif grad is None:
                loss.backward()
            else:
                torch.autograd.backward(out, grad)
            if action.kind == "B":
                self.on_backward_done(s)
        if s > 0:
            self._output(Message("grad", s, j), x.grad)
        del x, out, loss

    def _weight(self, action, idx: int) -> None:
        s, j = action.stage, action.microbatch
        with self.recorder.action("W", s, j), self.compute_slowdown():
            params = backward_weight(self.pending_w.pop((s, j)), self.chunks[s])
            self.on_weights(params)
            self.on_backward_done(s)

    def _input(self, message: Message) -> torch.Tensor:
        local = self.local.pop(message, None)
        if local is not None:
            return local
        return self.p2p.recv(message)

    def _output(self, message: Message, tensor: torch.Tensor) -> None:
        if self.schedule.rank_of_stage(message.dst_stage()) == self.pp_rank:
            self.local[message] = tensor.detach()          # the next stage runs on this rank
        else:
            self.p2p.send(message, tensor)


def allreduce_tied_embedding_grads(chunks: dict[int, StageModule], num_stages: int, group, recorder) -> None:
    """Tied embeddings over a pipeline: the first stage's word embedding and the last stage's
    output layer are two copies of one matrix; summing their gradients over the embedding group
    (the pipeline ranks holding the first and the last stage) keeps them equal (Megatron-LM
    ``_allreduce_embedding_grads``); where one rank holds both (V-shaped placement) it sums them."""
    copies = []
    if 0 in chunks and chunks[0].embed is not None and not chunks[0].tied_locally:
        copies.append(chunks[0].embed.token_weight)
    last = chunks.get(num_stages - 1)
    if last is not None and last.head is not None and not last.tied_locally:
        copies.append(last.head.weight)
    grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in copies]
    if len(grads) == 2:
        with torch.no_grad():
            grads[0].add_(grads[1])
            grads[1].copy_(grads[0])
        return
    for g in grads:
        with recorder.comm("dp", "dp_allreduce", g.numel() * g.element_size(), name="tied embedding grads",
                           tensors=(g,)):
            dist.all_reduce(g, group=group)
