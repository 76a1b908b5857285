"""Measuring the machine grid (``grid``) on one device: GEMMs per form and dtype, fused
attention, memory-bound ops and the synthetic stages, in this process with the executor's
threads (``runner`` runs it single-threaded on a CPU). ``surfaces`` fits what it returns.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from parsim.specs import DTYPES, ModelSpec

from .fit import Summary
from .grid import attention_grid, gemm_grid, membound_grid, ranges_for, stages
from .shapes import AttentionPoint, GemmPoint, MemboundPoint

FORMS = ("linear", "grad_input", "grad_weight", "bmm")


@dataclass(frozen=True)
class GridSize:
    """Points per table: GEMMs per form in the calibrated dtype, ``linear`` GEMMs in every other
    dtype, attention points, sizes per memory-bound op; ``call_s`` caps one call's seconds
    (None: the device kind's, ``grid.Ranges``); ``membound_passes``: passes over the memory-bound
    points (``measure_grid``)."""
    gemm: tuple[tuple[str, int], ...]
    other_dtype: int
    attention: int
    membound: int
    call_s: float | None = None
    membound_passes: int = 1


# Three passes over the memory-bound points: a point's samples are taken back to back, so a slow
# phase of a shared VM (seconds long) moved whole points by 2.5-7 % (median; up to 26 %) between
# passes on the 2-vCPU AMD VM, and the fits' leave-out with them. Over nine passes of the full
# grid (2026-11-29, ~6 s a pass) the ten memory-bound fits' leave-out medians averaged 7.3 % from
# one pass and 5.9 % from the median of three (their median over fits 6.7 -> 5.0 %).
MEMBOUND_PASSES = 3
# 24 forward GEMMs in each other dtype (12 before): their surface's leave-out on the 2-vCPU AMD VM
# read 6.4 % (bf16) and 5.8 % (fp16) over three grids of 24, against 10.9 % and 6.6 % over the six
# halves of 12 of those grids (2026-11-29; ~3 s more a calibration)
OTHER_DTYPE_GEMMS = 24
FULL_GRID = GridSize(gemm=(("linear", 48), ("grad_input", 24), ("grad_weight", 24), ("bmm", 24)),
                     other_dtype=OTHER_DTYPE_GEMMS,
                     attention=24, membound=8, membound_passes=MEMBOUND_PASSES)
QUICK_GRID = GridSize(gemm=(("linear", 16), ("grad_input", 8), ("grad_weight", 8), ("bmm", 8)), other_dtype=8,
                      attention=8, membound=4, call_s=0.01)


@dataclass
class GridPlan:
    """The points one run measures."""
    gemm: dict[str, list[GemmPoint]]                 # dtype -> points (every form in the calibrated dtype)
    attention: list[AttentionPoint]
    membound: list[MemboundPoint]
    stages: list[tuple[ModelSpec, int]]
    membound_passes: int = 1
    attention_other: dict[str, list[AttentionPoint]] = field(default_factory=dict)   # other dtypes' attention


@dataclass
class GridResults:
    gemm: dict[str, list[tuple[GemmPoint, Summary]]] = field(default_factory=dict)
    attention: list[tuple[AttentionPoint, Summary, Summary]] = field(default_factory=list)
    attention_other: dict[str, list[tuple[AttentionPoint, Summary, Summary]]] = field(default_factory=dict)
    membound: list[tuple[MemboundPoint, Summary, Summary | None]] = field(default_factory=list)
    stages: list[tuple[ModelSpec, int, Summary, Summary]] = field(default_factory=list)
    stage_rounds: Any = None    # the stages' ``stages.StageRounds`` (``stages`` summarizes it)
    membound_rounds: Any = None  # the memory-bound passes (``MemboundPasses``; ``membound`` holds its summaries)

    def time_stages(self, step: Callable[[str], None] | None = None) -> None:
        """One more round of the stages (``stage_rounds``), ``stages`` then over every round."""
        self.stage_rounds.round(step)
        self.stages = self.stage_rounds.summaries()

    def time_membound(self, step: Callable[[str], None] | None = None, every: bool = False) -> None:
        """The memory-bound grid's next pass (``every``: all it still owes), if the plan asks for
        more; ``membound`` then each point's median over every pass so far."""
        rounds = self.membound_rounds
        while rounds is not None and rounds.left:
            rounds.run(step)
            self.membound = rounds.summaries()
            if not every:
                break


class MemboundPasses:
    """The memory-bound points timed in ``passes`` passes spread over a calibration: the first
    with the per-op tables, one beside the real-layer probe after each collectives job, any left
    at the end (``runner.run_calibration``). A shared VM's memory bandwidth has slow spells that
    pass: on this project's 2-vCPU AMD VM (2026-11-30) one calibration's passes, taken back to
    back within 20 s, read the streaming ops 30-70 % slower than a calibration 8 minutes later
    and than the day before's, and priced the held-out bf16 plans 3-23 points slower than the
    later one (median 13; fp32, whose GEMMs weigh more, 0-10, median 5.5:
    ``studies/validation_cpu/heldout/README.md``). Passes minutes apart let each point's median
    of its passes set a spell shorter than a pass aside."""

    def __init__(self, points: list, passes: int, dtype: str, clock, repeats: int, budget_s: float):
        self.points, self.passes, self.dtype = list(points), passes, dtype
        self.clock, self.repeats, self.budget_s = clock, repeats, budget_s
        self.done: list[list[tuple]] = []

    @property
    def left(self) -> int:
        return self.passes - len(self.done) if self.points else 0

    def run(self, step: Callable[[str], None] | None = None) -> None:
        """One pass over every point (its forward and backward samples, round-robin:
        ``round_robin``); ``step(label)`` after each."""
        from .round_robin import bench_membound_many
        k = len(self.done) + 1

        def done(p) -> None:
            if step is not None:
                step(f"grid {p.name} {p.source}" + (f" (pass {k})" if self.passes > 1 else ""))
        self.done.append(bench_membound_many(self.points, self.dtype, self.clock, self.repeats, self.budget_s, done))

    def levels(self) -> list[float]:
        """Per pass, the median over the points of its forward time over the point's median of
        its passes: how slow the machine's memory ran in that pass (1: as the profile takes it)."""
        med = [p[1].median for p in self.summaries()]
        return [float(np.median([r[i][0].median / m for i, m in enumerate(med) if m > 0])) for r in self.done]

    def summaries(self) -> list[tuple]:
        """(point, forward, backward) per point: the median of its passes (``median_of``)."""
        return [(p, median_of([r[i][0] for r in self.done]), median_of([r[i][1] for r in self.done]))
                for i, p in enumerate(self.points)]


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
    others = [dt for dt in DTYPES if dt != dtype and dt in rates and size.other_dtype]
    for other in others:
        gemm[other] = gemm_grid(device_type, "linear", size.other_dtype, rates[other] * call_s, seed=1)
    # Attention in every other dtype too, at the calibrated dtype's FLOP cap: a 16-bit run's SDPA
    # on a CPU is torch's flash kernel accumulating in fp32, no faster than fp32's (2-vCPU AMD VM,
    # 11-29: heldout-gpt's layer, 3.3 / 7.1 ms forward / backward in bf16 under autocast, 3.2 /
    # 7.3 in fp32), which no GEMM rate can tell; on a GPU the 16-bit kernels are the ones used.
    attention_cap = rates[dtype] * call_s
    return GridPlan(gemm=gemm, attention=attention_grid(device_type, size.attention, attention_cap),
                    membound=membound_grid(device_type, dtype, size.membound),
                    stages=stages(device_type, quick) + list(extra_stages), membound_passes=size.membound_passes,
                    attention_other={dt: attention_grid(device_type, size.attention, attention_cap, seed=1)
                                     for dt in others})


def steps_of(plan: GridPlan, repeats: int) -> int:
    """Progress-bar steps ``measure_grid`` reports."""
    return (repeats * len(plan.gemm) + len(plan.attention) + sum(map(len, plan.attention_other.values()))
            + plan.membound_passes * len(plan.membound) + len(plan.stages))


def measure_grid(plan: GridPlan, dtype: str, clock, repeats: int, gemm_budget_s: float, op_budget_s: float,
                 step: Callable[[str], None]) -> GridResults:
    """Every point of ``plan``: GEMMs of a dtype sampled round-robin (``timer.measure_many``),
    then attention round-robin too (``round_robin``; the calibrated dtype's, then the others'),
    the first of the memory-bound ops' ``membound_passes`` passes (``MemboundPasses``, round-robin:
    ``GridResults.time_membound`` takes the others), and a first round of the stages
    (``stages.StageRounds``)."""
    from . import compute
    from .round_robin import bench_attention_many
    from .stages import StageRounds

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
    timed = bench_attention_many(plan.attention, dtype, clock, repeats, op_budget_s,
                                 lambda p: step(f"grid attention bh={p.batch_heads} s={p.seq}"))
    out.attention = [(p, *t) for p, t in zip(plan.attention, timed)]
    for dt, points in plan.attention_other.items():
        timed = bench_attention_many(points, dt, clock, repeats, op_budget_s,
                                     lambda p, dt=dt: step(f"grid attention {dt} bh={p.batch_heads} s={p.seq}"))
        out.attention_other[dt] = [(p, *t) for p, t in zip(points, timed)]
    out.membound_rounds = MemboundPasses(plan.membound, plan.membound_passes, dtype, clock, repeats, op_budget_s)
    out.time_membound(step)        # the first pass; the runner times the others after the collectives
    out.stage_rounds = StageRounds(plan.stages, dtype, clock, repeats)
    out.time_stages(step)          # the first round; the runner times more after the collectives
    return out


def median_of(passes: list[Summary | None]) -> Summary | None:
    """One point's passes as one: the median of their medians (and of their p10 / p90), over all
    their samples; None where the point has no such pass (AdamW's backward)."""
    kept = [x for x in passes if x is not None]
    if not kept:
        return None
    return Summary(median=float(np.median([x.median for x in kept])), p10=float(np.median([x.p10 for x in kept])),
                   p90=float(np.median([x.p90 for x in kept])), n=sum(x.n for x in kept))
