"""The rules of ``parsim.costs`` the fast path's kernels run, compiled by numba from their source.

``costs.zero`` (ZeRO sharding and which DP collectives a stage runs) and ``costs.overlap`` (ZeRO
collectives beside compute) are registered with numba (``register_jitable``: the plain functions
stay callable from Python, and jitted code that calls them compiles them in);
``schedules.warmup_chunks`` (the forwards before a rank's first backward) is registered too;
``costs.footprint``'s memory rules, which call it, and ``costs.split_backward``'s overlapped F&B
slot are compiled here.
"""
from __future__ import annotations

import numba
from numba.extending import register_jitable

from parsim.costs import footprint, overlap, split_backward, zero
from parsim.schedules import generators

for _rule in (zero.zero_shard, zero.gathers_layers, zero.scatters_every_backward, zero.reduce_scatters_buckets,
              zero.gathers_after_step, overlap.scatter_overlap, overlap.paid_beside_drain, overlap.queued_behind,
              overlap.zero3_forward_layer, overlap.zero3_backward_layer, generators.warmup_chunks):
    register_jitable(_rule)
warmup_chunks = generators.warmup_chunks
scatter_overlap = overlap.scatter_overlap
queued_behind = overlap.queued_behind
paid_beside_drain = overlap.paid_beside_drain
zero3_forward_layer = overlap.zero3_forward_layer
zero3_backward_layer = overlap.zero3_backward_layer
gathers_layers = zero.gathers_layers
scatters_every_backward = zero.scatters_every_backward
reduce_scatters_buckets = zero.reduce_scatters_buckets

stack_state_bytes = numba.njit(cache=True)(footprint.stack_state_bytes)
model_states = numba.njit(cache=True)(footprint.model_states)
offload_staging = numba.njit(cache=True)(footprint.offload_staging)
gathered_layers = numba.njit(cache=True)(footprint.gathered_layers)
optimizer_temporaries = numba.njit(cache=True)(footprint.optimizer_temporaries)
optimizer_step_peaks = numba.njit(cache=True)(footprint.optimizer_step_peaks)
stash_bytes = numba.njit(cache=True)(footprint.stash_bytes)
held_bytes = numba.njit(cache=True)(footprint.held_bytes)
backward_working = numba.njit(cache=True)(footprint.backward_working)
split_kept = numba.njit(cache=True)(footprint.split_kept)
input_grad_end = numba.njit(cache=True)(footprint.input_grad_end)
weight_working = numba.njit(cache=True)(footprint.weight_working)
overlapped_time = numba.njit(cache=True)(split_backward.overlapped_time)
