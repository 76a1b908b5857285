"""Schedules with V-shaped stage placement: ZBV and DualPipeV (vpp = 2).

Rank r holds chunk 0 = stage r and chunk 1 = stage 2p - 1 - r (``ir.v_placement``): a
microbatch goes down the ranks through the first half of the model and back up through the
second, so the first and the last stage share rank 0 and the loss is computed where the
first backward starts.

* ``zbv``: ZB-V (Qi et al. 2023, arXiv:2401.10241, Sec 6), as torch 2.13 generates
  it (``ScheduleZBVZeroBubble``). Warm-up: 2(p-r)-1 chunk-0 forwards, then r pairs
  (F chunk 1, F chunk 0), then p-r triples (F, I, W of chunk 1); steady state
  (F0 I0 W0 F1 I1 W1) until every forward ran; cool-down: r pairs (I0, I1), p-r pairs
  (I0, W0), then the deferred W of chunk 1 and of chunk 0. It is planned for
  max(2p - 1, m) microbatches and the passes of microbatches >= m are dropped. Activation
  memory as 1F1B (p microbatches' worth per rank, in chunks of half a stage); zero bubble in
  the paper's sense when T_F = T_B = T_W.
* ``dualpipev``: the "cut-in-half" DualPipe (DeepSeek-AI 2024, DeepSeek-V3 technical report,
  arXiv:2412.19437, Sec 3.2.1; DeepSeek's open-source DualPipeV) as torch 2.13
  generates it (``ScheduleDualPipeV``, m >= 2p): eight phases per rank, the main one
  running the forward of one chunk overlapped with the backward of the other (``OverlapFB``);
  W is split off (zero-bubble) only for the second half of the last backwards, with rank
  parity choosing where the switch happens.
"""
from __future__ import annotations

from collections import defaultdict, deque

from .ir import Action, Item, OverlapFB


def zbv_order(rank: int, pp: int, m: int) -> list[Action]:
    """Rank ``rank``'s ZBV order (torch 2.13 ``ScheduleZBVZeroBubble``)."""
    chunk0, chunk1 = rank, 2 * pp - 1 - rank
    planned = max(2 * pp - 1, m)     # enough microbatches to fill the V; extras dropped below
    nxt: dict[tuple[str, int], int] = defaultdict(int)     # next microbatch per (kind, stage)
    order: list[Action] = []

    def emit(kind: str, stage: int) -> None:
        order.append(Action(kind, stage, nxt[kind, stage]))
        nxt[kind, stage] += 1

    for _ in range(2 * (pp - rank) - 1):
        emit("F", chunk0)
    for _ in range(rank):
        emit("F", chunk1)
        emit("F", chunk0)
    for _ in range(pp - rank):
        for kind in "FIW":
            emit(kind, chunk1)
    while nxt["F", chunk1] < nxt["F", chunk0] or nxt["F", chunk0] < planned:
        if nxt["F", chunk0] < planned:
            emit("F", chunk0)
        for kind in "IW":
            emit(kind, chunk0)
        for kind in "FIW":
            emit(kind, chunk1)
    for _ in range(rank):
        emit("I", chunk0)
        emit("I", chunk1)
    for _ in range(pp - rank):
        emit("I", chunk0)
        emit("W", chunk0)
    for stage in (chunk1, chunk0):          # the deferred weight gradients
        while nxt["W", stage] < nxt["I", stage]:
            emit("W", stage)
    return [a for a in order if a.microbatch < m]


def dualpipev_order(rank: int, pp: int, m: int) -> list[Item]:
    """Rank ``rank``'s DualPipeV order (torch 2.13 ``ScheduleDualPipeV``; needs m >= 2 pp)."""
    s0, s1 = rank, 2 * pp - 1 - rank
    nxt: dict[tuple[str, int], int] = defaultdict(int)   # next microbatch per (F or I/B, stage)
    pending_w: deque[Action] = deque()                    # W owed for each I, oldest first
    order: list[Item] = []

    def forward(stage: int) -> Action:
        nxt["F", stage] += 1
        return Action("F", stage, nxt["F", stage] - 1)

    def backward(stage: int, kind: str = "B") -> Action:
        nxt["I", stage] += 1        # B and I share one count: each microbatch gets one of them
        action = Action(kind, stage, nxt["I", stage] - 1)
        if kind == "I":
            pending_w.append(Action("W", stage, action.microbatch))
        return action

    def weight() -> None:
        if pending_w:
            order.append(pending_w.popleft())

    def overlapped(f_stage: int, b_stage: int) -> None:
        order.append(OverlapFB(forward(f_stage), backward(b_stage)))

    order += [forward(s0) for _ in range(2 * (pp - rank - 1))]          # 1: F0
    for _ in range(rank + 1):                                           # 2: F0 F1
        order += [forward(s0), forward(s1)]
    for _ in range(pp - rank - 1):                                      # 3: I1 W F1
        order.append(backward(s1, "I"))
        weight()
        order.append(forward(s1))
    for i in range(m - 2 * pp + rank + 1):                              # 4: F0&B1, F1&B0
        if i == 0 and rank == pp - 1:      # the last rank starts with F0 then B1, not overlapped
            order += [forward(s0), backward(s1)]
        else:
            overlapped(s0, s1)
        overlapped(s1, s0)
    for _ in range(pp - rank - 1):                                      # 5: B1, F1&B0
        order.append(backward(s1))
        overlapped(s1, s0)
    split = False                                                       # 6: B1 B0, split W halfway
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        order.append(backward(s1, "I" if split else "B"))
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        order.append(backward(s0, "I" if split else "B"))
    for _ in range(pp - rank - 1):                                      # 7: W, B0
        weight()
        order.append(backward(s0, "I" if split else "B"))
    for _ in range(rank + 1):                                           # 8: the remaining W
        weight()
    return order
