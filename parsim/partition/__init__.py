"""Automatic pipeline partitioning (Merak, Lai et al. 2023, Sec. 4): trace a model into a cost
graph without real weights, and cut it into pp*vpp contiguous stages that balance time under
each stage's memory limit. Importable without torch (torch is imported only to trace).

    from parsim.partition import partition
    result = partition("merak-cpu.yaml", "pp=2 gbs=8 dtype=fp32", "cpu:2")
    result.partition, result.stage_times_s, result.speedup_vs_uniform
"""
from __future__ import annotations

from dataclasses import replace

from parsim.costs import device_capacity
from parsim.costs.stack import apply_stack_to_run, stack_model
from parsim.specs import ClusterSpec, ModelSpec, Plan, SpecError, load_cluster, parse_plan, validate

from .graph import CostGraph, CostNode, Segment, build_segments, candidate_cuts
from .pipeline import PipelineRun, pipeline_step_time, shared_host_run
from .solver import PartitionResult, StageResult, balanced_counts, partition_graph
from .sources import GRAPHS, ModelSource, ReferenceModel, build_graph, load_factory, resolve_source
from .stage_cost import StageCost, StageCoster


def partition(model: ModelSpec | str, plan: Plan | str, cluster: ClusterSpec | str,
              memory_limit: float | None = None, graph: str = "auto",
              reference_model: ReferenceModel | None = None) -> PartitionResult:
    """Cut ``model`` (a ModelSpec, preset, YAML, HF config or ``pkg.module:factory``) into
    ``plan.pp * plan.vpp`` stages for ``plan`` on ``cluster``. ``memory_limit`` in bytes per
    device defaults to the device capacity. A ModelSpec's graph is traced from
    ``reference_model`` (``sources``; e.g. ``parsim.executor.model.reference_model``), else
    analytic. The result's ``partition`` is a Plan ``partition=`` value for ModelSpec models."""
    source = resolve_source(model)
    plan = parse_plan(plan)
    cluster = load_cluster(cluster)
    if source.spec is not None:
        validate(source.spec, cluster, plan.replace(partition=None, recompute_layers=None))
    asked = plan
    stack, cluster, plan = apply_stack_to_run(cluster, plan)       # the software stack (``costs.stack``)
    if source.spec is not None:
        source = replace(source, spec=stack_model(source.spec, stack))
    limit = device_capacity(cluster) if memory_limit is None else float(memory_limit)
    if not limit > 0:
        raise SpecError("memory_limit", memory_limit, "a positive number of bytes per device")
    cost_graph = build_graph(source, plan, cluster, graph, reference_model)
    return replace(partition_graph(cost_graph, plan, cluster, limit), plan=asked.to_string())


__all__ = [
    "partition", "PartitionResult", "StageResult", "CostGraph", "CostNode", "Segment", "StageCost",
    "StageCoster", "ModelSource", "ReferenceModel", "GRAPHS", "build_graph", "build_segments", "candidate_cuts",
    "balanced_counts", "load_factory", "partition_graph", "pipeline_step_time", "resolve_source",
    "PipelineRun", "shared_host_run",
]
