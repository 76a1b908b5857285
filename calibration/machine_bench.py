"""Measuring the machine grid (``grid``) on one device: GEMMs per form and dtype, fused
attention, memory-bound ops and the synthetic stages, in this process with the executor's
threads (``runner`` runs it single-threaded on a CPU). ``surfaces`` fits what it returns.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from parsim.specs import DTYPES, ModelSpec

from .fit import Summary
from .grid import attention_grid, gemm_grid, membound_grid, ranges_for, stages
from .shapes import AttentionPoint, GemmPoint, MemboundPoint

FORMS = ("linear", "grad_input", "grad_weight", "bmm")


@dataclass(frozen=True)
class GridSize:
    """Points per table: GEMMs per form in the calibrated dtype, ``linear`` GEMMs in every other
    dtype, attention points, sizes per memory-bound op; ``call_s`` caps one call's seconds
    (None: the device kind's, ``grid.Ranges``)."""
    gemm: tuple[tuple[str, int], ...]
    other_dtype: int
    attention: int
    membound: int
    call_s: float | None = None


FULL_GRID = GridSize(gemm=(("linear", 48), ("grad_input", 24), ("grad_weight", 24), ("bmm", 24)), other_dtype=12,
                     attention=24, membound=8)
QUICK_GRID = GridSize(gemm=(("linear", 16), ("grad_input", 8), ("grad_weight", 8), ("bmm", 8)), other_dtype=8,
                      attention=8, membound=4, call_s=0.01)


@dataclass
class GridPlan:
    """The points one run measures."""
    gemm: dict[str, list[GemmPoint]]                 # dtype -> points (every form in the calibrated dtype)
    attention: list[AttentionPoint]
    membound: list[MemboundPoint]
    stages: list[tuple[ModelSpec, int]]


@dataclass
class GridResults:
    gemm: dict[str, list[tuple[GemmPoint, Summary]]] = field(default_factory=dict)
    attention: list[tuple[AttentionPoint, Summary, Summary]] = field(default_factory=list)
    membound: list[tuple[MemboundPoint, Summary, Summary | None]] = field(default_factory=list)
    stages: list[tuple[ModelSpec, int, Summary, Summary]] = field(default_factory=list)


def estimate_rate(dtype: str, clock) -> float:
    """FLOP/s of one mid-sized GEMM (the grid's time cap is set from it)."""
    from .compute import bench_gemm
    d = 4096 if clock.is_cuda else 512
    point = GemmPoint((d, d, d), 1, "linear", "rate estimate")
    return point.flops / bench_gemm(point, dtype, clock, 3, 0.2).median


def plan_grid(device_type: str, dtype: str, size: GridSize, rates: dict[str, float], quick: bool,
              extra_stages: list[tuple[ModelSpec, int]] = ()) -> GridPlan:
    """The grid for this device kind, GEMMs capped at ``call_s`` seconds at each dtype's rate."""
    call_s = size.call_s or ranges_for(device_type).call_s
    gemm = {dtype: [p for form, count in size.gemm
                    for p in gemm_grid(device_type, form, count, rates[dtype] * call_s)]}
    for other in DTYPES:
        if other != dtype and other in rates and size.other_dtype:
            gemm[other] = gemm_grid(device_type, "linear", size.other_dtype, rates[other] * call_s, seed=1)
    return GridPlan(gemm=gemm, attention=attention_grid(device_type, size.attention, rates[dtype] * call_s),
                    membound=membound_grid(device_type, dtype, size.membound),
                    stages=stages(device_type, quick) + list(extra_stages))


def steps_of(plan: GridPlan, repeats: int) -> int:
    """Progress-bar steps ``measure_grid`` reports."""
    return repeats * len(plan.gemm) + len(plan.attention) + len(plan.membound) + len(plan.stages)


def measure_grid(plan: GridPlan, dtype: str, clock, repeats: int, gemm_budget_s: float, op_budget_s: float,
                 step: Callable[[str], None]) -> GridResults:
    """Every point of ``plan``: GEMMs of a dtype sampled round-robin (``timer.measure_many``),
    then attention, memory-bound ops and stages one by one."""
    from . import compute
    from .stages import bench_stage

    out = GridResults()
    for dt, points in plan.gemm.items():
        rounds = [0]

        def on_round(dt=dt) -> None:
            rounds[0] += 1
            step(f"grid GEMMs {dt} round {rounds[0]}")

        summaries = compute.bench_gemms(points, dt, clock, repeats, gemm_budget_s, on_round) if points else []
        out.gemm[dt] = list(zip(points, summaries))
        for _ in range(repeats - rounds[0]):
            step(f"grid GEMMs {dt}")
    for p in plan.attention:
        out.attention.append((p, *compute.bench_attention(p, dtype, clock, repeats, op_budget_s, "sdpa")))
        step(f"grid attention bh={p.batch_heads} s={p.seq}")
    for p in plan.membound:
        out.membound.append((p, *compute.bench_membound(p, dtype, clock, repeats, op_budget_s)))
        step(f"grid {p.name} {p.source}")
    for spec, mbs in plan.stages:
        out.stages.append((spec, mbs, *bench_stage(spec, mbs, dtype, clock, repeats)))
        step(f"stage {spec.name}")
    return out
