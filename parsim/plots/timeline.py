"""Gantt timeline of one step: a compute row per rank with thin comm rows under it.

Compute row: one bar per Schedule-IR action (F light, B dark, recompute hatched, ...), the
microbatch number inside when it fits, idle gaps (the pipeline bubble) shaded pale red.
Comm rows (only the streams the trace uses): comm in flight, pale where it overlaps compute
(hidden) and solid where the device is not computing (exposed; parsim.trace.metrics).
Crowded traces stay readable: comm intervals closer than a pixel are merged, labels are only
written where they fit, and ``max_ranks`` keeps an evenly spaced subset of ranks.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.collections import PathCollection
from matplotlib.patches import Patch
from matplotlib.path import Path as MplPath
from matplotlib.patheffects import withStroke
from matplotlib.transforms import blended_transform_factory

from parsim.trace.events import Trace
from parsim.trace.metrics import (bubble_fraction, bubble_fraction_by_rank, complement, containing_interval, intersect_intervals,
                                  merge_intervals, working_intervals)

from .style import (BUBBLE_EDGE, BUBBLE_FACE, BUBBLE_HATCH, COMM_STREAMS, KIND_COLORS, KIND_LABELS, MS,
                    OTHER_KIND_COLOR, RC, RECOMPUTE_HATCH, STREAM_COLORS, STREAM_LABELS, TEXT_ON, new_figure, save)

COMPUTE_ROW = 1.0      # row heights in y units
COMM_ROW = 0.42
RANK_GAP = 0.4
FIG_WIDTH_IN = 13.0
PLOT_WIDTH_FRACTION = 0.86    # of the figure width, for pixel estimates before layout
CROWDED_PX = 6.0              # median bar width below which a row counts as crowded
MIN_COMM_LABEL_PT = 5.5       # comm rows thinner than this (points) get no text
HIDDEN_ALPHA = 0.3            # opacity of comm that overlaps compute
MAX_LABELS = 4000             # text artists beyond this slow Agg down without helping a reader


@dataclass(frozen=True)
class Rows:
    """Where each rank's compute row and comm rows sit (y grows downwards)."""
    ranks: tuple[int, ...]
    streams: tuple[str, ...]
    total_ranks: int

    @property
    def block(self) -> float:
        return COMPUTE_ROW + COMM_ROW * len(self.streams) + RANK_GAP

    @property
    def height(self) -> float:
        return self.block * max(len(self.ranks), 1) - RANK_GAP

    def compute_y(self, i: int) -> float:
        return i * self.block

    def comm_y(self, i: int, stream: str) -> float:
        return i * self.block + COMPUTE_ROW + COMM_ROW * self.streams.index(stream)


def select_ranks(ranks: list[int], max_ranks: int) -> list[int]:
    """At most ``max_ranks`` ranks, evenly spaced, always keeping the first and the last."""
    if len(ranks) <= max_ranks:
        return list(ranks)
    idx = np.unique(np.round(np.linspace(0, len(ranks) - 1, max(max_ranks, 1))).astype(int))
    return [ranks[i] for i in idx]


def layout_rows(traces: list[Trace], max_ranks: int) -> Rows:
    ranks = sorted({r for t in traces for r in t.ranks})
    used = {e.stream for t in traces for e in t.events}
    streams = tuple(s for s in COMM_STREAMS if s in used) + tuple(sorted(used - set(COMM_STREAMS) - {"compute"}))
    return Rows(tuple(select_ranks(ranks, max_ranks)), streams, len(ranks))


def _bars(ax: Axes, starts, ends, y: float, h: float, **kw) -> None:
    """Rectangles [start, end] x [y, y + h] (seconds -> ms) as one compound path: Agg draws
    one path of 10^4 sub-paths far faster than 10^4 separate rectangles (broken_barh)."""
    n = len(starts)
    if not n:
        return
    x0, x1 = np.asarray(starts, float) * MS, np.asarray(ends, float) * MS
    verts = np.empty((n, 5, 2))
    verts[:, :, 0] = np.stack((x0, x1, x1, x0, x0), axis=1)
    verts[:, :, 1] = np.array([y, y, y + h, y + h, y])
    codes = np.tile([MplPath.MOVETO, MplPath.LINETO, MplPath.LINETO, MplPath.LINETO, MplPath.CLOSEPOLY], n)
    # autolim=False: limits are set once at the end; per-patch limit updates walk every segment
    ax.add_collection(PathCollection([MplPath(verts.reshape(-1, 2), codes)], **kw), autolim=False)


def coverage(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Fraction of each bin [edges[k], edges[k+1]] covered by the union of the intervals."""
    ms, me = merge_intervals(starts, ends)
    if ms.size == 0:
        return np.zeros(edges.size - 1)
    done = np.concatenate(([0.0], np.cumsum(me - ms)))        # covered length before interval k
    k = np.searchsorted(ms, edges, side="right") - 1
    kk = np.maximum(k, 0)
    covered = np.where(k < 0, 0.0, done[kk] + np.clip(edges - ms[kk], 0.0, me[kk] - ms[kk]))
    return np.diff(covered) / np.diff(edges)


@dataclass(frozen=True)
class _Scale:
    """Pixel geometry of one timeline, known before layout (estimated from the figure size)."""
    px_per_s: float
    row_pt: float                 # compute bar height in points

    @property
    def min_gap(self) -> float:   # one pixel, in seconds
        return 1.0 / self.px_per_s

    @property
    def label_size(self) -> float:
        return min(8.0, 0.5 * self.row_pt)

    @property
    def char_px(self) -> float:   # a digit's width in pixels at the label size
        return 0.62 * self.label_size * RC["savefig.dpi"] / 72

    @property
    def comm_labels(self) -> bool:
        return self.row_pt * COMM_ROW / COMPUTE_ROW >= MIN_COMM_LABEL_PT


def _draw_compute_row(ax: Axes, comp: list, cs: np.ndarray, ce: np.ndarray, layers: np.ndarray, span: float,
                      y: float, scale: _Scale, used: set[str], labels: list) -> None:
    """Bubble shading, one bar per action (plus finer events no action contains), nested
    recompute hatched on top, and microbatch labels where they fit."""
    gs, ge = complement(cs, ce, 0.0, span)
    if gs.size:
        used.add("bubble")
        _bars(ax, gs, ge, y + 0.08, COMPUTE_ROW - 0.16, facecolor=BUBBLE_FACE, edgecolor=BUBBLE_EDGE,
              hatch=BUBBLE_HATCH, linewidth=0, zorder=1)
    env = np.flatnonzero(layers < 0)
    env = env[np.argsort(cs[env], kind="stable")]
    fine = np.flatnonzero(layers >= 0)
    inside = containing_interval(cs[env], ce[env], cs[fine], ce[fine])
    shown = list(env) + list(fine[inside < 0])
    nested_recompute = [j for j, k in zip(fine, inside) if k >= 0 and comp[j].kind == "R"]
    # crowded rows: bars a few pixels wide get no edges or hatches (noise, and seconds of Agg
    # time) and same-kind bars closer than a pixel are merged
    crowded = bool(shown) and float(np.median((ce[shown] - cs[shown]) * scale.px_per_s)) < CROWDED_PX
    edge = dict(linewidth=0) if crowded else dict(edgecolor="white", linewidth=0.5)
    hatch = None if crowded else RECOMPUTE_HATCH
    for kind in sorted({comp[j].kind for j in shown}):
        js = [j for j in shown if comp[j].kind == kind]
        used.add(kind if kind in KIND_COLORS else "other")
        bars = merge_intervals(cs[js], ce[js], gap=scale.min_gap) if crowded else (cs[js], ce[js])
        _bars(ax, *bars, y + 0.05, COMPUTE_ROW - 0.1, facecolor=KIND_COLORS.get(kind, OTHER_KIND_COLOR),
              hatch=hatch if kind == "R" else None, zorder=2, **edge)
        for j in js:
            text = str(comp[j].microbatch)
            if comp[j].microbatch >= 0 and (ce[j] - cs[j]) * scale.px_per_s >= len(text) * scale.char_px + 4:
                labels.append(((cs[j] + ce[j]) / 2 * MS, y + COMPUTE_ROW / 2, text, kind))
    if nested_recompute:
        used.add("R")
        gap = scale.min_gap if crowded else 0.0
        _bars(ax, *merge_intervals(cs[nested_recompute], ce[nested_recompute], gap=gap), y + 0.05,
              COMPUTE_ROW - 0.1, facecolor=KIND_COLORS["R"], hatch=hatch, linewidth=0, zorder=3)


def _draw_comm_row(ax: Axes, events: list, idle: tuple[np.ndarray, np.ndarray], span: float, t0: float,
                   y: float, color: str, scale: _Scale, used: set[str]) -> float:
    """One comm stream of one rank as per-pixel coverage: solid where the device is not
    computing (exposed), pale where compute runs at the same time (hidden). A half-covered pixel
    is half as strong, so thousands of sub-pixel collectives read as their true density.
    Returns the exposed fraction of the step."""
    edges = np.linspace(0.0, span, max(int(np.ceil(span * scale.px_per_s)), 1) + 1)
    s = np.array([e.start for e in events]) - t0
    e_ = np.array([e.end for e in events]) - t0
    exposed = coverage(*intersect_intervals((s, e_), idle), edges)
    hidden = coverage(s, e_, edges) - exposed
    used |= {"exposed"} if exposed.any() else set()
    used |= {"hidden"} if (hidden > 1e-9).any() else set()
    rgba = np.zeros((1, edges.size - 1, 4))
    rgba[..., :3] = to_rgb(color)
    rgba[..., 3] = np.clip(exposed + HIDDEN_ALPHA * hidden, 0.0, 1.0)
    ax.imshow(rgba, extent=(0.0, span * MS, y + COMM_ROW - 0.07, y + 0.05), aspect="auto",
              interpolation="nearest", zorder=2)
    return float(exposed.mean())


def draw_timeline(ax: Axes, trace: Trace, rows: Rows, px_per_s: float, row_pt: float) -> set[str]:
    """Draw ``trace`` on ``ax`` in the given rows (times relative to the trace's first event).
    Returns the legend keys used (compute kinds, streams, "bubble", "exposed", "hidden")."""
    used: set[str] = set()
    if not trace.events:
        ax.text(0.5, 0.5, "no events", transform=ax.transAxes, ha="center", va="center", color="grey")
        ax.set_yticks([])
        return used
    scale = _Scale(px_per_s, row_pt)
    t0 = min(e.start for e in trace.events)
    span = max(e.end for e in trace.events) - t0
    labels: list[tuple[float, float, str, str]] = []
    bubble = bubble_fraction_by_rank(trace)
    right = blended_transform_factory(ax.transAxes, ax.transData)     # x in axes fraction, y in rows
    per_rank: dict[int, list] = {r: [] for r in rows.ranks}
    for e in trace.events:
        if e.rank in per_rank:
            per_rank[e.rank].append(e)

    for i, r in enumerate(rows.ranks):
        comp = [e for e in per_rank[r] if e.stream == "compute"]
        cs = np.array([e.start for e in comp]) - t0
        ce = np.array([e.end for e in comp]) - t0
        layers = np.array([e.layer for e in comp], dtype=int)
        y = rows.compute_y(i)
        _draw_compute_row(ax, comp, cs, ce, layers, span, y, scale, used, labels)
        ax.text(1.004, y + COMPUTE_ROW / 2, f"{bubble.get(r, 0.0):.0%} idle", transform=right, va="center",
                ha="left", fontsize=7, color=BUBBLE_EDGE if bubble.get(r, 0.0) > 0.005 else "grey")
        idle = complement(*working_intervals(cs, ce, layers), 0.0, span)
        for stream in rows.streams:
            events = [e for e in per_rank[r] if e.stream == stream]
            if not events:
                continue
            used.add(stream)
            yc = rows.comm_y(i, stream)
            exposed = _draw_comm_row(ax, events, idle, span, t0, yc, STREAM_COLORS.get(stream, OTHER_KIND_COLOR),
                                     scale, used)
            if scale.comm_labels:
                ax.text(1.004, yc + COMM_ROW / 2, f"{exposed:.0%} exposed", transform=right, va="center",
                        ha="left", fontsize=6, color="grey")

    for x, yy, text, kind in labels if len(labels) <= MAX_LABELS else []:
        # outlined in the bar's own colour, so a label stays legible over a hatched recompute part
        ax.text(x, yy, text, ha="center", va="center", fontsize=scale.label_size, color=TEXT_ON.get(kind, "white"),
                zorder=4, path_effects=[withStroke(linewidth=2.2, foreground=KIND_COLORS.get(kind, OTHER_KIND_COLOR))])
    _axes_decor(ax, rows, span, row_pt)
    return used


def _axes_decor(ax: Axes, rows: Rows, span: float, row_pt: float) -> None:
    ticks, names, minor, minor_names = [], [], [], []
    for i, r in enumerate(rows.ranks):
        ticks.append(rows.compute_y(i) + COMPUTE_ROW / 2)
        names.append(f"rank {r}")
        for s in rows.streams:
            minor.append(rows.comm_y(i, s) + COMM_ROW / 2)
            minor_names.append(s)
    ax.set_yticks(ticks, names)
    comm_pt = row_pt * COMM_ROW / COMPUTE_ROW
    ax.set_yticks(minor, minor_names if comm_pt >= MIN_COMM_LABEL_PT else [], minor=True)   # too small: leave out
    ax.tick_params(axis="y", which="minor", labelsize=min(6.0, comm_pt), labelcolor="grey", length=0)
    ax.tick_params(axis="y", which="major", length=0)
    ax.set_ylim(rows.height + 0.1, -0.1)
    ax.set_xlim(0, max(span, 1e-12) * MS * 1.002)
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    ax.spines["left"].set_visible(False)


def _legend_handles(used: set[str]) -> list[Patch]:
    out, seen = [], set()
    for kind in ("F", "B", "I", "W", "R", "optimizer", "embedding", "head"):
        if kind in used and KIND_LABELS[kind] not in seen:
            seen.add(KIND_LABELS[kind])
            out.append(Patch(facecolor=KIND_COLORS[kind], hatch=RECOMPUTE_HATCH if kind == "R" else None,
                             edgecolor="white" if kind != "R" else "#7f2704", linewidth=0.5, label=KIND_LABELS[kind]))
    if "other" in used:
        out.append(Patch(facecolor=OTHER_KIND_COLOR, label="other compute"))
    if "bubble" in used:
        out.append(Patch(facecolor=BUBBLE_FACE, edgecolor=BUBBLE_EDGE, hatch=BUBBLE_HATCH, linewidth=0,
                         label="idle (bubble)"))
    for s in COMM_STREAMS:
        if s in used:
            out.append(Patch(facecolor=STREAM_COLORS[s], label=STREAM_LABELS[s]))
    if "hidden" in used:
        out.append(Patch(facecolor="#9e9e9e", alpha=HIDDEN_ALPHA, label="comm hidden under compute (pale)"))
    return out


def _figure_for(rows_list: list[Rows], extra_in: float):
    units = sum(r.height for r in rows_list)
    per_unit = min(0.3, 24.0 / max(units, 1.0))           # inches per y unit; cap the figure at ~24 in of rows
    height = units * per_unit + extra_in
    return new_figure(FIG_WIDTH_IN, height), per_unit * 72 * (COMPUTE_ROW - 0.1)    # row height in points


def _px_per_s(span: float) -> float:
    return FIG_WIDTH_IN * RC["savefig.dpi"] * PLOT_WIDTH_FRACTION / max(span, 1e-12)


def format_ms(seconds: float) -> str:
    ms = seconds * MS
    return f"{ms:,.1f} ms" if ms >= 100 else f"{ms:.3g} ms"


def _headline(trace: Trace) -> str:
    return f"step {format_ms(trace.step_time)} · bubble {bubble_fraction(trace):.1%}"


def _subsample_note(rows: Rows) -> str:
    if len(rows.ranks) == rows.total_ranks:
        return ""
    return f" · showing {len(rows.ranks)} of {rows.total_ranks} ranks, evenly spaced"


def plot_timeline(trace: Trace, path: str | Path, title: str | None = None, max_ranks: int = 16) -> Path:
    """Write the Gantt timeline of ``trace`` as a PNG (x in ms from the first event)."""
    with rc_context(RC):
        rows = layout_rows([trace], max_ranks)
        fig, row_pt = _figure_for([rows], extra_in=1.5)
        ax = fig.add_subplot()
        used = draw_timeline(ax, trace, rows, _px_per_s(trace.step_time), row_pt)
        ax.set_xlabel("time in step (ms)")
        head = f"{title} — " if title else ""
        ranks = f"{rows.total_ranks} rank" + ("s" if rows.total_ranks != 1 else "")
        ax.set_title(f"{head}{_headline(trace)} · {ranks}{_subsample_note(rows)}", loc="left")
        handles = _legend_handles(used)
        if handles:
            fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), frameon=False)
        return save(fig, path)


def plot_timeline_pair(trace_a: Trace, trace_b: Trace, path: str | Path,
                       labels: tuple[str, str] = ("simulated", "measured"), title: str | None = None,
                       max_ranks: int = 16) -> Path:
    """Two timelines stacked on a shared x axis (e.g. predicted over measured)."""
    with rc_context(RC):
        rows = layout_rows([trace_a, trace_b], max_ranks)
        fig, row_pt = _figure_for([rows, rows], extra_in=2.2)
        ax_a, ax_b = fig.subplots(2, 1, sharex=True)
        span = max(trace_a.step_time, trace_b.step_time)
        used = set()
        for ax, trace, label in ((ax_a, trace_a, labels[0]), (ax_b, trace_b, labels[1])):
            used |= draw_timeline(ax, trace, rows, _px_per_s(span), row_pt)
            ax.set_xlim(0, max(span, 1e-12) * MS * 1.002)
            ax.set_title(f"{label}: {_headline(trace)}", loc="left")
        ax_b.set_xlabel("time in step (ms)")
        ratio = (f" · {labels[1]} / {labels[0]} step time = {trace_b.step_time / trace_a.step_time:.3f}"
                 if trace_a.step_time > 0 else "")
        fig.suptitle(f"{title or f'{labels[0]} vs {labels[1]}'}{ratio}{_subsample_note(rows)}", x=0.01, ha="left")
        handles = _legend_handles(used)
        if handles:
            fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), frameon=False)
        return save(fig, path)
