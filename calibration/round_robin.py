"""The machine grid's memory-bound ops and attention timed round-robin: one sample of every
point in turn, the way ``compute.bench_gemms`` times the GEMMs (``timer.measure_many``).

Timed one after the other (``compute.bench_membound``), a point's samples are taken back to back
within some 20-40 ms, and a shared VM's slow spells are that long or longer: on the 2-vCPU Zen 3
VM (2026-12-01) a point's median moved up to 2x between passes seconds apart (layernorm's
backward at 40 x 384: 85, 40, 88 us) and whole runs of consecutive points read 20-40 % slow
together. Over three passes of the memory-bound grid taken alternately both ways in one run, the
fits' leave-out medians read 11.8 % (median over the ops) from the points timed one by one and
5.8 % round-robin (``studies/validation_cpu/heldout/membound_noise.py``, 33 s, 2 GB): a spell now slows
every point a little instead of a few a lot.
"""
from __future__ import annotations

from typing import Callable

import torch

from parsim.executor.layer_probe import TORCH_DTYPES

from .cache import llc_bytes
from .compute import attention_case, backward_rotation, bench_membound, cold_cases, forward_rotation, membound_case
from .fit import Summary
from .shapes import AttentionPoint, MemboundPoint
from .timer import Clock, measure_many

# ops timed on their own (``compute.bench_membound``): the optimizer step and the gradient
# accumulation rotate over their own state, and have no backward
OWN_BENCH = ("adamw", "grad_accumulate")
# the points are timed in groups whose recorded forwards (outputs and graphs, every case of every
# point in the group) stay under this many bytes, or 8 x the last-level cache if larger. The
# CPU grid's memory-bound points hold ~2 GB in all: one group. Groups timed one after the other
# are at the mercy of a slow spell again (2026-12-01, Zen 3 VM: a pass whose backwards ran in two
# groups read the first group 1.8x slower than the second, and the fits' leave-out doubled), so
# a group times its points' forwards and backwards in one rotation.
GROUP_BYTES = 4 * 2**30


def fwd_bwd_many(cases: list[Callable], clock: Clock, repeats: int, budget_s: float,
                 step: Callable[[int], None] | None = None) -> list[tuple[Summary, Summary]]:
    """(forward, backward) seconds of each ``case()`` = (forward, its inputs), as
    ``compute._fwd_bwd`` times one on cold operands (``budget_s`` per point for both passes), but
    sampled round-robin: every forward and backward of a group of points (at most
    ``GROUP_BYTES`` of recorded forwards) in one rotation. ``step(i)`` after point i."""
    rotations = [cold_cases(case, clock.pool, True) for case in cases]
    out: list[tuple[Summary, Summary]] = []
    limit, group, held = max(GROUP_BYTES, 8 * llc_bytes(clock.device)), [], 0

    def flush() -> None:
        nonlocal group, held
        fns = [forward_rotation(rotations[i]) for i in group] + [backward_rotation(rotations[i], clock.pool)
                                                                  for i in group]
        timed = measure_many(fns, clock, repeats, budget_s / 2)
        for k, i in enumerate(group):
            out.append((timed[k], timed[len(group) + k]))
            rotations[i] = []           # its graphs go with the group
            if step is not None:
                step(i)
        group, held = [], 0

    for i, rotation in enumerate(rotations):
        size = _recorded_bytes(rotation[0][0]) * len(rotation)
        if group and held + size > limit:
            flush()
        group.append(i)
        held += size
    if group:
        flush()
    return out


def bench_membound_many(points: list[MemboundPoint], dtype: str, clock: Clock, repeats: int, budget_s: float,
                        step: Callable[[MemboundPoint], None] | None = None) -> list[tuple[Summary, Summary | None]]:
    """``compute.bench_membound`` of every point, the streaming ops round-robin (``fwd_bwd_many``),
    AdamW and gradient accumulation on their own after them. ``step(point)`` after each."""
    dt = TORCH_DTYPES[dtype]
    streaming = [i for i, p in enumerate(points) if p.name not in OWN_BENCH]
    done = (lambda k: step(points[streaming[k]])) if step is not None else None
    timed = fwd_bwd_many([lambda p=points[i]: membound_case(p, dt, clock.device, clock.pool) for i in streaming],
                         clock, repeats, budget_s, done)
    out: dict[int, tuple[Summary, Summary | None]] = dict(zip(streaming, timed))
    for i, p in enumerate(points):
        if i not in out:
            out[i] = bench_membound(p, dtype, clock, repeats, budget_s)
            if step is not None:
                step(p)
    return [out[i] for i in range(len(points))]


def bench_attention_many(points: list[AttentionPoint], dtype: str, clock: Clock, repeats: int, budget_s: float,
                         step: Callable[[AttentionPoint], None] | None = None) -> list[tuple[Summary, Summary]]:
    """``compute.bench_attention`` (fused, cold) of every point, round-robin (``fwd_bwd_many``)."""
    done = (lambda k: step(points[k])) if step is not None else None
    return fwd_bwd_many([attention_case(p, dtype, clock) for p in points], clock, repeats, budget_s, done)


def _recorded_bytes(forward: Callable[[], torch.Tensor]) -> int:
    """About the bytes a recorded forward holds: its output, and as much again in its graph (an
    estimate: a cross-entropy keeps its log-softmax, a row per token, where it outputs a number
    per token; it only sizes the groups)."""
    with torch.no_grad():
        y = forward()
    return 2 * y.numel() * y.element_size()
