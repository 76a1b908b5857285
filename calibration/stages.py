"""Synthetic training stages run by the executor's own modules: what composing ops costs.

Ops timed one by one miss what a training pass pays around them: autograd's graph and engine,
Python module calls, the loss, layout copies, casts under autocast, allocating activations
and gradients (on a CPU under glibc's default policy, first-touch page faults of freshly
mapped memory: ``parsim.executor.host_alloc``), caches a pass's working set evicts. Each
stage here is a whole small model as one pipeline stage -- embedding, ``layers`` blocks, final
norm, output layer and the token loss (``parsim.executor.model.StageModule``) -- stepped as the
executor steps a microbatch: forward with the loss under the executor's autocast, then
``(loss * multiplier).backward()`` accumulating into ``.grad`` (``executor.pp_parallel``).
``calibration.layer_terms`` fits the composition terms from their times (``grid.STAGES``:
shapes that differ from any validation model).
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch

from parsim.executor.model import StageModule
from parsim.executor.optimizer import autocast_factory
from parsim.executor.weights import initialised_stage
from parsim.specs import ModelSpec

from .cache import Evictor
from .compute import pass_samples
from .fit import Summary, summarize
from .timer import Clock


def stage_step(spec: ModelSpec, mbs: int, dtype: str, device: torch.device
               ) -> tuple[Callable[[], torch.Tensor], Callable[[], None], StageModule]:
    """(forward, backward, module) of ``spec`` as one stage holding every layer: fp32
    parameters, matmuls in ``dtype`` under autocast (the executor's mixed precision)."""
    stage = initialised_stage(spec, 0, spec.layers, True, True, seed=0).to(device=device)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(spec.vocab, (mbs, spec.seq_len + 1), generator=gen).to(device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    autocast = autocast_factory(dtype, device)
    held: list[torch.Tensor] = []

    def forward() -> torch.Tensor:
        with autocast():
            held[:] = [stage(inputs, targets)]
        return held[0]

    def backward() -> None:
        (held.pop() * 0.25).backward()

    return forward, backward, stage


def bench_stage(spec: ModelSpec, mbs: int, dtype: str, clock: Clock, repeats: int,
                warmup: int = 2) -> tuple[Summary, Summary]:
    """Forward (with the loss) and backward seconds of the stage: ``repeats`` samples after
    ``warmup`` untimed steps (the first backward allocates ``.grad``). The last-level cache is
    swept before each timed pass (``cache.Evictor``): in a training step the layers, the other
    microbatches' passes and the optimizer have evicted a stage's weights before it runs, which
    a small stage stepped alone would otherwise keep in cache."""
    fwd, bwd = stage_samples(spec, mbs, dtype, clock, repeats, warmup)
    return summarize(fwd), summarize(bwd)


def stage_samples(spec: ModelSpec, mbs: int, dtype: str, clock: Clock, repeats: int,
                  warmup: int = 2) -> tuple[list[float], list[float]]:
    """``bench_stage``'s raw forward and backward samples (seconds), in the order taken."""
    forward, backward, _ = stage_step(spec, mbs, dtype, clock.device)
    return pass_samples(forward, backward, clock, repeats, warmup, before_pass=Evictor(clock.device))


class StageRounds:
    """The synthetic stages timed in rounds at several points of a calibration: after the
    per-op tables, and beside the real-layer probe after every collectives job
    (``runner.run_calibration``). Every compute price of a calibrated profile sits at the level
    these stages set (``layer_terms.composition_terms``: measured stage over its priced ops),
    so one round that catches a slow minute moves every prediction: on this project's 2-vCPU
    AMD VM (2026-11-29) one calibration's single round read the four stages 3-7 % slower than
    the calibration an hour before, while its own layer probe, the per-op tables and the
    held-out plans it then predicted ran as fast as before or faster, and every plan came out
    4.6 % slower than that earlier calibration priced it; timed again 20 minutes later the
    stages were back (``studies/validation_cpu/heldout/README.md``). Each stage is summarized
    over the samples of all rounds (the median: ``stages``); ``rounds`` keeps each round's
    sum over the stages of the forward + backward medians, seconds."""

    def __init__(self, stages: list[tuple[ModelSpec, int]], dtype: str, clock: Clock, repeats: int):
        self.stages, self.dtype, self.clock, self.repeats = list(stages), dtype, clock, repeats
        self.samples: list[tuple[list[float], list[float]]] = [([], []) for _ in self.stages]
        self.rounds: list[float] = []

    def round(self, step: Callable[[str], None] | None = None) -> None:
        """Time every stage once more (``repeats`` samples each); ``step(label)`` after each."""
        total = 0.0
        for (spec, mbs), (fwd, bwd) in zip(self.stages, self.samples):
            f, b = stage_samples(spec, mbs, self.dtype, self.clock, self.repeats)
            fwd += f
            bwd += b
            total += statistics.median(f) + statistics.median(b)
            if step is not None:
                step(f"stage {spec.name}")
        if self.stages:
            self.rounds.append(total)

    def summaries(self) -> list[tuple[ModelSpec, int, Summary, Summary]]:
        """(spec, mbs, forward, backward) per stage over every round's samples."""
        return [(spec, mbs, summarize(f), summarize(b)) for (spec, mbs), (f, b) in zip(self.stages, self.samples) if f]
