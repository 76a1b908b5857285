"""Step metrics read off the events of a Trace: step time, busy/idle, bubble, exposed comm, MFU/HFU.

All functions are pure and take SI units (seconds, FLOP). The step window is
``[min start, max end]`` over every event of the trace, the same window for every rank.

Two views of the compute stream are used, on purpose:

* **occupied** = union of *all* compute-stream intervals, whole-action events (``layer == -1``)
  included. A rank is idle (in the pipeline bubble) only outside every action. This is what
  ``busy_time`` / ``idle_time`` / ``bubble_fraction`` measure, so a uniform GPipe/1F1B trace with
  zero comm gives the textbook bubble (p-1)/(m+p-1) (Huang et al. 2019, GPipe Sec. 2.3;
  Narayanan et al. 2021, Sec. 2.2.1).
* **working** = the finest compute events: a whole-action event that contains per-layer
  compute events (``layer >= 0``) on the same rank is replaced by them. Blocking TP
  collectives between two layers of one action thus show up as gaps. Exposed communication
  is comm time when the device is not *working*.

Interval arithmetic sorts once per (rank, stream) group, so every metric is O(n log n).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .events import Trace

EXPOSED_STREAMS = ("tp", "dp", "pp")


# ---------------------------------------------------------------- interval arithmetic

def merge_intervals(starts: np.ndarray, ends: np.ndarray, gap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted, disjoint ``(starts, ends)``; intervals closer than ``gap``
    are joined (``gap > 0`` is for drawing: gaps narrower than a pixel are invisible anyway)."""
    starts = np.asarray(starts, dtype=float)
    ends = np.asarray(ends, dtype=float)
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)                  # furthest end seen so far
    new = s[1:] > reach[:-1] + gap                    # a new segment starts where nothing reaches it
    first = np.concatenate(([True], new))
    last = np.concatenate((new, [True]))
    return s[first], reach[last]


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    s, e = merge_intervals(starts, ends)
    return float(np.sum(e - s))


def intersect_intervals(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
                        ) -> tuple[np.ndarray, np.ndarray]:
    """The intervals covered by both ``a`` and ``b`` (each any list of intervals)."""
    (as_, ae), (bs, be) = merge_intervals(*a), merge_intervals(*b)
    cuts = np.unique(np.concatenate((as_, ae, bs, be)))
    if cuts.size < 2:
        return cuts[:0], cuts[:0]
    lo, hi = cuts[:-1], cuts[1:]
    mid = (lo + hi) / 2
    in_a = np.searchsorted(as_, mid, side="right") > np.searchsorted(ae, mid, side="right")
    in_b = np.searchsorted(bs, mid, side="right") > np.searchsorted(be, mid, side="right")
    both = in_a & in_b
    return merge_intervals(lo[both], hi[both])


def complement(starts: np.ndarray, ends: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """The gaps of ``[lo, hi]`` not covered by the intervals (e.g. the idle time of a rank)."""
    s, e = merge_intervals(starts, ends)
    gs = np.concatenate(([lo], e))
    ge = np.concatenate((s, [hi]))
    gs, ge = np.maximum(gs, lo), np.minimum(ge, hi)
    keep = ge > gs
    return gs[keep], ge[keep]


# ---------------------------------------------------------------- events as columns

@dataclass(frozen=True)
class _Columns:
    """The events of one rank (or of the whole trace) as numpy arrays."""
    stream: np.ndarray        # object array of stream names
    layer: np.ndarray
    start: np.ndarray
    end: np.ndarray
    flops: np.ndarray

    def where(self, mask: np.ndarray) -> "_Columns":
        return _Columns(self.stream[mask], self.layer[mask], self.start[mask], self.end[mask], self.flops[mask])


def _by_rank(trace: Trace) -> dict[int, _Columns]:
    """The trace's events grouped by rank (one sort: O(n log n))."""
    ev = trace.events
    n = len(ev)
    rank = np.fromiter((e.rank for e in ev), np.int64, n)
    cols = _Columns(stream=np.array([e.stream for e in ev], dtype=object),
                    layer=np.fromiter((e.layer for e in ev), np.int64, n),
                    start=np.fromiter((e.start for e in ev), float, n),
                    end=np.fromiter((e.end for e in ev), float, n),
                    flops=np.fromiter((e.flops for e in ev), float, n))
    order = np.argsort(rank, kind="stable")
    ranks, first = np.unique(rank[order], return_index=True)
    bounds = np.append(first, n)
    return {int(r): cols.where(order[bounds[i]:bounds[i + 1]]) for i, r in enumerate(ranks)}


def containing_interval(env_s: np.ndarray, env_e: np.ndarray, fine_s: np.ndarray, fine_e: np.ndarray) -> np.ndarray:
    """For each fine interval, the index of the envelope (envelopes sorted by start, not
    overlapping each other) that contains it, or -1."""
    if env_s.size == 0:
        return np.full(fine_s.size, -1)
    idx = np.searchsorted(env_s, fine_s, side="right") - 1
    ok = (idx >= 0) & (fine_e <= env_e[np.maximum(idx, 0)] + 1e-12)
    return np.where(ok, idx, -1)


def working_intervals(starts: np.ndarray, ends: np.ndarray, layers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One rank's compute intervals at the finest level: whole-action events (layer -1) that
    hold per-layer events are replaced by them. A layer -1 event inside another one (the
    simulator's embedding / head segments of a detailed trace) is a fine event, not an action."""
    env = layers < 0
    idx = np.flatnonzero(env)
    order = np.lexsort((-ends[idx], starts[idx]))          # by start, the longer first on ties
    idx = idx[order]
    if idx.size:
        before = np.maximum.accumulate(np.concatenate(([-np.inf], ends[idx][:-1])))
        env[idx[ends[idx] <= before + 1e-12]] = False      # nested in an earlier action event
    env_s, env_e = starts[env], ends[env]
    order = np.argsort(env_s, kind="stable")
    env_s, env_e = env_s[order], env_e[order]
    fine_s, fine_e = starts[~env], ends[~env]
    refined = np.zeros(env_s.size, dtype=bool)
    inside = containing_interval(env_s, env_e, fine_s, fine_e)
    refined[inside[inside >= 0]] = True
    return (np.concatenate((env_s[~refined], fine_s)), np.concatenate((env_e[~refined], fine_e)))


# ---------------------------------------------------------------- time metrics

def step_time(trace: Trace) -> float:
    """Seconds from the first event's start to the last event's end."""
    return trace.step_time


def _busy(ranks: dict[int, _Columns]) -> dict[int, float]:
    out = {}
    for r, c in ranks.items():
        comp = c.stream == "compute"
        out[r] = union_length(c.start[comp], c.end[comp])
    return out


def busy_time(trace: Trace) -> dict[int, float]:
    """Per rank: seconds during which some compute-stream event is in progress."""
    return _busy(_by_rank(trace))


def idle_time(trace: Trace) -> dict[int, float]:
    """Per rank: step time minus busy time."""
    t = trace.step_time
    return {r: t - b for r, b in busy_time(trace).items()}


def bubble_fraction_by_rank(trace: Trace) -> dict[int, float]:
    """Per rank: idle time of the compute stream as a fraction of the step."""
    return _bubble_by_rank(busy_time(trace), trace.step_time)


def bubble_fraction(trace: Trace) -> float:
    """1 - sum_r busy_r / (n_ranks * step_time): idle device-time over total device-time.
    Uniform stages and zero comm give (p-1)/(m+p-1) (Narayanan et al. 2021, Sec. 2.2.1)."""
    return _bubble(busy_time(trace), trace.step_time)


def _bubble_by_rank(busy: dict[int, float], t: float) -> dict[int, float]:
    return {r: (t - b) / t if t > 0 else 0.0 for r, b in busy.items()}


def _bubble(busy: dict[int, float], t: float) -> float:
    if not busy or t <= 0:
        return 0.0
    return 1.0 - sum(busy.values()) / (len(busy) * t)


def _exposed(ranks: dict[int, _Columns], streams: tuple[str, ...]) -> dict[int, dict[str, float]]:
    """|comm ∪ working| - |working| = time comm is in flight and the device is not computing."""
    out: dict[int, dict[str, float]] = {}
    for r, c in ranks.items():
        comp = c.stream == "compute"
        ws, we = working_intervals(c.start[comp], c.end[comp], c.layer[comp])
        working = union_length(ws, we)

        def exposed(sel: np.ndarray) -> float:
            if not sel.any():
                return 0.0
            return union_length(np.concatenate((ws, c.start[sel])), np.concatenate((we, c.end[sel]))) - working

        out[r] = {s: exposed(c.stream == s) for s in streams}
        out[r]["total"] = exposed(np.isin(c.stream, list(streams)))
    return out


def exposed_comm_by_rank(trace: Trace, streams: tuple[str, ...] = EXPOSED_STREAMS) -> dict[int, dict[str, float]]:
    """Per rank and comm stream: seconds when that stream's comm is in progress and the compute
    stream is not working (overlapping comm intervals count once). ``"total"`` = all the
    given streams together (not the sum: two exposed streams at once count once)."""
    return _exposed(_by_rank(trace), streams)


def exposed_comm(trace: Trace, streams: tuple[str, ...] = EXPOSED_STREAMS) -> dict[str, float]:
    """Exposed comm seconds per stream (and ``"total"``), averaged over the trace's ranks."""
    return _mean_over_ranks(exposed_comm_by_rank(trace, streams), streams)


def _mean_over_ranks(by_rank: dict[int, dict[str, float]], streams: tuple[str, ...]) -> dict[str, float]:
    keys = (*streams, "total")
    n = len(by_rank)
    return {k: (sum(v[k] for v in by_rank.values()) / n if n else 0.0) for k in keys}


# ---------------------------------------------------------------- FLOPs, MFU, HFU

def hardware_flops(trace: Trace) -> float:
    """FLOPs executed in the trace (all its ranks), each counted once.

    A whole-action event's flops cover everything done inside it; per-layer events nested in
    it repeat part of that. So a per-layer compute event counts only when it is not inside a
    whole-action event that carries flops (traces that put flops only on layers still sum
    right). Recompute (``R``) FLOPs count: this is the numerator of HFU. Comm events carry
    no FLOPs (reductions are not counted, PaLM App. B)."""
    return _hardware_flops(_by_rank(trace))


def _hardware_flops(ranks: dict[int, _Columns]) -> float:
    total = 0.0
    for c in ranks.values():
        comp = c.stream == "compute"
        env, fine = c.where(comp & (c.layer < 0)), c.where(comp & (c.layer >= 0))
        order = np.argsort(env.start, kind="stable")
        env = env.where(order)
        inside = containing_interval(env.start, env.end, fine.start, fine.end)
        covered = (inside >= 0) & (env.flops[np.maximum(inside, 0)] > 0) if env.start.size else inside >= 0
        total += float(env.flops.sum()) + float(fine.flops[~covered].sum())
    return total


def mfu(model_flops_per_step: float, step_time: float, n_devices: int, peak_flops_per_device: float) -> float:
    """Model FLOPs utilisation: model FLOPs per second over the peak of all devices
    (Chowdhery et al. 2022, PaLM, App. B). The model FLOPs exclude recomputation."""
    return _utilisation(model_flops_per_step, step_time, n_devices, peak_flops_per_device)


def hfu(hardware_flops_per_step: float, step_time: float, n_devices: int, peak_flops_per_device: float) -> float:
    """Hardware FLOPs utilisation: like MFU but counting the FLOPs actually executed,
    recomputation included (Chowdhery et al. 2022, PaLM, App. B)."""
    return _utilisation(hardware_flops_per_step, step_time, n_devices, peak_flops_per_device)


def _utilisation(flops: float, step_time: float, n_devices: int, peak: float) -> float:
    if step_time <= 0 or n_devices <= 0 or peak <= 0:
        raise ValueError(f"step_time ({step_time}), n_devices ({n_devices}) and peak FLOP/s ({peak}) "
                         "must be positive")
    return flops / (step_time * n_devices * peak)


# ---------------------------------------------------------------- summary

def summary(trace: Trace, model_flops_per_step: float | None = None, peak_flops_per_device: float | None = None,
            n_devices: int | None = None) -> dict:
    """Every metric above in one JSON-able dict (seconds, FLOP; rank keys are ints).

    ``hfu`` uses the trace's own FLOPs over the trace's own ranks, so it is right for a
    representative-rank trace too. ``mfu`` needs the whole-step model FLOPs and the device
    count (``n_devices``, else ``meta["world_size"]``, else the number of ranks in the trace).
    Both stay ``None`` without ``peak_flops_per_device``."""
    ranks = _by_rank(trace)
    t = trace.step_time
    busy = _busy(ranks)
    exposed = _exposed(ranks, EXPOSED_STREAMS)
    flops = _hardware_flops(ranks)
    out = {
        "step_time_s": t,
        "num_events": len(trace.events),
        "num_ranks": len(ranks),
        "busy_time_s_by_rank": busy,
        "idle_time_s_by_rank": {r: t - b for r, b in busy.items()},
        "bubble_fraction": _bubble(busy, t),
        "bubble_fraction_by_rank": _bubble_by_rank(busy, t),
        "exposed_comm_s": _mean_over_ranks(exposed, EXPOSED_STREAMS),
        "exposed_comm_s_by_rank": exposed,
        "hardware_flops": flops,
        "mfu": None,
        "hfu": None,
    }
    if peak_flops_per_device and t > 0 and ranks:
        out["hfu"] = hfu(flops, t, len(ranks), peak_flops_per_device)
        if model_flops_per_step is not None:
            devices = n_devices or int(trace.meta.get("world_size", len(ranks)))
            out["mfu"] = mfu(model_flops_per_step, t, devices, peak_flops_per_device)
    return out
