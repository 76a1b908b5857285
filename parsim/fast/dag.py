"""Schedules timed by their action graph: the split-backward family, looped BFS, and interleaved
1F1B over model chunks of different layer counts (``timed_by_graph``).

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

import numba
import numpy as np

from parsim.schedules import OVERLAP_F_B, Action, cached_schedule
from parsim.schedules.dryrun import dependency_keys, present_actions
from parsim.specs.codes import INTERLEAVED, ZB_H1

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


def timed_by_graph(schedule: np.ndarray, pp: np.ndarray, vpp: np.ndarray, layers: int) -> np.ndarray:
    """Per plan (schedule codes ``specs.codes``, pipeline sizes): is it timed by its action graph?
    The split-backward family and looped BFS always; interleaved where its model chunks hold
    different layer counts (``layers % (pp vpp) != 0``, ``specs.stage_layers``). Its closed form
    (``fast.timing``) takes each chunk as 1 / vpp of its rank's work, but the fill and the drain
    run through the chunks along the pipeline, one or two layers each where 126 layers sit on
    80 chunks (Llama 3 405B, pp 16, vpp 5, ZeRO-1: the closed form 6.17 s, the graph 6.76, the
    SimPy engine 6.77)."""
    schedule, pp, vpp = (np.asarray(a) for a in (schedule, pp, vpp))
    return (schedule >= ZB_H1) | ((schedule == INTERLEAVED) & (layers % (pp * vpp) != 0))


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
    ranks' orders and the dependencies between ranks: ``_kahn_order``)."""
    s = cached_schedule(schedule, pp, m, vpp)
    present = present_actions(s)
    chunk = {st: c for r in range(pp) for c, st in enumerate(s.stages_of_rank(r))}
    # number the nodes rank by rank; every leaf action knows its node; a node's columns but its waits
    node_of: dict[Action, int] = {}
    items, cols = [], []
    for r, order in enumerate(s.actions):
        for item in order:
            if item.kind == OVERLAP_F_B:
                f, b = item.sub_actions
                node_of[f] = node_of[b] = len(items)
                cols.append((K_FB, r, chunk[f.stage], chunk[b.stage], KIND_CODE[b.kind]))
            else:
                node_of[item] = len(items)
                code = KIND_CODE[item.kind]
                cols.append((code, r, chunk[item.stage], chunk[item.stage], code))
            items.append(item)
    n = len(items)
    rank_of = np.array([c[1] for c in cols], dtype=np.int64).reshape(n)
    # the nodes of other ranks each node waits for, distinct, in ``dependency_keys`` order
    wait_node, wait_count = [], []
    ranks = rank_of.tolist()
    for item, r in zip(items, ranks):
        w = [d for d in dict.fromkeys([node_of[k] for k in dependency_keys(s, item, present)]) if ranks[d] != r]
        wait_node += w
        wait_count.append(len(w))
    waits = np.array(wait_node, dtype=np.int64)
    counts = np.array(wait_count, dtype=np.int64).reshape(n)
    order = _kahn_order(rank_of, waits, counts)
    if (order < 0).any():
        raise ValueError(f"{schedule} pp={pp} m={m} vpp={vpp}: the schedule's actions wait on each other in a cycle")
    return _rows(np.array(cols, dtype=np.int64).reshape(n, 5), order, waits, counts)


def _rows(cols: np.ndarray, order: np.ndarray, waits: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The node table in ``order``. Only the nodes of other ranks a node waits for are kept (at
    most two: an overlapped slot's forward input and backward gradient), as positions in the
    order; the rank runs its own nodes in order, so what it ran before has ended."""
    n = len(order)
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n, dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if n else counts
    out = np.full((n, N_WIDTH), -1, dtype=np.int64)
    out[:, :N_DEP0] = cols[order]
    for k, col in ((0, N_DEP0), (1, N_DEP1)):
        has = counts[order] > k
        out[has, col] = position[waits[first[order][has] + k]]
    return out


@numba.njit(cache=True)
def _kahn_order(rank_of: np.ndarray, waits: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Kahn's topological order (-1 where a cycle leaves nodes out): the ready nodes on a stack,
    the first ones pushed in node order; a node's successors (the rank's next node, then the
    nodes of other ranks waiting on it, in node order) pushed as they become ready."""
    n = len(rank_of)
    pending = counts.copy()
    n_follow = np.zeros(n, dtype=np.int64)
    for i in range(n - 1):
        if rank_of[i + 1] == rank_of[i]:
            n_follow[i] += 1
            pending[i + 1] += 1
    for d in waits:
        n_follow[d] += 1
    start = np.zeros(n + 1, dtype=np.int64)
    start[1:] = np.cumsum(n_follow)
    fill = start[:-1].copy()
    follows = np.empty(start[n], dtype=np.int64)
    for i in range(n - 1):
        if rank_of[i + 1] == rank_of[i]:
            follows[fill[i]] = i + 1
            fill[i] += 1
    k = 0
    for i in range(n):
        for _ in range(counts[i]):
            follows[fill[waits[k]]] = i
            fill[waits[k]] += 1
            k += 1
    stack = np.empty(n, dtype=np.int64)
    top = 0
    for i in range(n):
        if pending[i] == 0:
            stack[top] = i
            top += 1
    order = np.full(n, -1, dtype=np.int64)
    done = 0
    while top:
        top -= 1
        i = stack[top]
        order[done] = i
        done += 1
        for e in range(start[i], start[i + 1]):
            j = follows[e]
            pending[j] -= 1
            if pending[j] == 0:
                stack[top] = j
                top += 1
    return order
