"""Segments of an action on a device's two streams, and how one or two chains share them.

A segment is a run of ops on the ``compute`` stream or one TP collective on the ``tp`` stream
(``compute.action_cost`` builds the chains). One chain runs back to back; two chains (the halves
of a sub-pipelined microbatch, Merak's sub-pipelined TP; or DualPipe's overlapped forward and
backward) run as two SimPy processes on capacity-1 stream Resources, each asking for its next
segment's stream when its previous segment ends (FIFO): the same processes the engine runs when
it steps through an action (``actions.run_stepped``), so both ways give the same times.
"""
from __future__ import annotations

from dataclasses import dataclass

import simpy


@dataclass(frozen=True)
class Segment:
    """A run of ops on the compute stream, or one TP collective on the tp stream."""
    stream: str             # "compute" | "tp"
    kind: str               # F, B, I, W, R, embedding, head | tp_allreduce, tp_allgather, tp_reducescatter
    layer: int              # global transformer layer index; -1 for embedding / head
    duration: float         # seconds (compute already scaled by the rank's slowdown)
    flops: float = 0.0      # FLOP executed (compute segments)
    nbytes: float = 0.0     # full collective buffer, bytes (tp segments)
    op: str = ""            # collective op (tp segments)
    name: str = ""          # op names it covers / the collective's name
    covered: float = 0.0    # tp segments: seconds of it the stack hides behind compute (``costs.stack.tp_covered``)
    block: float | None = None  # tp segments: solo seconds of compute since the chain's previous collective


@dataclass(frozen=True)
class Placed:
    """A segment placed in its action: seconds from the action's start."""
    start: float
    end: float
    half: int
    segment: Segment


def place(chains: list[list[Segment]]) -> list[Placed]:
    """Start/end of every segment of one or two chains sharing the compute and tp streams.

    One chain runs back to back. Two chains (the halves of a sub-pipelined microbatch) run as
    two SimPy processes on capacity-1 ``compute`` and ``tp`` stream Resources, each asking for
    its next segment's stream when its previous segment ends (FIFO): the same processes the
    engine runs when it steps through an action, so both ways give the same times."""
    if len(chains) <= 1:
        out, t = [], 0.0
        for s in (chains[0] if chains else []):
            out.append(Placed(t, t + s.duration, 0, s))
            t += s.duration
        return out
    env = simpy.Environment()
    streams = {"compute": simpy.Resource(env, capacity=1), "tp": simpy.Resource(env, capacity=1)}
    out = []

    def half(h: int, chain: list[Segment]):
        for s in chain:
            with streams[s.stream].request() as req:
                yield req
                start = env.now
                yield env.timeout(s.duration)
            out.append(Placed(start, env.now, h, s))

    for h, chain in enumerate(chains):
        env.process(half(h, chain))
    env.run()
    out.sort(key=lambda p: (p.start, p.half))
    return out


def layer_groups(chains) -> list[list[list[Segment]]]:
    """The chains cut per transformer layer: one group per layer, in the order the chains visit
    them, holding that layer's segments of every chain (two with sub-pipelined TP, whose halves
    meet at every layer's end; a chain with nothing on a layer contributes an empty list)."""
    order: dict[int, None] = {}
    by_layer: list[dict[int, list[Segment]]] = []
    for chain in chains:
        parts: dict[int, list[Segment]] = {}
        for s in chain:
            order.setdefault(s.layer)
            parts.setdefault(s.layer, []).append(s)
        by_layer.append(parts)
    return [[parts.get(layer, []) for parts in by_layer] for layer in order]


def uncovered(comm: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """Seconds of the union of ``comm`` intervals outside the union of ``cover`` intervals."""
    def union(iv):
        merged: list[list[float]] = []
        for s, e in sorted(iv):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        return merged

    c, k = union(comm), union(cover)
    total = sum(e - s for s, e in c)
    j = 0
    for s, e in c:
        while j < len(k) and k[j][1] <= s:
            j += 1
        jj = j
        while jj < len(k) and k[jj][0] < e:
            total -= min(e, k[jj][1]) - max(s, k[jj][0])
            jj += 1
    return total
