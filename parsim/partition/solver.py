"""Cut a cost graph into pp*vpp contiguous stages: exact min-max dynamic programming.

Merak (Lai et al. 2023, Sec. 4.2) balances the stages of its traced graph by cost; in a
pipeline the slowest stage sets the steady-state rate (1F1B: step ~ (m - 1) max_s t_s +
sum_s t_s, Narayanan et al. 2021 Sec. 2.2), so we minimise the largest stage time exactly:

    best[k][b] = min over a of max(best[k-1][a], t(stage k-1 = segments [a, b)))

subject to every stage fitting its memory limit (``stage_cost``), ties broken by the smaller
total time (less recomputation). O(K n^2) for K stages over n segments (cut candidates).
The naive split -- the same number of segments (layers) per stage, the remainder to the
middle stages as ``parsim.specs.stage_layers`` does -- is priced the same way for comparison.

The cut balances each stage's time alone on its device (``solo_s``). The stage times and step
estimates reported are one step of the plan's schedule with those stages
(``pipeline.shared_host_run``): on GPUs the solo times list-scheduled; on a calibrated CPU host
whose cores the ranks share, each action slowed only while other ranks compute beside it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from parsim.costs.host import HostModel, lockstep
from parsim.costs.placement import rank_of_stage
from parsim.costs.timing import p2p_time
from parsim.specs import ClusterSpec, Plan, RankLayout, SpecError

from .graph import CostGraph, Segment, build_segments, candidate_cuts
from .pipeline import shared_host_run
from .stage_cost import StageCoster


@dataclass(frozen=True)
class StageResult:
    stage: int
    first: str                # boundary: name of the stage's first node
    scope: str                # the module that node runs in
    last: str
    segments: int             # segments (transformer layers on ModelSpec graphs) it holds
    layers: int               # recomputation units (transformer layers) it holds
    time_s: float             # forward + backward (+ recompute) of one microbatch as it runs in the pipeline
    fwd_s: float              # (mean over microbatches; on a shared CPU host, with the other ranks' contention)
    bwd_s: float
    memory_bytes: float
    state_bytes: float
    activation_bytes: float
    recompute_layers: int
    fits: bool
    send_bytes: float         # tensors it sends to the next stage per microbatch
    solo_s: float = 0.0       # forward + backward of one microbatch alone on its device (what the DP balances)


@dataclass(frozen=True)
class PartitionResult:
    model: str
    graph: str                          # "traced" | "analytic"
    plan: str
    num_nodes: int
    num_candidate_cuts: int
    memory_limit_bytes: float
    stages: tuple[StageResult, ...]
    uniform_stages: tuple[StageResult, ...]
    step_time_s: float                  # list-scheduled step estimate with these stages
    uniform_step_time_s: float
    layered: bool                       # segments are layers (cuts at layer starts)

    @property
    def partition(self) -> tuple[int, ...]:
        """Layers (segments) per virtual stage: a Plan ``partition=`` on ModelSpec graphs."""
        return tuple(s.segments for s in self.stages)

    @property
    def uniform_partition(self) -> tuple[int, ...]:
        return tuple(s.segments for s in self.uniform_stages)

    @property
    def recompute_layers(self) -> tuple[int, ...]:
        return tuple(s.recompute_layers for s in self.stages)

    @property
    def boundaries(self) -> tuple[str, ...]:
        """Name of the first node of every stage after the first."""
        return tuple(s.first for s in self.stages[1:])

    @property
    def speedup_vs_uniform(self) -> float:
        return self.uniform_step_time_s / self.step_time_s

    def to_dict(self) -> dict:
        return {
            "model": self.model, "graph": self.graph, "plan": self.plan, "layered": self.layered,
            "partition": list(self.partition), "recompute_layers": list(self.recompute_layers),
            "stage_times_s": [s.time_s for s in self.stages],
            "stage_solo_times_s": [s.solo_s for s in self.stages],
            "stage_memory_bytes": [s.memory_bytes for s in self.stages],
            "boundaries": list(self.boundaries),
            "boundary_scopes": [s.scope for s in self.stages[1:]],
            "uniform_partition": list(self.uniform_partition),
            "uniform_stage_times_s": [s.time_s for s in self.uniform_stages],
            "uniform_stage_memory_bytes": [s.memory_bytes for s in self.uniform_stages],
            "step_time_s": self.step_time_s, "uniform_step_time_s": self.uniform_step_time_s,
            "predicted_speedup_vs_uniform": self.speedup_vs_uniform,
            "fits": all(s.fits for s in self.stages),
            "uniform_fits": all(s.fits for s in self.uniform_stages),
            "memory_limit_bytes": self.memory_limit_bytes,
            "num_nodes": self.num_nodes, "num_candidate_cuts": self.num_candidate_cuts,
            "stages": [asdict(s) for s in self.stages],
        }


def balanced_counts(n: int, stages: int) -> list[int]:
    """n units over ``stages``: equal shares, the remainder to the stages farthest from both
    ends (``parsim.specs.stage_layers``'s rule: the end stages hold embedding and head)."""
    base, rem = divmod(n, stages)
    counts = [base] * stages
    for s in sorted(range(stages), key=lambda s: -min(s, stages - 1 - s))[:rem]:
        counts[s] += 1
    return counts


def min_max_bounds(coster: StageCoster, stages: int) -> list[int] | None:
    """Segment bounds [0, b1, ..., n] of the min-max partition, or None if nothing fits."""
    n = len(coster.segments)
    INF = (float("inf"), float("inf"))
    best = [[INF] * (n + 1) for _ in range(stages + 1)]
    choice = [[-1] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, stages + 1):
        for b in range(k, n - (stages - k) + 1):
            for a in range(k - 1, b):
                prev = best[k - 1][a]
                if prev == INF:
                    continue
                c = coster.cost(k - 1, a, b)
                if not c.fits:
                    continue
                value = (max(prev[0], c.time_s), prev[1] + c.time_s)
                if value < best[k][b]:
                    best[k][b], choice[k][b] = value, a
    if best[stages][n] == INF:
        return None
    bounds = [n]
    for k in range(stages, 0, -1):
        bounds.append(choice[k][bounds[-1]])
    return bounds[::-1]


def partition_graph(graph: CostGraph, plan: Plan, cluster: ClusterSpec, memory_limit: float) -> PartitionResult:
    """The min-max partition of ``graph`` into plan.pp * plan.vpp stages, and the uniform one."""
    stages = plan.num_stages
    cuts = candidate_cuts(graph, min_cuts=stages - 1)
    segments = build_segments(graph, cuts)
    if len(segments) < stages:
        raise SpecError("pp*vpp", stages, f"at most {len(segments)} stages: the graph of {graph.name} has "
                        f"{len(segments) - 1} places to cut (where few tensors are live)")
    coster = StageCoster(graph, segments, plan, memory_limit)
    bounds = min_max_bounds(coster, stages)
    uniform = [0]
    for c in balanced_counts(len(segments), stages):
        uniform.append(uniform[-1] + c)
    if bounds is None:
        need = max(coster.cost(k, a, b).memory_bytes for k, (a, b) in enumerate(zip(uniform[:-1], uniform[1:])))
        raise SpecError("memory_limit", memory_limit,
                        f"more memory per stage: no split of {graph.name} into {stages} stages fits (the "
                        f"equal split needs {need / 2**30:.2f} GiB on its largest stage); try more stages, "
                        "recompute=full or stage-aware, a smaller mbs or ZeRO")
    auto_stages, step = _stage_results(graph, segments, coster, bounds, plan, cluster)
    uniform_stages, uniform_step = _stage_results(graph, segments, coster, uniform, plan, cluster)
    return PartitionResult(
        model=graph.name, graph=graph.source, plan=plan.to_string(), num_nodes=len(graph.nodes),
        num_candidate_cuts=len(cuts), memory_limit_bytes=memory_limit,
        stages=auto_stages, uniform_stages=uniform_stages, step_time_s=step, uniform_step_time_s=uniform_step,
        layered=graph.layers is not None)


def _split_extra(cluster: ClusterSpec, graph: CostGraph, segments: list[Segment]) -> float:
    """Seconds a split weight-gradient pass of these segments costs beyond its ops
    (``costs.split_backward.split_weight_overhead``): L layers (recomputation units), each one's
    fused backward the mean over them of their nodes' backward less its collectives; 0 without
    layers or a measured term."""
    from parsim.costs.split_backward import split_chunk_overhead

    nodes = [graph.nodes[i] for seg in segments for i in range(seg.first, seg.end) if graph.nodes[i].unit >= 0]
    layers = len({n.unit for n in nodes})
    if layers == 0:
        return 0.0
    return split_chunk_overhead(cluster, sum(n.bwd_s - n.bwd_comm_s for n in nodes) / layers, layers)


def _stage_results(graph: CostGraph, segments: list[Segment], coster: StageCoster, bounds: list[int], plan: Plan,
                   cluster: ClusterSpec) -> tuple[tuple[StageResult, ...], float]:
    """The stages between ``bounds`` and the step-time estimate: one step of the plan's schedule
    with these stages (``shared_host_run``). The min-max cut balances solo times; the times
    reported are those the stages take in the pipeline: on a CPU host shared by the ranks
    (calibrated profiles) a stage computing beside others runs slower than one computing while
    they idle (``costs.host.HostModel``), which moves a light stage's time more than a heavy one's."""
    costs = [coster.cost(k, a, b) for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    sends = [segments[b].input_bytes if b < len(segments) else 0.0 for b in bounds[1:]]
    layout = RankLayout(plan.dp, plan.tp, plan.pp)
    send_s = []
    for k, nbytes in enumerate(sends):
        src = layout.rank(rank_of_stage(plan, k), 0, 0)
        dst = layout.rank(rank_of_stage(plan, min(k + 1, plan.pp * plan.vpp - 1)), 0, 0)
        send_s.append(p2p_time(cluster, nbytes, src, dst) if src != dst else 0.0)
    jobs = [c.host_jobs() for c in costs]
    split_extra = [_split_extra(cluster, graph, segments[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    host = HostModel(cluster, plan.world_size, lockstep(plan))
    run = shared_host_run(plan, [j[0] for j in jobs], [j[1] for j in jobs], send_s, host,
                          graph.weight_grad_share, send_bytes=sends, split_extra=split_extra)
    out = []
    for k, ((a, b), c) in enumerate(zip(zip(bounds[:-1], bounds[1:]), costs)):
        out.append(StageResult(
            stage=k, first=segments[a].name, scope=segments[a].scope,
            last=graph.nodes[segments[b - 1].end - 1].name, segments=b - a,
            layers=sum(s.layers for s in segments[a:b]), time_s=run.fwd_s[k] + run.bwd_s[k], fwd_s=run.fwd_s[k],
            bwd_s=run.bwd_s[k], memory_bytes=c.memory_bytes, state_bytes=c.state_bytes,
            activation_bytes=c.activation_bytes, recompute_layers=c.recompute_layers, fits=c.fits,
            send_bytes=sends[k], solo_s=c.time_s))
    return tuple(out), run.step_time_s

