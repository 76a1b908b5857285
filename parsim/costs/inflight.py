"""What a pipeline schedule keeps in flight: microbatches per model chunk at the moments that
can be a rank's memory peak. Counted from ``parsim.schedules`` (the warm-up count and the chunk
order the generators run), never restated here.

A device allocates a chunk's activations when its forward starts and frees them when its
backward ends (``parsim.sim.memory``), and a backward adds its working set and recompute
transient while it runs. So a rank's peak is at the start of one of its backwards
(``schedules.held_at_backwards``): a forward start holds no more (the backward that follows it
in its 1F1B pair holds the same; warm-up forwards hold fewer), and after the first p v
backwards the held counts only repeat (steady state: forwards and backwards both advance one
full cycle of the chunks) or fall (cool-down). With one chunk per rank (every schedule but the
interleaved one) they never rise after the first backward: each later one frees a microbatch
and at most one forward replaces it.
"""
from __future__ import annotations

from typing import NamedTuple

from parsim.schedules import chunk_of_pass, held_at_backwards, warmup_forwards


class Moment(NamedTuple):
    """The start of a rank's backward: the chunk it runs and the microbatches held per chunk."""
    chunk: int
    held: tuple[int, ...]


def inflight_microbatches(schedule: str, pp: int, m: int, pp_rank: int, vpp: int = 1) -> float:
    """Microbatches whose activations a pipeline rank holds at its peak, in units of the
    rank's full set of layers (so interleaving counts chunks / vpp): its warm-up forwards and
    the first steady-state one, at most all m v (``schedules.warmup_forwards``).

    naive: 1; GPipe: m (Huang et al. 2019); 1F1B: min(p - i, m) (Narayanan et al. 2021 Sec. 2.2.1);
    interleaved: Megatron-LM warm-up of (p - i - 1) * 2 + (v - 1) * p chunk-forwards, +1 in
    steady state, capped at m*v chunks (all m*v when m == p: Megatron-LM then runs every
    forward first); each chunk is 1/v of the rank's layers. Exact only for equal chunks:
    ``peak_moments`` counts chunk by chunk.
    """
    return inflight_chunks(schedule, pp, m, pp_rank, vpp) / vpp


def inflight_chunks(schedule: str, pp: int, m: int, pp_rank: int, vpp: int = 1) -> int:
    """Chunk-microbatches (one model chunk's activations for one microbatch) a rank holds at its
    peak: its warm-up forwards and the first steady-state one, at most all m v."""
    return min(warmup_forwards(schedule, pp_rank, pp, m, vpp) + 1, m * vpp)


def peak_moments(schedule: str, pp: int, m: int, vpp: int, pp_rank: int) -> list[Moment]:
    """The moments that can be the rank's memory peak, in the order they happen: the starts of
    its first min(p v, m v) backwards, of the first one with one chunk (module docstring)."""
    return [Moment(chunk_of_pass(k, pp, vpp, backward=True), held)
            for k, held in enumerate(peak_held(schedule, pp, m, vpp, pp_rank))]


def peak_held(schedule: str, pp: int, m: int, vpp: int, pp_rank: int) -> list[tuple[int, ...]]:
    """The held counts of ``peak_moments`` alone."""
    return held_at_backwards(schedule, pp_rank, pp, m, vpp, min(pp * vpp, m * vpp) if vpp > 1 else 1)
