"""The fast path's in-flight table: per schedule key and pipeline rank, the microbatches of each
model chunk held at the moments that can be the rank's memory peak, from ``parsim.costs``.

``costs.peak_moments`` lists those moments (the starts of a rank's backwards, counted from the
schedule generators; ``costs.peak_held`` their held counts). The fast path weighs them with each chunk's bytes per plan, so the table
keeps only what can win for some chunk bytes:

* a rank whose chunks all weigh the same (every rank of a non-interleaved schedule; interleaved
  ranks with equal layer counts that hold neither the embedding nor the head) peaks with the
  most chunks in flight: one row, ``costs.inflight_chunks`` on the first chunk;
* any other rank gets its moments minus those another one with the same chunk's backward
  starting holds at least as much of in every chunk (each backward holds its own chunk's
  working set, which differs where the chunks' layers, embedding or head do).

The held counts repeat every p v passes once every rank has a full period of steady state after
its warm-up (at most (v + 1) p forwards, ``schedules.warmup_forwards``): 5 p microbatches have
the same moments as any more (``canonical_microbatches``), which keeps the keys few.

The schedules walked action by action (``costs.inflight.generated_moments``: the split-backward
family and looped BFS) give rows of three parts, each padded to the table's chunk width: held
microbatches per chunk, microbatches per chunk holding their output gradients (I done, W not),
then the kind of pass starting there (``KIND_OF``) and its chunk; their moments repeat past
``fast.dag.canonical_microbatches`` (tests/test_fast_split.py), looped BFS's grow with m and
come in closed form. Rows of the counted schedules carry zeros in the second part and B as kind.
"""
from __future__ import annotations

import numpy as np

from parsim.costs import inflight_chunks, peak_held
from parsim.costs.inflight import COUNTED, generated_moments
from parsim.schedules import chunk_of_pass

from .dag import canonical_microbatches as graph_microbatches

# kind column of a moment row: the pass that starts there (its working set, ``fast.memory``);
# the first stage's I runs nothing and its W the whole backward (``costs.split_backward``)
KIND_B, KIND_I, KIND_W, KIND_FIRST_I, KIND_FIRST_W = range(5)
KIND_OF = {"B": KIND_B, "I": KIND_I, "W": KIND_W}
FIRST_STAGE_KIND = {"B": KIND_B, "I": KIND_FIRST_I, "W": KIND_FIRST_W}


def canonical_microbatches(pp, m):
    """A microbatch count with the same peak moments as ``m`` under the interleaved schedule
    (ints or numpy arrays): at most 5 pp (module docstring)."""
    return np.minimum(m, 5 * pp)


def rank_rows(schedule: str, pp: int, m: int, vpp: int, rank: int, uneven: bool) -> list[list[float]]:
    """Held microbatches per chunk, then the chunk whose backward starts (one list of vpp + 1 per
    row), at the rank's candidate peaks."""
    if not uneven:
        return [[float(inflight_chunks(schedule, pp, m, rank, vpp))] + [0.0] * (vpp - 1) + [0.0]]
    held = peak_held(schedule, pp, m, vpp, rank)
    rows = np.array([list(h) + [chunk_of_pass(k, pp, vpp, backward=True)] for k, h in enumerate(held)],
                    dtype=np.float64)
    return _non_dominated(np.array(list({r.tobytes(): r for r in rows}.values()))).tolist()


def _non_dominated(rows: np.ndarray) -> np.ndarray:
    """Drop a row (held per chunk, then the running chunk) when another with the same running
    chunk holds at least as much of every chunk; of equal rows the first stays."""
    held, chunk = rows[:, :-1], rows[:, -1]
    ge = (held[None, :, :] >= held[:, None, :]).all(axis=2) & (chunk[None, :] == chunk[:, None])
    differs = (held[None, :, :] != held[:, None, :]).any(axis=2)     # ge[i, j]: row j >= row i everywhere
    earlier = np.arange(len(rows))[None, :] < np.arange(len(rows))[:, None]
    return rows[~(ge & (differs | earlier)).any(axis=1)]


def moment_microbatches(schedule: str, pp, m, vpp):
    """The microbatch count of a schedule key whose moments equal ``m``'s (ints)."""
    if schedule == "interleaved":
        return int(canonical_microbatches(pp, m))
    if schedule in COUNTED or schedule == "looped-bfs":
        return m
    return graph_microbatches(schedule, pp, m, vpp)


def walked_rows(schedule: str, pp: int, m: int, vpp: int, rank: int, width: int) -> np.ndarray:
    """Rows (held, kept, kind; module docstring) of a rank under a walked schedule."""
    moments = generated_moments(schedule, pp, m, vpp, rank)
    kinds = FIRST_STAGE_KIND if rank == 0 else KIND_OF             # stage 0: rank 0's chunk 0
    out = np.zeros((len(moments), 2 * width + 2), dtype=np.float64)
    if moments:
        out[:, :vpp] = [mo.held for mo in moments]
        out[:, width:width + vpp] = [mo.kept or (0,) * vpp for mo in moments]
        out[:, -2] = [(kinds if mo.chunk == 0 else KIND_OF)[mo.kind] for mo in moments]
        out[:, -1] = [mo.chunk for mo in moments]
    return out


def moment_table(keys: list[tuple[str, int, int, int]], width: int, uneven) -> tuple[np.ndarray, np.ndarray,
                                                                                        np.ndarray]:
    """For (schedule, pp, m, vpp) keys: stacked rows (``2 width + 2`` columns: module docstring),
    and per key and rank the first row and the row count. Rank r of key i: rows
    ``table[start[off[i] + r] : start[off[i] + r] + count[off[i] + r]]``. ``uneven(schedule, pp,
    vpp)`` lists, per rank, whether its chunks may hold different bytes."""
    rows, start, count, total = [], [], [], 0
    for schedule, pp, m, vpp in keys:
        walked = schedule not in COUNTED
        needs = uneven(schedule, pp, vpp) if vpp > 1 and not walked else [False] * pp
        for r in range(pp):
            if walked:
                held = walked_rows(schedule, pp, m, vpp, r, width)
            else:
                counted = np.array(rank_rows(schedule, pp, m, vpp, r, needs[r]), dtype=np.float64)
                held = np.zeros((len(counted), 2 * width + 2), dtype=np.float64)
                held[:, :vpp], held[:, -1] = counted[:, :vpp], counted[:, -1]    # kind column: KIND_B (0)
            start.append(total)
            count.append(len(held))
            total += len(held)
            rows.append(held)
    table = np.concatenate(rows) if rows else np.zeros((0, 2 * width + 2), dtype=np.float64)
    return table, np.array(start, dtype=np.int64), np.array(count, dtype=np.int64)
