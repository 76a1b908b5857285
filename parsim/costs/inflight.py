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

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from parsim.schedules import (OVERLAP_F_B, Schedule, build_schedule_for_plan, cached_schedule, chunk_of_pass,
                              held_at_backwards, warmup_forwards)
from parsim.specs import Plan

# Schedules whose peak moments come from closed-form counts (``peak_moments``); every other one
# (the split-backward family, looped BFS, CSV schedules) is walked action by action
# (``schedule_moments``).
COUNTED = ("naive", "gpipe", "1f1b", "interleaved")


class Moment(NamedTuple):
    """The start of a rank's backward: the chunk it runs and the microbatches held per chunk."""
    chunk: int
    held: tuple[int, ...]


class PassMoment(NamedTuple):
    """The start of a rank's backward pass in a walked schedule (``schedule_moments``): as
    ``Moment``, and the kind of pass ("B", "I" or "W") and, per chunk, the microbatches whose I
    has ended and whose W has not (holding their output gradients)."""
    chunk: int
    held: tuple[int, ...]
    kind: str
    kept: tuple[int, ...]


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


def rank_inflight(plan: Plan, pp_rank: int) -> float:
    """``inflight_microbatches`` of a pipeline rank under any schedule of the plan: for the walked
    ones the most chunk-microbatches it holds at one of its moments, over vpp (the output
    gradients an I leaves until its W are not counted)."""
    if plan.schedule in COUNTED:
        return inflight_microbatches(plan.schedule, plan.pp, plan.num_microbatches, pp_rank, plan.vpp)
    return max((sum(moment.held) for moment in rank_moments(plan, pp_rank)), default=1) / plan.vpp


def rank_moments(plan: Plan, pp_rank: int) -> list[Moment] | list[PassMoment]:
    """The moments that can be a pipeline rank's memory peak under the plan's schedule."""
    if plan.schedule in COUNTED:
        return peak_moments(plan.schedule, plan.pp, plan.num_microbatches, plan.vpp, pp_rank)
    if plan.schedule_file is not None:
        return schedule_moments(build_schedule_for_plan(plan), pp_rank)
    return generated_moments(plan.schedule, plan.pp, plan.num_microbatches, plan.vpp, pp_rank)


def generated_moments(name: str, pp: int, m: int, vpp: int, pp_rank: int) -> list[PassMoment]:
    """``schedule_moments`` of a generated schedule. Looped BFS in closed form: a rank runs every
    forward of every chunk before its first backward, then the backwards chunk by chunk from its
    last, so the start of chunk c's first backward holds m microbatches of chunks 0..c and none
    of the later ones (the walk, without building m v pp actions)."""
    if name == "looped-bfs":
        return [PassMoment(c, (m,) * (c + 1) + (0,) * (vpp - 1 - c), "B", (0,) * vpp) for c in reversed(range(vpp))]
    return list(_generated_moments(name, pp, m, vpp, pp_rank))


@lru_cache(maxsize=4096)
def _generated_moments(name: str, pp: int, m: int, vpp: int, pp_rank: int) -> tuple[PassMoment, ...]:
    return tuple(schedule_moments(cached_schedule(name, pp, m, vpp), pp_rank))


def schedule_moments(schedule: Schedule, pp_rank: int) -> list[PassMoment]:
    """Walk a rank's actions in order (any schedule of the IR): a forward holds its chunk's
    activations from its start; a B frees them at its end; an I adds its output gradients at its
    end; a W frees both at its end (``costs.split_backward``). The candidate peaks are the starts
    of B, I and W (a forward's start holds no more than the next of them: every forward of a rank
    is followed by its own backward there). An overlapped F&B slot allocates its forward first.
    Moments another of the same kind and chunk holds at least as much of, chunk by chunk, are
    dropped."""
    stages = schedule.stages_of_rank(pp_rank)
    chunk = {s: c for c, s in enumerate(stages)}
    held, kept = [0] * len(stages), [0] * len(stages)
    out: dict[tuple, None] = {}
    for item in schedule.actions[pp_rank]:
        if item.kind == OVERLAP_F_B:
            held[chunk[item.forward.stage]] += 1
            item = item.backward
        kind, stage, _ = item
        if kind == "F":
            held[chunk[stage]] += 1
            continue
        if kind not in ("B", "I", "W"):
            continue
        c = chunk[stage]
        out[(c, tuple(held), kind, tuple(kept))] = None
        if kind == "B":
            held[c] -= 1
        elif kind == "I":
            kept[c] += 1
        else:
            held[c] -= 1
            kept[c] -= 1
    return [PassMoment(*key) for key in _undominated(list(out))]


def _undominated(keys: list[tuple]) -> list[tuple]:
    """Keys (chunk, held, kind, kept) less those another key of the same chunk and kind holds at
    least as much of in every count (keys arrive distinct)."""
    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault((key[0], key[2]), []).append(i)
    counts = np.array([key[1] + key[3] for key in keys], dtype=np.int64).reshape(len(keys), -1)
    out = []
    for members in groups.values():
        c = counts[members]
        ge = (c[None, :, :] >= c[:, None, :]).all(axis=2)     # ge[i, j]: key j >= key i everywhere
        np.fill_diagonal(ge, False)
        out += [i for i, dominated in zip(members, ge.any(axis=1)) if not dominated]
    return [keys[i] for i in sorted(out)]
