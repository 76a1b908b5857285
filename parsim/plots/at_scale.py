"""Charts of a run at scale, from plain numbers (seconds, fractions):

* ``plot_step_distribution``  histogram of Monte-Carlo step times with the clean step, p50, p90, p99
* ``plot_goodput_curve``      goodput vs checkpoint interval, the numeric optimum and Young/Daly
* ``plot_critical_share``     share of steps each rank (and link) was on the critical path
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import rc_context

from .style import MS, RC, STREAM_COLORS, new_figure, save

QUANTILE_COLORS = {"p50": "#0072b2", "p90": "#e69f00", "p99": "#d55e00"}
CLEAN_COLOR, BAR_COLOR = "#009e73", "#56b4e9"


def plot_step_distribution(step_times_s, clean_step_s: float, path: str | Path, title: str = "") -> Path:
    """Histogram of step times (ms) with the clean step and the p50 / p90 / p99 lines."""
    t = np.asarray(step_times_s, dtype=float) * MS
    with rc_context(RC):
        fig = new_figure(6.0, 3.4)
        ax = fig.add_subplot()
        ax.hist(t, bins=min(40, max(5, len(t) // 3)), color=BAR_COLOR, edgecolor="white")
        ax.axvline(clean_step_s * MS, color=CLEAN_COLOR, lw=1.5, label=f"clean step {clean_step_s * MS:,.0f} ms")
        for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
            v = np.percentile(t, q)
            ax.axvline(v, color=QUANTILE_COLORS[name], ls="--", lw=1.2, label=f"{name} {v:,.0f} ms")
        ax.set_xlabel("step time (ms)")
        ax.set_ylabel("steps")
        ax.set_title(title or f"step time over {len(t)} seeded steps")
        ax.legend(frameon=False)
        return save(fig, path)


def plot_goodput_curve(intervals_s, goodputs, best_s: float, young_s: float, daly_s: float, path: str | Path,
                       title: str = "") -> Path:
    """Goodput (fraction) against checkpoint interval (minutes, log axis) with the optima."""
    x = np.asarray(intervals_s, dtype=float) / 60.0
    with rc_context(RC):
        fig = new_figure(6.0, 3.4)
        ax = fig.add_subplot()
        ax.plot(x, np.asarray(goodputs) * 100.0, color="#0072b2", lw=1.6)
        for value, label, color, style in ((best_s, "best (numeric)", "#000000", "-"),
                                           (young_s, "Young 1974", "#e69f00", "--"),
                                           (daly_s, "Daly 2006", "#d55e00", ":")):
            ax.axvline(value / 60.0, color=color, ls=style, lw=1.2, label=f"{label}: {value / 60:,.1f} min")
        ax.set_xscale("log")
        ax.set_xlabel("checkpoint interval (minutes of training)")
        ax.set_ylabel("goodput (% of wall time)")
        ax.set_title(title or "goodput vs checkpoint interval")
        ax.legend(frameon=False)
        return save(fig, path)


def plot_critical_share(rank_share: dict, link_share: dict, path: str | Path, title: str = "",
                        ranks: int = 16, xlabel: str = "global rank") -> Path:
    """Bars: fraction of steps each rank (or stage: ``xlabel``) was critical (the ``ranks`` most
    frequent), and the mean fraction of the step the compute stream waited on each dimension's link."""
    items = sorted(rank_share.items(), key=lambda kv: -kv[1])[:ranks]
    with rc_context(RC):
        fig = new_figure(7.5, 3.2)
        left, right = fig.subplots(1, 2, width_ratios=[3, 1.4])
        left.bar([str(r) for r, _ in items], [v * 100 for _, v in items], color=BAR_COLOR)
        left.set_xlabel(xlabel)
        left.set_ylabel("steps on the critical path (%)")
        left.tick_params(axis="x", rotation=60)
        left.set_title(title or "critical rank per step")
        names = list(link_share)
        right.bar(names, [link_share[n] * 100 for n in names],
                  color=[STREAM_COLORS.get(n.split("/")[0], "#999999") for n in names])
        right.set_ylabel("step waiting on it (%)")
        right.set_title("critical links")
        right.tick_params(axis="x", rotation=30)
        return save(fig, path)
