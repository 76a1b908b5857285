"""Memory of each simulated device over the step: allocations and frees by category.

The engine calls ``MemoryTimeline.change`` as actions run; the peak and its breakdown are read
off that timeline. This is the event-driven counterpart of the analytic
``parsim.costs.memory_by_stage`` (which multiplies per-microbatch bytes by a closed-form count
of microbatches in flight); tests/test_sim_memory.py holds the two equal.

What is allocated when (categories of ``parsim.costs.CATEGORIES``; the bytes are
``costs.static_bytes`` and ``costs.stage_footprints``, the rules of ``costs.footprint``):

* step start: parameters, gradients (Megatron-LM's persistent fp32 main-grad buffer) and
  optimizer states of the rank, sharded as ZeRO shards them (Rajbhandari et al. 2020 Sec. 5),
  minus what ZeRO-Offload keeps on the host (Ren et al. 2021); with offload one gradient
  bucket of pinned staging memory (``other``; DeepSpeed allocates it up front). FSDP2 (ZeRO-2/3)
  makes its gradient shards in the rank's first backward (``costs.unmade_grads``): allocated at
  its start, which holds ``stage_footprints(first=True)``.
* forward start: the stage's stored activations for one microbatch (Korthikanti et al. 2022,
  Table 2, per layer and recompute policy; embedding dropout mask on stage 0; final-norm input
  and fp32 logits on the last stage; the output sent on the others); freed when the backward
  (W for zero-bubble) ends.
* a backward holds its own virtual stage's working set (``costs.activations.backward_working_bytes``: the largest
  weight gradient and the MLP's activation gradients; the head's or the embedding's on the
  last and first stages) (``other``) for the length of the action.
* a backward (or I) that recomputes a layer fully briefly holds that layer's full activations
  again on top of its stored input (``other``), for the length of the action.
* ZeRO-3 (and parameter offload): the gathered full parameters of the current and the
  prefetched layer (``other``) for the length of every action.
* the optimizer step (after the rank's last backward): its temporaries (``other``; an eager
  AdamW's two fp32 copies of the largest parameter tensor it steps) for its length; FSDP2's
  ZeRO-2 parameters, resharded by the last backward, are freed before it
  (``costs.memory.optimizer_step_bytes``).
"""
from __future__ import annotations

from parsim.costs import (CATEGORIES, StageFootprint, footprints_apart, optimizer_step_bytes, reduce_scatter_copies,
                          stage_footprints, static_bytes, unmade_grads)

__all__ = ["PARAMS", "GRADS", "OPTIMIZER", "ACTIVATIONS", "OTHER", "MemoryTimeline", "StageFootprint",
           "optimizer_step_bytes", "reduce_scatter_copies", "stage_footprints", "static_bytes", "unmade_grads",
           "footprints_apart"]

PARAMS, GRADS, OPTIMIZER, ACTIVATIONS, OTHER = range(len(CATEGORIES))


class MemoryTimeline:
    """One device's bytes per category over the step, and its peak.

    Changes are kept as (t, category, delta) and the state after each is rebuilt on demand
    (``samples``): a 1T-parameter step makes ~10^5 changes per run."""

    def __init__(self, static: tuple[float, ...], unmade: float = 0.0):
        # gradient states made only by the first backward (``costs.unmade_grads``): off the start,
        # allocated by ``make_grads``
        static = tuple(b - unmade if c == GRADS else b for c, b in enumerate(static))
        self.unmade = unmade
        self.start = tuple(static)
        self.level = list(static)
        self.total = sum(static)
        self.changes: list[tuple[float, int, float]] = []
        self.peak, self.peak_time, self.peak_breakdown = self.total, 0.0, self.start

    starting_with = classmethod(lambda cls, static, unmade=0.0: cls(static, unmade))

    def make_grads(self, t: float) -> None:
        """The first backward's start: the gradient states held back at the step's start."""
        if self.unmade:
            self.change(t, GRADS, self.unmade)
            self.unmade = 0.0

    def change(self, t: float, category: int, delta: float) -> None:
        self.level[category] += delta
        self.total += delta
        self.changes.append((t, category, delta))
        if self.total > self.peak:
            self.peak, self.peak_time, self.peak_breakdown = self.total, t, tuple(self.level)

    @property
    def samples(self) -> list[tuple[float, tuple[float, ...]]]:
        """(t, bytes per category) at the start and after every change."""
        level = list(self.start)
        out = [(0.0, self.start)]
        for t, category, delta in self.changes:
            level[category] += delta
            out.append((t, tuple(level)))
        return out
