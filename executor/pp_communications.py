"""Pipeline messages between stages: activations forward, their gradients backward.

Messages are implied by the Schedule IR: after ``F s.j`` (s not last) rank(s) sends the
activation of microbatch j to rank(s+1); after ``B s.j`` or ``I s.j`` (s not first) it sends the
input gradient to rank(s-1); an overlapped F&B slot sends both. Where the two stages share a rank
(the turn of a V-shaped placement) nothing is sent: the runtime hands the tensor over itself.
Sends are non-blocking (``isend``) and finish in the background.

Ordering, correct by construction for gloo and NCCL: both backends match point-to-point
messages between a pair in posting order, so a receiver posts its receives from a peer in
exactly the order that peer sends them (known from the peer's action list), lazily: when an
action needs message X, every not-yet-posted message from that peer up to X is posted first.
Messages to a higher pipeline rank travel on one process group and messages to a lower one on
another, so each NCCL pair communicator only carries traffic one way (``parallel_dims``).
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

import torch
import torch.distributed as dist

from parsim.schedules import Schedule
from parsim.schedules.ir import leaf_actions

from .parallel_dims import ParallelDims


class Message(NamedTuple):
    kind: str        # "act" (forward activation) or "grad" (gradient of it)
    src_stage: int
    microbatch: int

    def dst_stage(self) -> int:
        return self.src_stage + 1 if self.kind == "act" else self.src_stage - 1


def produced_messages(schedule: Schedule, action) -> list[Message]:
    """The messages an action's outputs make (an overlapped slot's forward's first), wherever
    they go."""
    last = schedule.num_stages - 1
    out = []
    for a in leaf_actions([action]):
        if a.kind == "F" and a.stage < last:
            out.append(Message("act", a.stage, a.microbatch))
        elif a.kind in ("B", "I") and a.stage > 0:
            out.append(Message("grad", a.stage, a.microbatch))
    return out


def outgoing_messages(schedule: Schedule, pp_rank: int) -> list[Message]:
    """The messages ``pp_rank`` sends to other ranks, in the order it sends them."""
    return [m for action in schedule.actions[pp_rank] for m in produced_messages(schedule, action)
            if schedule.rank_of_stage(m.dst_stage()) != pp_rank]


class PipelineP2P:
    def __init__(self, schedule: Schedule, dims: ParallelDims, shape: tuple[int, ...], dtype: torch.dtype, recorder):
        self.schedule = schedule
        self.dims = dims
        self.shape, self.dtype = shape, dtype
        self.recorder = recorder
        self.me = dims.pp_rank
        self._unposted: dict[int, deque[Message]] = {}
        self._posted: dict[Message, tuple[torch.Tensor, object, object]] = {}
        self._sends: list[tuple[object, torch.Tensor]] = []   # (AsyncOp, payload kept alive)

    def begin_step(self) -> None:
        self._unposted = {}
        for peer in range(self.schedule.pp):
            if peer == self.me:
                continue
            incoming = [m for m in outgoing_messages(self.schedule, peer)
                        if self.schedule.rank_of_stage(m.dst_stage()) == self.me]
            self._unposted[peer] = deque(incoming)
        self._posted = {}

    def _group(self, dst_pp_rank: int, src_pp_rank: int):
        return self.dims.p2p_up if dst_pp_rank > src_pp_rank else self.dims.p2p_down

    def send(self, message: Message, tensor: torch.Tensor) -> None:
        dst = self.schedule.rank_of_stage(message.dst_stage())
        payload = tensor.detach().to(self.dtype).contiguous()
        nbytes = payload.numel() * payload.element_size()
        # the event starts before the call: gloo's isend returned after the receiver already had
        # the message in 25 of 68 waited-for messages of a 4-rank interleaved pipeline (up to 4.4 ms)
        called = self.recorder.clock.mark()
        with self.recorder.memory.phase("other"):
            work = dist.isend(payload, dst=self.dims.pp_peer(dst), group=self._group(dst, self.me))
        op = self.recorder.async_comm("pp", "send", nbytes, work, start=called,
                                      name=f"send {message.kind} {message.src_stage}.{message.microbatch}")
        self._sends.append((op, payload))

    def poll(self) -> None:
        """Note completed sends and drop their buffers (called at every action boundary)."""
        self._sends = [(op, payload) for op, payload in self._sends if not op.is_completed()]

    def recv(self, message: Message) -> torch.Tensor:
        src = self.schedule.rank_of_stage(message.src_stage)
        queue = self._unposted[src]
        while message not in self._posted:
            nxt = queue.popleft()
            with self.recorder.memory.phase("other"):
                buf = torch.empty(self.shape, dtype=self.dtype, device=self.dims.device)
            work = dist.irecv(buf, src=self.dims.pp_peer(src), group=self._group(self.me, src))
            self._posted[nxt] = (buf, work, self.recorder.clock.mark())
        buf, work, _posted_at = self._posted.pop(message)
        nbytes = buf.numel() * buf.element_size()
        with self.recorder.comm("pp", "recv", nbytes, name=f"recv {message.kind} {message.src_stage}.{message.microbatch}"):
            work.wait()
        return buf

    def finish_step(self) -> None:
        for op, _payload in self._sends:
            op.wait()
        self._sends = []
        assert not self._posted and all(not q for q in self._unposted.values()), "unconsumed pipeline messages"
