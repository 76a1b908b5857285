"""Activations in flight per model chunk for the interleaved schedule, exactly.

``costs.inflight_microbatches`` counts a rank's held chunks; that is exact when the rank's
chunks hold equal activations, but the first virtual stage also keeps the embedding's and the
last one the output head's (fp32 logits: often the largest single activation), and how many
microbatches of *those* chunks are alive at once depends on the order the rank runs them.
A device allocates a chunk's activations when its forward starts and frees them when its
backward ends (the SimPy engine's ``memory`` module), so on one rank the held count of chunk
c after f forwards and b backwards is

    F_c(f) - B_c(b),   F_c(f) = p floor(f / pv) + clip(f mod pv - c p, 0, p)
                       B_c(b) = p floor(b / pv) + clip(b mod pv - (v - 1 - c) p, 0, p)

(Megatron-LM's interleaved order: forwards cycle chunks 0..v-1 in groups of p microbatches,
backwards cycle v-1..0; ``parsim.schedules.generators``). The rank runs W warm-up forwards
(``warmup_forwards``), then forward/backward pairs, then the remaining backwards, so the
peak sits at a forward start after warm-up or during a backward of the first periods; the
count pattern repeats every p v passes. This module lists, per rank, the non-dominated count
vectors of those moments; the kernel weighs them with each chunk's bytes.
"""
from __future__ import annotations

import numpy as np

from parsim.schedules import warmup_forwards

FORWARD_MOMENT, BACKWARD_MOMENT = 0.0, 1.0


def _held(f: np.ndarray, b: np.ndarray, pp: int, vpp: int) -> np.ndarray:
    """(moments, vpp) held microbatches per chunk after f forwards and b backwards started/ended."""
    period = pp * vpp
    c = np.arange(vpp)[None, :]
    fwd = pp * (f // period)[:, None] + np.clip((f % period)[:, None] - c * pp, 0, pp)
    bwd = pp * (b // period)[:, None] + np.clip((b % period)[:, None] - (vpp - 1 - c) * pp, 0, pp)
    return fwd - bwd


def canonical_microbatches(pp, m, vpp):
    """A microbatch count with the same peak moments as ``m`` (ints or numpy arrays): once
    every rank has a full period (p v passes) of steady state after its warm-up, more
    microbatches only repeat it."""
    longest_warmup = 2 * (pp - 1) + (vpp - 1) * pp
    groups = -(-(longest_warmup + 2 * pp * vpp) // (pp * vpp)) + 1
    return np.minimum(m, pp * groups)


def rank_moments(pp: int, m: int, vpp: int, rank: int) -> np.ndarray:
    """Rows ``[moment kind, held count of chunk 0..vpp-1]`` that can be the rank's memory peak
    (forward moments: right after a forward allocates; backward moments: during a backward,
    before it frees, when a recompute transient may sit on top). The steady state repeats
    every p v passes, so one period after the warm-up is enough; the cool-down only frees."""
    total = m * vpp
    w = warmup_forwards("interleaved", rank, pp, m, vpp)
    span = pp * vpp
    j = np.arange(min(w, total - 1), min(w + span, total))        # forward j starts: j+1 done, j-w backwards done
    fwd = _held(j + 1, np.maximum(j - w, 0), pp, vpp)
    k = np.arange(0, min(span, total))                              # backward k runs: k done before it
    bwd = _held(np.minimum(w + k + 1, total), k, pp, vpp)
    rows = np.concatenate([np.column_stack([np.full(len(fwd), FORWARD_MOMENT), fwd]),
                           np.column_stack([np.full(len(bwd), BACKWARD_MOMENT), bwd])]).astype(np.float64)
    unique = np.array(list({r.tobytes(): r for r in rows}.values()))     # the pattern repeats: few distinct
    return _non_dominated(unique)


def _non_dominated(rows: np.ndarray) -> np.ndarray:
    """Drop a row when another of the same kind, or a backward one, holds at least as much of
    every chunk (a backward moment also carries the recompute transient); of equal rows the
    first stays."""
    ge = (rows[None, :, :] >= rows[:, None, :]).all(axis=2)      # ge[i, j]: row j >= row i everywhere
    differs = (rows[None, :, :] != rows[:, None, :]).any(axis=2)
    earlier = np.arange(len(rows))[None, :] < np.arange(len(rows))[:, None]
    return rows[~(ge & (differs | earlier)).any(axis=1)]


def moment_table(keys: np.ndarray, width: int, uneven) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For (pp, m, vpp) keys: stacked moment rows (padded to ``1 + width`` columns), and per
    key and rank the first row and the row count. Rank r of key i: rows
    ``table[start[off[i] + r] : start[off[i] + r] + count[off[i] + r]]``.

    ``uneven(pp, vpp)`` lists, per rank, whether its chunks hold different bytes (the first
    and last ranks always do: embedding, head). The other ranks get no rows: all their chunks
    weigh the same, so their peak is simply the most chunks in flight (``warmup_chunks``)."""
    rows, start, count = [], [], []
    n = 0
    for pp, m, vpp in keys.tolist():
        needs = uneven(pp, vpp) if vpp > 1 else [False] * pp
        for r in range(pp):
            mom = rank_moments(pp, m, vpp, r) if needs[r] else np.zeros((0, 1 + vpp))
            padded = np.zeros((len(mom), 1 + width))
            padded[:, :mom.shape[1]] = mom
            rows.append(padded)
            start.append(n)
            count.append(len(mom))
            n += len(mom)
    table = np.concatenate(rows) if rows else np.zeros((0, 1 + width))
    return table, np.array(start, dtype=np.int64), np.array(count, dtype=np.int64)
