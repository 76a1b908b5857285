"""Schedules timed by their action graph: the split-backward family and looped BFS.

Their step has no closed form over unequal stages (the zero-bubble forms of ``schedules.bubbles``
hold for equal pass times only), so the fast path plays their Schedule IR: each action starts
when its rank is free and its inputs have arrived (``schedules.dependencies``: the previous
stage's forward, the next stage's input gradient; the pass a rank runs before it), exactly the
list scheduling of the SimPy engine and ``schedules.dry_run``, here over a table of nodes in an
order where every node comes after what it waits for. Each node's duration comes from the plan's
per-layer rows (``fast.split_timing``), so one graph serves every plan of its
(schedule, pp, microbatches, vpp) key.

Long steps are not played in full: past a few pipeline depths of microbatches a rank's
actions repeat with one microbatch's worth of work per period, so the graph of
``canonical_microbatches`` is played and the rest added at the steady-state period
(``fast.split_timing``). tests/test_fast_split.py holds the extrapolation to the full graph
(exact for stages of equal cost, and for the first and last stage carrying the embedding / head).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from parsim.schedules import OVERLAP_F_B, Action, cached_schedule
from parsim.schedules.dryrun import dependency_keys, present_actions

# node kinds
K_F, K_B, K_I, K_W, K_FB = range(5)
KIND_CODE = {"F": K_F, "B": K_B, "I": K_I, "W": K_W}
# node table columns: kind, pipeline rank, chunk (the forward's for an overlapped slot), the
# overlapped slot's backward chunk and kind, and the (at most two) nodes it waits for that run
# on another rank or come through a V's turn (-1: none)
N_KIND, N_RANK, N_CHUNK, N_CHUNK_B, N_KIND_B, N_DEP0, N_DEP1, N_WIDTH = range(8)

# Steps of at least this many pipeline depths of microbatches are played at this many
# (tests/test_fast_split.py): the ramp-up and the drain fit, and the steady state has settled.
DEPTHS = 3


def canonical_microbatches(schedule: str, pp: int, m: int, vpp: int) -> int:
    """The microbatch count whose graph is played for ``m`` (at most ``DEPTHS`` pp): the same
    warm-up and cool-down, fewer steady-state periods. interleaved-zb keeps its round size
    (torch 2.13: max(1, m // pp) rounds of m / rounds), so it is cut at a whole number of rounds
    that keeps that size, or played in full."""
    if m <= DEPTHS * pp:
        return m
    if schedule != "interleaved-zb":
        return DEPTHS * pp
    rounds = m // pp
    per_round = m // rounds
    k = min(rounds, DEPTHS)
    while k > 1 and (per_round * k) // pp != k:
        k -= 1
    return per_round * k if (per_round * k) // pp == k and k >= min(rounds, DEPTHS) else m


@lru_cache(maxsize=1024)
def schedule_graph(schedule: str, pp: int, m: int, vpp: int) -> np.ndarray:
    """The node table (``N_*`` columns) of one schedule, nodes in an order where each comes after
    the nodes it waits for and after the rank's previous node (Kahn's topological order over the
    ranks' orders and the dependencies between ranks)."""
    s = cached_schedule(schedule, pp, m, vpp)
    present = present_actions(s)
    chunk = {st: c for r in range(pp) for c, st in enumerate(s.stages_of_rank(r))}
    # number the nodes rank by rank; every leaf action knows its node
    node_of: dict[Action, int] = {}
    items, rank_of = [], []
    for r, order in enumerate(s.actions):
        for item in order:
            for leaf in (item.sub_actions if item.kind == OVERLAP_F_B else (item,)):
                node_of[leaf] = len(items)
            items.append(item)
            rank_of.append(r)
    n = len(items)
    waits = [[node_of[d] for d in dependency_keys(s, item, present)] for item in items]
    waits = [[d for d in dict.fromkeys(w) if rank_of[d] != rank_of[i]] for i, w in enumerate(waits)]
    # successors: the next node of the rank, and the nodes of other ranks waiting on it
    follows: list[list[int]] = [[] for _ in range(n)]
    pending = [len(w) for w in waits]
    for i in range(n - 1):
        if rank_of[i + 1] == rank_of[i]:
            follows[i].append(i + 1)
            pending[i + 1] += 1
    for i, w in enumerate(waits):
        for d in w:
            follows[d].append(i)
    ready = [i for i in range(n) if pending[i] == 0]
    order: list[int] = []
    while ready:
        i = ready.pop()
        order.append(i)
        for j in follows[i]:
            pending[j] -= 1
            if not pending[j]:
                ready.append(j)
    if len(order) != n:
        raise ValueError(f"{schedule} pp={pp} m={m} vpp={vpp}: the schedule's actions wait on each other in a cycle")
    position = {i: k for k, i in enumerate(order)}
    rows = [_row(items[i], rank_of[i], chunk, [position[d] for d in waits[i]]) for i in order]
    return np.array(rows, dtype=np.int64).reshape(-1, N_WIDTH)


def _row(item, rank: int, chunk: dict[int, int], waits: list[int]) -> list[int]:
    """A node's row (``N_*`` columns). Only the nodes of other ranks it waits for are kept (at
    most two: an overlapped slot's forward input and backward gradient); the rank runs its own
    nodes in order, so what it ran before has ended."""
    if item.kind == OVERLAP_F_B:
        f, b = item.sub_actions
        row = [K_FB, rank, chunk[f.stage], chunk[b.stage], KIND_CODE[b.kind]]
    else:
        row = [KIND_CODE[item.kind], rank, chunk[item.stage], chunk[item.stage], KIND_CODE[item.kind]]
    return row + (waits + [-1, -1])[:2]
