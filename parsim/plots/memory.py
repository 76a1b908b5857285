"""Memory plots: the per-stage breakdown (stacked bars) and memory over the step.

Inputs are bytes; the plots show GiB. The device capacity, when given, is a dashed red line,
and whatever crosses it is labelled so an out-of-memory plan is obvious at a glance.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib import colormaps, rc_context
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from .style import CAPACITY_COLOR, GIB, MS, RC, category_colors, new_figure, ordered_categories, save

STAGE_KEYS = ("stage", "total")


def _capacity_line(ax: Axes, capacity_bytes: float | None) -> None:
    if capacity_bytes:
        ax.axhline(capacity_bytes / GIB, color=CAPACITY_COLOR, linestyle="--", linewidth=1.2, zorder=4)


def plot_memory_breakdown(memory_by_stage: Sequence[Mapping[str, float]], path: str | Path,
                          capacity_bytes: float | None = None, title: str | None = None) -> Path:
    """Stacked bars per pipeline stage of params / grads / optimizer / activations / other
    (any further byte-valued keys become extra categories); the total sits above each bar."""
    rows = list(memory_by_stage)
    cats = ordered_categories({k for r in rows for k in r if k not in STAGE_KEYS})
    colors = category_colors(cats)
    with rc_context(RC):
        n = len(rows)
        fig = new_figure(min(max(6.0, 0.45 * n + 3.0), 16.0), 4.8)
        ax = fig.add_subplot()
        x = np.arange(n)
        bottom = np.zeros(n)
        for c in cats:
            v = np.array([float(r.get(c, 0.0)) for r in rows]) / GIB
            ax.bar(x, v, bottom=bottom, color=colors[c], label=c, width=0.7, edgecolor="white", linewidth=0.5)
            bottom += v
        totals = np.array([float(r.get("total", sum(float(r.get(c, 0.0)) for c in cats))) for r in rows])
        over = np.array([bool(capacity_bytes) and t > capacity_bytes for t in totals])
        if n <= 40:
            for xi, top, t, o in zip(x, bottom, totals, over):
                ax.text(xi, top, f"{t / GIB:.1f}" + ("\nover" if o else ""), ha="center", va="bottom",
                        fontsize=7 if n > 16 else 8, color=CAPACITY_COLOR if o else "black",
                        fontweight="bold" if o else "normal")
        _capacity_line(ax, capacity_bytes)
        peak = max(totals.max() if n else 0.0, capacity_bytes or 0.0) / GIB
        ax.set_ylim(0, max(peak * 1.15, 1e-3))
        stages = [int(r.get("stage", i)) for i, r in enumerate(rows)]
        ax.set_xticks(x, [f"stage {s}" if n <= 12 else str(s) for s in stages])
        ax.set_xlabel("pipeline stage")
        ax.set_ylabel("memory per device (GiB)")
        ax.grid(axis="y", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
        handles, labels = ax.get_legend_handles_labels()
        handles, labels = handles[::-1], labels[::-1]          # legend top-down = stack top-down
        if capacity_bytes:
            handles.append(Line2D([], [], color=CAPACITY_COLOR, linestyle="--"))
            labels.append(f"capacity {capacity_bytes / GIB:.0f} GiB")
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        peak_i = int(np.argmax(totals)) if n else 0
        head = f"{title} — " if title else ""
        ax.set_title(f"{head}peak {totals[peak_i] / GIB:.2f} GiB on stage {stages[peak_i]}" if n else
                     f"{head}no stages", loc="left")
        return save(fig, path)


Sample = tuple[float, Mapping[str, float]]


def _series(samples: Sequence[Sample], cats: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Times (s) and an (n_samples, n_categories) byte matrix, sorted by time; of several
    samples at one instant the last is kept (the state after everything done at that time)."""
    by_time = {t: b for t, b in sorted(samples, key=lambda s: s[0])}
    samples = sorted(by_time.items())
    t = np.array([s[0] for s in samples], dtype=float)
    v = np.array([[float(b.get(c, 0.0)) for c in cats] for _, b in samples], dtype=float).reshape(len(t), len(cats))
    return t, v


def plot_memory_over_time(timeline: Mapping[int, Sequence[Sample]], path: str | Path,
                          capacity_bytes: float | None = None, title: str | None = None) -> Path:
    """Top: total memory of every rank over the step (step lines: memory holds between
    samples). Bottom: the categories of the rank with the highest peak, stacked."""
    ranks = sorted(timeline)
    cats = ordered_categories({c for r in ranks for _, b in timeline[r] for c in b})
    colors = category_colors(cats)
    series = {r: _series(timeline[r], cats) for r in ranks}
    # peaks from the raw samples: a transient at one instant counts even if the line hides it
    peak_at = {r: max(((t, sum(float(b.get(c, 0.0)) for c in cats)) for t, b in timeline[r]),
                      key=lambda tb: tb[1], default=(0.0, 0.0)) for r in ranks}
    peaks = {r: peak_at[r][1] for r in ranks}
    with rc_context(RC):
        fig = new_figure(11.0, 7.0)
        ax_tot, ax_cat = fig.subplots(2, 1, sharex=True, height_ratios=(1, 1.2))
        if not ranks:
            ax_tot.text(0.5, 0.5, "no samples", transform=ax_tot.transAxes, ha="center", color="grey")
            return save(fig, path)
        peak_rank = max(ranks, key=lambda r: peaks[r])
        cmap = colormaps["viridis"]
        for i, r in enumerate(ranks):
            t, v = series[r]
            color = cmap(i / max(len(ranks) - 1, 1) * 0.9)
            ax_tot.step(t * MS, v.sum(axis=1) / GIB, where="post", color=color, linewidth=1.6 if r == peak_rank else 1.0,
                        label=f"rank {r}" if len(ranks) <= 12 else None)
        t_peak, peak = peak_at[peak_rank]
        ax_tot.plot([t_peak * MS], [peak / GIB], "v", color=CAPACITY_COLOR, markersize=6, zorder=5)
        ax_tot.annotate(f"peak {peak / GIB:.2f} GiB (rank {peak_rank})", (t_peak * MS, peak / GIB),
                        textcoords="offset points", xytext=(6, 4), fontsize=8, color=CAPACITY_COLOR)
        t, v = series[peak_rank]
        if len(ranks) > 12:
            ax_tot.text(0.99, 0.03, f"{len(ranks)} ranks, colour = rank (viridis: first dark, last yellow)",
                        transform=ax_tot.transAxes, ha="right", fontsize=7, color="grey")
        else:
            ax_tot.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        _capacity_line(ax_tot, capacity_bytes)
        ax_tot.set_ylabel("total (GiB)")
        ax_tot.set_title(f"{title + ' — ' if title else ''}memory per rank over the step", loc="left")

        lower = np.zeros(len(t))
        for j, c in enumerate(cats):
            upper = lower + v[:, j] / GIB
            ax_cat.fill_between(t * MS, lower, upper, step="post", color=colors[c], label=c, linewidth=0)
            lower = upper
        _capacity_line(ax_cat, capacity_bytes)
        ax_cat.set_ylabel("GiB")
        ax_cat.set_xlabel("time in step (ms)")
        ax_cat.set_title(f"rank {peak_rank} (highest peak) by category", loc="left")
        handles, labels = ax_cat.get_legend_handles_labels()
        handles, labels = handles[::-1], labels[::-1]
        if capacity_bytes:
            handles.append(Line2D([], [], color=CAPACITY_COLOR, linestyle="--"))
            labels.append(f"capacity {capacity_bytes / GIB:.0f} GiB")
        ax_cat.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        top = max(max(peaks.values()), capacity_bytes or 0.0) / GIB * 1.12
        for ax in (ax_tot, ax_cat):
            ax.set_ylim(0, max(top, 1e-3))
            ax.grid(axis="y", color="#e0e0e0", linewidth=0.6)
            ax.set_axisbelow(True)
        return save(fig, path)
