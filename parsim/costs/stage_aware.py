"""Stage-aware recomputation (Merak, Lai et al. 2023, Sec. 5.2): recompute only as many
layers on each pipeline stage as its memory requires.

Under 1F1B, pipeline rank i holds min(p - i, m) microbatches of activations at its peak
(Narayanan et al. 2021, Sec. 2.2.1): the first stage p of them, the last one. Recomputing
every layer everywhere (full recomputation, Chen et al. 2016) therefore wastes the later
stages' spare memory on ~1/3 extra compute (one more forward per backward). Merak gives each
stage the fewest recomputed layers that make it fit; the rest keep their activations.

Per virtual stage v, ``recompute_layers[v]`` of its layers recompute fully (its first ones,
``parsim.costs.recompute.layer_recompute``); memory is ``memory_by_stage`` with
``recompute=stage-aware``. A rank's memory depends only on how many of its layers recompute
(all layers of a plan have the same activation bytes), so the minimum is found per rank
and, with vpp > 1, given to its earliest virtual stages first (they hold the most
microbatches in flight in interleaved 1F1B). The least count is ``fewest_recomputed``, the
bisection the partitioner runs too.
"""
from __future__ import annotations

from parsim.specs import ClusterSpec, ModelSpec, Plan, SpecError, stage_layers

from .memory import device_capacity, memory_by_stage
from .recompute import fewest_recomputed
from .stack import apply_stack


def stage_aware_recompute_layers(model: ModelSpec, plan: Plan, cluster: ClusterSpec,
                                 memory_budget: float | None = None) -> tuple[int, ...]:
    """The fewest fully recomputed layers per virtual stage such that every pipeline rank fits
    ``memory_budget`` bytes (default: the device capacity). Raises SpecError naming
    ``recompute`` when even recomputing every layer does not fit."""
    budget = device_capacity(apply_stack(model, cluster, plan)[1]) if memory_budget is None else float(memory_budget)
    if budget <= 0:
        raise SpecError("memory_budget", memory_budget, "a positive number of bytes")
    base = plan.replace(recompute="stage-aware")
    layers = stage_layers(model, base)
    counts = [0] * len(layers)
    for rank in range(plan.pp):
        stages = [rank + v * plan.pp for v in range(plan.vpp)]
        total = sum(layers[s] for s in stages)

        def rank_bytes(k: int) -> float:
            return memory_by_stage(model, base.replace(recompute_layers=_spread(k, stages, layers, counts)),
                                   cluster)[rank].total

        least = fewest_recomputed(total, rank_bytes, budget)
        if least is None:
            raise SpecError("recompute", "stage-aware",
                            f"a plan whose pipeline rank {rank} fits even with every layer recomputed: it needs "
                            f"{rank_bytes(total) / 2**30:.2f} GiB of {budget / 2**30:.2f} GiB (more pp/tp/zero "
                            "or a smaller mbs)")
        counts = _spread(least, stages, layers, counts)
    return tuple(counts)


def _spread(k: int, stages: list[int], layers: list[int], counts: list[int]) -> list[int]:
    """``counts`` with k recomputed layers put on ``stages`` (earliest virtual stage first)."""
    out = list(counts)
    for s in stages:
        out[s] = min(k, layers[s])
        k -= out[s]
    return out
