"""Timing of one callable on one device, correct on CPU and on CUDA by construction.

CPU ops are synchronous: a ``perf_counter`` pair around a batch of calls times them.
CUDA kernels are asynchronous: a batch is bracketed by CUDA events recorded on the current
stream and the end event is synchronised before reading ``elapsed_time`` (CUDA C
Programming Guide, "Events"; the method of ``torch.utils.benchmark``).

A *sample* is the mean time of ``inner`` back-to-back calls, with ``inner`` chosen so that a
sample lasts at least ``min_sample_s`` (so a 2-microsecond op is not timed at the timer's
resolution); ``repeats`` samples are taken, fewer if ``budget_s`` would be exceeded, never
fewer than ``MIN_SAMPLES``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .fit import Summary, sampling_plan, summarize


@dataclass(frozen=True)
class Clock:
    """Times ops on ``device``; ``pool`` holds the random operands the benchmarks on it read
    (``cache.OperandPool``, filled on first use)."""
    device: torch.device
    pool: "OperandPool" = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.pool is None:
            from .cache import OperandPool
            object.__setattr__(self, "pool", OperandPool(self.device))

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def per_call(self, fn: Callable[[], object], inner: int) -> float:
        """Seconds per call of ``fn`` over ``inner`` back-to-back calls."""
        if self.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / inner      # elapsed_time is in ms
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - t0) / inner


def measure(fn: Callable[[], object], clock: Clock, repeats: int, budget_s: float,
            min_sample_s: float = 2e-3, warmup: int = 2) -> Summary:
    """Median and spread of the per-call time of ``fn`` (seconds)."""
    return measure_many([fn], clock, repeats, budget_s, min_sample_s, warmup)[0]


def measure_many(fns: list[Callable[[], object]], clock: Clock, repeats: int, budget_s: float,
                 min_sample_s: float = 2e-3, warmup: int = 2,
                 on_round: Callable[[], None] = lambda: None) -> list[Summary]:
    """``measure`` for several ops, sampled round-robin (one sample of each op per round):
    a slow phase of a shared machine then hits every op alike instead of a few, so the
    medians keep their ratios. ``budget_s`` is per op."""
    plans = []
    for fn in fns:
        for _ in range(max(warmup - 1, 0)):
            fn()
        clock.sync()
        plans.append(sampling_plan(clock.per_call(fn, 1), repeats, budget_s, min_sample_s))
    samples: list[list[float]] = [[] for _ in fns]
    for r in range(max(count for _, count in plans)):
        for fn, (inner, count), out in zip(fns, plans, samples):
            if r < count:
                out.append(clock.per_call(fn, inner))
        on_round()
    return [summarize(s) for s in samples]


def device_for(name: str) -> torch.device:
    """``cpu`` or ``cuda[:i]``; the backend and timer follow from it."""
    return torch.device(name)
