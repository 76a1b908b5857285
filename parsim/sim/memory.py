"""Memory of each simulated device over the step: allocations and frees by category.

The engine calls ``MemoryTimeline.change`` as actions run; the peak and its breakdown are read
off that timeline. This is the event-driven counterpart of the analytic
``parsim.costs.memory_by_stage`` (which multiplies per-microbatch bytes by a closed-form count
of microbatches in flight); tests/test_sim_memory.py holds the two equal.

What is allocated when (categories of ``parsim.costs.CATEGORIES``):

* step start: parameters, gradients (Megatron-LM's persistent fp32 main-grad buffer) and
  optimizer states of the rank, sharded as ZeRO shards them (Rajbhandari et al. 2020 Sec. 5),
  minus what ZeRO-Offload keeps on the host (Ren et al. 2021); with offload one gradient
  bucket of pinned staging memory (``other``; DeepSpeed allocates it up front).
* forward start: the stage's stored activations for one microbatch (Korthikanti et al. 2022,
  Table 2, per layer and recompute policy; embedding dropout mask on stage 0; final-norm input
  and fp32 logits on the last stage; the output sent on the others); freed when the backward
  (W for zero-bubble) ends.
* a backward holds its working set (``costs.activations.backward_working_bytes``: the largest
  weight gradient and the MLP's activation gradients; the head's or the embedding's on the
  last and first stages) (``other``) for the length of the action.
* a backward (or I) that recomputes a layer fully briefly holds that layer's full activations
  again on top of its stored input (``other``), for the length of the action.
* ZeRO-3 (and parameter offload): the gathered full parameters of the current and the
  prefetched layer (``other``) for the length of every action.
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.costs import CATEGORIES, layer_activation_bytes, layer_params, stage_params, state_bytes
from parsim.costs.memory import chunk_activation_bytes, fsdp2_bytes, rank_backward_working, recomputes_fully
from parsim.specs import ModelSpec, Plan

PARAMS, GRADS, OPTIMIZER, ACTIVATIONS, OTHER = range(len(CATEGORIES))


@dataclass(frozen=True)
class StageFootprint:
    """Bytes one virtual stage allocates per microbatch, on one device."""
    activations: float        # stored from forward start to backward (or W) end
    recompute: float          # extra during a backward: its working set (weight and activation
                              # gradients), a fully recomputed layer's activations,
                              # FSDP2's unsharded layer gradients + reduce-scatter input
    gathered_params: float    # ZeRO-3: full parameters of two layers during every action


def stage_footprints(model: ModelSpec, plan: Plan, fsdp2: bool = False) -> list[StageFootprint]:
    """``fsdp2``: ZeRO-2/3 as FSDP2 runs them (``costs.memory.fsdp2_bytes``)."""
    in_backward = fsdp2_bytes(model, plan, 0.0)[1] if fsdp2 else 0.0
    sb = state_bytes(plan.dtype)
    gathered = 2 * layer_params(model, plan.tp) * sb.param if (plan.zero >= 3 or plan.offload == "optimizer+params") else 0.0
    out = []
    for s in range(plan.pp * plan.vpp):
        act = chunk_activation_bytes(model, plan, s)
        working = rank_backward_working(model, plan, s % plan.pp, weight_grads=in_backward == 0.0)
        full = recomputes_fully(model, plan, s)
        extra = (layer_activation_bytes(model, plan, "none") - layer_activation_bytes(model, plan, "full")) if full else 0.0
        out.append(StageFootprint(act, extra + in_backward + working, gathered))
    return out


def static_bytes(model: ModelSpec, plan: Plan, pp_rank: int, fsdp2: bool = False) -> tuple[float, ...]:
    """(params, grads, optimizer, activations, other) a rank holds for the whole step
    (``fsdp2``: plus what FSDP2 keeps, ``costs.memory.fsdp2_bytes``)."""
    sb = state_bytes(plan.dtype)
    n = stage_params(model, plan)[pp_rank]
    dp = plan.dp
    params = n * sb.param / (dp if plan.zero >= 3 else 1)
    grads = n * sb.grad / (dp if plan.zero >= 2 else 1)
    optimizer = n * sb.optimizer / (dp if plan.zero >= 1 else 1)
    other = 0.0
    if plan.offload != "none":
        grads = optimizer = 0.0
        other = float(plan.dp_bucket_bytes)
    if plan.offload == "optimizer+params":
        params = 0.0
    if fsdp2:
        params += fsdp2_bytes(model, plan, n)[0]
    return (params, grads, optimizer, 0.0, other)


class MemoryTimeline:
    """One device's bytes per category over the step, and its peak.

    Changes are kept as (t, category, delta) and the state after each is rebuilt on demand
    (``samples``): a 1T-parameter step makes ~10^5 changes per run."""

    def __init__(self, static: tuple[float, ...]):
        self.start = tuple(static)
        self.level = list(static)
        self.total = sum(static)
        self.changes: list[tuple[float, int, float]] = []
        self.peak, self.peak_time, self.peak_breakdown = self.total, 0.0, self.start

    starting_with = classmethod(lambda cls, static: cls(static))

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
