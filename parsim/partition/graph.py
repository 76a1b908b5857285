"""The cost graph a partitioner cuts, and the segments between its cut points (torch-free).

A ``CostGraph`` is a model's computation as a topologically ordered list of nodes (Merak's
"proxy nodes", Lai et al. 2023, Sec. 4.1: traced without real weights), each with its
forward/backward time on one device, the bytes it saves for backward, the tensors it
outputs and the parameters it uses. *Common* nodes (the graph inputs and what is computed
from them alone: attention mask, position ids, labels) are kept apart: every stage has them
(Merak's "common nodes"), so they never cross a cut.

A cut between node c-1 and node c sends every tensor produced before c and used at or after
c ("live" tensors: a tensor used by a later stage is sent, not recomputed or duplicated).
Cuts are only allowed where few tensors are live (the residual stream between layers);
the nodes between two allowed cuts form a ``Segment``, the unit the partitioner moves.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class CostNode:
    """One node of the graph. Times in seconds and sizes in bytes, per microbatch."""

    name: str
    fwd_s: float
    bwd_s: float
    output_bytes: float            # tensors it outputs (what a cut right after it sends)
    activation_bytes: float        # bytes saved for backward, attributed to this node
    params: tuple[str, ...] = ()   # parameters it uses (names into CostGraph.param_numel)
    inputs: tuple[int, ...] = ()   # producing sequence nodes (indices into CostGraph.nodes)
    common_inputs: tuple[int, ...] = ()   # indices into CostGraph.common
    unit: int = -1                 # recomputation unit (transformer layer index); -1: none
    is_tensor: bool = True         # False for shapes/ints (carried as metadata, never counted live)
    scope: str = ""                # the module it runs in (e.g. "blocks.3.attn"), "" at top level
    # what slows the pass times down when ranks share a host's cores (``costs.host``):
    # the memory-bound part and the synchronous collectives (not slowed) inside fwd_s / bwd_s;
    # the rest is GEMM and attention compute
    fwd_membound_s: float = 0.0
    bwd_membound_s: float = 0.0
    fwd_comm_s: float = 0.0
    bwd_comm_s: float = 0.0
    rerun_s: float | None = None   # what a full recomputation re-runs of fwd_s (``costs.stops_early``); None: all


@dataclass(frozen=True)
class CostGraph:
    name: str
    nodes: tuple[CostNode, ...]                 # topological (program) order
    common: tuple[CostNode, ...] = ()
    param_numel: dict[str, float] = field(default_factory=dict)   # elements per parameter, per device
    # analytic graphs: elements of the largest tensor behind a name that stands for several (a
    # layer, the embedding, the head), what the optimizer step's temporaries scale with
    # (``costs.footprint.optimizer_temporaries``); traced graphs name tensors (``param_numel``)
    param_largest: dict[str, float] = field(default_factory=dict)
    output_inputs: tuple[int, ...] = ()         # sequence nodes the graph output returns
    unit_checkpoint_bytes: dict[int, float] = field(default_factory=dict)  # kept by a recomputed unit
    layers: int | None = None                   # transformer layers (ModelSpec graphs): cuts at layer starts
    source: str = "traced"                      # "traced" | "analytic"
    # analytic graphs: a stage's backward working set, f(first, last, stored bytes per microbatch,
    # a layer's recompute transient, its fully recomputed layers) (costs.activations.backward_working_bytes),
    # and the output a
    # non-last stage keeps per
    # microbatch; traced graphs use StageCoster's generic estimates
    backward_working: Callable[[bool, bool, float, float, int], float] | None = None
    output_bytes: float | None = None
    # the weight-gradient pass's share of a backward (split-backward schedules); traced graphs:
    # one half, dX and dW of every GEMM having equal FLOPs (Narayanan et al. 2021, Sec. 5.1)
    weight_grad_share: float = 0.5
    # analytic graphs: ZeRO-3's gathered layers held during every action (costs.memory.gathered_bytes);
    # traced graphs: not modelled (0)
    gathered_bytes: float = 0.0

    def last_use(self) -> list[int]:
        """Per node: the index of its last consumer (len(nodes) if the output returns it)."""
        n = len(self.nodes)
        last = list(range(n))
        for i, node in enumerate(self.nodes):
            for u in node.inputs:
                last[u] = max(last[u], i)
        for u in self.output_inputs:
            last[u] = n
        return last

    def live_at_cuts(self) -> tuple[list[int], list[float]]:
        """For every cut position c (0..len(nodes)): number and bytes of the tensors crossing it."""
        n = len(self.nodes)
        count = [0] * (n + 2)
        nbytes = [0.0] * (n + 2)
        for u, last in enumerate(self.last_use()):
            node = self.nodes[u]
            if not node.is_tensor or last <= u:
                continue
            # live across cuts u+1 .. last
            count[u + 1] += 1
            count[last + 1] -= 1
            nbytes[u + 1] += node.output_bytes
            nbytes[last + 1] -= node.output_bytes
        c_out, b_out, c, b = [], [], 0, 0.0
        for i in range(n + 1):
            c += count[i]
            b += nbytes[i]
            c_out.append(c)
            b_out.append(max(b, 0.0))
        return c_out, b_out


@dataclass(frozen=True)
class Segment:
    """Nodes [first, end) between two allowed cuts; the unit a stage is made of."""

    first: int
    end: int
    name: str                       # its first node's name (a stage boundary if a stage starts here)
    scope: str                      # its first node's module
    fwd_s: float
    bwd_s: float
    activation_bytes: float         # saved for backward without recomputation
    input_bytes: float              # live tensors entering it (sent if a stage starts here)
    layers: int                     # recomputation units it holds (transformer layers)
    recompute_s: float              # extra forward in backward if its units recompute
    recompute_saving_bytes: float   # activation bytes recomputing its units frees
    params: tuple[str, ...]         # in program order, each once
    common: frozenset[int]
    # the memory-bound and collective shares of fwd_s / bwd_s / recompute_s (``CostNode``)
    fwd_membound_s: float = 0.0
    bwd_membound_s: float = 0.0
    fwd_comm_s: float = 0.0
    bwd_comm_s: float = 0.0
    recompute_membound_s: float = 0.0
    recompute_comm_s: float = 0.0


def candidate_cuts(graph: CostGraph, min_cuts: int = 0) -> list[int]:
    """Cut positions allowed. Layered graphs: where a layer first appears and no more
    tensors cross than at the other layer starts. Otherwise: where the fewest tensors are
    live (1: the residual stream), relaxing the count until there are ``min_cuts`` of them."""
    n = len(graph.nodes)
    count, _ = graph.live_at_cuts()
    if graph.layers is not None:
        first_node: dict[int, int] = {}
        for c, node in enumerate(graph.nodes):
            first_node.setdefault(node.unit, c)
        # every layer's first node but the first layer's (which keeps what precedes it)
        starts = sorted(c for unit, c in first_node.items() if unit >= 0)[1:]
        fewest = min((count[c] for c in starts), default=0)
        return [c for c in starts if count[c] == fewest]   # e.g. not across a long skip connection
    inner = [count[c] for c in range(1, n) if count[c] > 0]
    if not inner:
        return []
    for k in sorted(set(inner)):
        cuts = [c for c in range(1, n) if 0 < count[c] <= k]
        if len(cuts) >= min_cuts:
            return cuts
    return [c for c in range(1, n) if count[c] > 0]


def build_segments(graph: CostGraph, cuts: list[int]) -> list[Segment]:
    """The segments between consecutive cuts. A segment's recomputation units are its
    transformer layers (``unit >= 0``) or, for graphs without units, the segment itself;
    recomputing a unit keeps only its input (Chen et al. 2016, gradient checkpointing)."""
    _, live_bytes = graph.live_at_cuts()
    bounds = [0] + sorted(cuts) + [len(graph.nodes)]
    has_units = any(node.unit >= 0 for node in graph.nodes)
    out = []
    for si, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        nodes = graph.nodes[a:b]
        act = sum(x.activation_bytes for x in nodes)
        if has_units:
            units = sorted({x.unit for x in nodes if x.unit >= 0})
            recomputed = [x for x in nodes if x.unit >= 0]
            saving = (sum(x.activation_bytes for x in recomputed)
                      - sum(graph.unit_checkpoint_bytes.get(u, 0.0) for u in units))
            layers = len(units)
        else:
            recomputed = list(nodes)
            saving = act - live_bytes[a]
            layers = 1
        if not layers:
            recomputed = []
        out.append(Segment(
            first=a, end=b, name=nodes[0].name, scope=nodes[0].scope,
            fwd_s=sum(x.fwd_s for x in nodes), bwd_s=sum(x.bwd_s for x in nodes),
            activation_bytes=act, input_bytes=live_bytes[a], layers=layers,
            recompute_s=sum(x.fwd_s if x.rerun_s is None else x.rerun_s for x in recomputed), recompute_saving_bytes=max(saving, 0.0) if layers else 0.0,
            params=tuple(dict.fromkeys(p for x in nodes for p in x.params)),
            common=frozenset(c for x in nodes for c in x.common_inputs),
            fwd_membound_s=sum(x.fwd_membound_s for x in nodes), bwd_membound_s=sum(x.bwd_membound_s for x in nodes),
            fwd_comm_s=sum(x.fwd_comm_s for x in nodes), bwd_comm_s=sum(x.bwd_comm_s for x in nodes),
            recompute_membound_s=sum(x.fwd_membound_s for x in recomputed),
            recompute_comm_s=sum(x.fwd_comm_s for x in recomputed)))
    return out


class UnionSum:
    """Sum of item values over the items used anywhere in a range of segments [a, b), in
    O(1) for items used by one segment (prefix sums) plus O(shared items) per query."""

    def __init__(self, uses: dict[object, tuple[float, list[int]]], num_segments: int):
        single = [0.0] * (num_segments + 1)
        self.shared: list[tuple[float, list[int]]] = []
        for value, segs in uses.values():
            segs = sorted(set(segs))
            if len(segs) == 1:
                single[segs[0] + 1] += value
            else:
                self.shared.append((value, segs))
        for i in range(num_segments):
            single[i + 1] += single[i]
        self.prefix = single

    def __call__(self, a: int, b: int) -> float:
        total = self.prefix[b] - self.prefix[a]
        for value, segs in self.shared:
            i = bisect_left(segs, a)
            if i < len(segs) and segs[i] < b:
                total += value
        return total
