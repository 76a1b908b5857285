"""Sweep charts, read from a sweep's CSV/Parquet (one row per plan, ``parsim sweep --out``):

* ``pareto``   throughput vs peak memory: every plan, the ones that fit, the Pareto front
* ``heatmap``  best throughput over (tp, pp), over everything else / with the others fixed
* ``bubble``   bubble fraction vs microbatches per step, per schedule
* ``zero``     peak memory per device per ZeRO stage (stacked by category)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import rc_context

from .style import CAPACITY_COLOR, CATEGORY_ORDER, GIB, RC, category_colors, new_figure, save

SCHEDULE_COLORS = {"naive": "#7f7f7f", "gpipe": "#e69f00", "1f1b": "#0072b2", "interleaved": "#009e73"}
FIT_COLOR, NOFIT_COLOR, FRONT_COLOR = "#0072b2", "#c8c8c8", "#d55e00"
OTHER_KEYS = ("vpp", "mbs", "schedule", "zero", "offload", "recompute", "sp", "dtype", "dp_impl")


def read_sweep(path: str | Path) -> pd.DataFrame:
    path = str(path)
    return pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)


def pareto_front(df: pd.DataFrame) -> pd.DataFrame:
    """Plans no other plan beats on both throughput (higher) and peak memory (lower)."""
    d = df.sort_values(["peak_memory_bytes", "tokens_per_s"], ascending=[True, False])
    best, keep = -np.inf, []
    for i, t in zip(d.index, d["tokens_per_s"].to_numpy()):
        if t > best:
            keep.append(i)
            best = t
    return d.loc[keep]


def plot_pareto(df: pd.DataFrame, path: str | Path, capacity_bytes: float | None = None, title: str = "") -> Path:
    with rc_context(RC):
        fig = new_figure(7.0, 4.6)
        ax = fig.add_subplot()
        fits = df["fits"].astype(bool)
        ax.scatter(df.loc[~fits, "peak_memory_bytes"] / GIB, df.loc[~fits, "tokens_per_s"], s=4, c=NOFIT_COLOR,
                   label=f"does not fit ({int((~fits).sum())})", rasterized=True, linewidths=0)
        ax.scatter(df.loc[fits, "peak_memory_bytes"] / GIB, df.loc[fits, "tokens_per_s"], s=5, c=FIT_COLOR, alpha=0.5,
                   label=f"fits ({int(fits.sum())})", rasterized=True, linewidths=0)
        front = pareto_front(df)
        ax.step(front["peak_memory_bytes"] / GIB, front["tokens_per_s"], where="post", color=FRONT_COLOR, lw=1.6,
                label="Pareto front")
        if fits.any():
            best = df[fits].loc[df.loc[fits, "tokens_per_s"].idxmax()]
            ax.scatter([best["peak_memory_bytes"] / GIB], [best["tokens_per_s"]], marker="*", s=160, c=FRONT_COLOR,
                       edgecolors="black", linewidths=0.6, zorder=5, label="best that fits")
            ax.annotate(_short(best), (best["peak_memory_bytes"] / GIB, best["tokens_per_s"]), xytext=(8, -14),
                        textcoords="offset points", fontsize=7)
        if capacity_bytes:
            ax.axvline(capacity_bytes / GIB, color=CAPACITY_COLOR, ls="--", lw=1.2, label="memory limit")
        ax.set_xscale("log")
        ax.set_xlabel("peak memory per device (GiB, log scale)")
        ax.set_ylabel("throughput (tokens/s)")
        ax.set_title(title or "throughput vs memory: every plan of the sweep")
        ax.grid(color="#e8e8e8", lw=0.6)
        ax.legend(loc="lower right", markerscale=2)
        return save(fig, path)


def _short(row) -> str:
    s = f"dp={row['dp']} tp={row['tp']} pp={row['pp']}"
    if row["vpp"] > 1:
        s += f" vpp={row['vpp']}"
    return s + f" mbs={row['mbs']} zero={row['zero']}"


def _grid(df: pd.DataFrame, tps: list[int], pps: list[int]) -> np.ndarray:
    grid = np.full((len(pps), len(tps)), np.nan)
    best = df[df["fits"].astype(bool)].groupby(["pp", "tp"])["tokens_per_s"].max()
    for (pp, tp), v in best.items():
        grid[pps.index(pp), tps.index(tp)] = v
    return grid


def plot_heatmap(df: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """Best fitting throughput per (tp, pp): over all other choices (left), and with the other
    choices held at the overall best plan's values (right). Blank: nothing fits / not valid."""
    tps, pps = sorted(df["tp"].unique().tolist()), sorted(df["pp"].unique().tolist())
    fits = df[df["fits"].astype(bool)]
    panels = [("best over all other choices", df)]
    if len(fits):
        best = fits.loc[fits["tokens_per_s"].idxmax()]
        fixed = df
        for k in ("mbs", "zero", "offload", "recompute", "sp", "dtype", "dp_impl"):
            fixed = fixed[fixed[k] == best[k]]
        panels.append((f"mbs={best['mbs']} zero={best['zero']} recompute={best['recompute']} "
                       f"sp={str(bool(best['sp'])).lower()} fixed", fixed))
    with rc_context(RC):
        fig = new_figure(5.2 * len(panels), 0.42 * len(pps) + 2.4)
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        vmax = np.nanmax(_grid(df, tps, pps)) if len(fits) else 1.0
        for ax, (name, sub) in zip(axes, panels):
            grid = _grid(sub, tps, pps)
            im = ax.imshow(grid / 1e3, cmap="viridis", vmin=0, vmax=vmax / 1e3, aspect="auto", origin="lower")
            for (i, j), v in np.ndenumerate(grid):
                if np.isfinite(v):
                    ax.text(j, i, f"{v / 1e3:.0f}", ha="center", va="center", fontsize=7,
                            color="white" if v < 0.6 * vmax else "black")
            ax.set_xticks(range(len(tps)), [str(t) for t in tps])
            ax.set_yticks(range(len(pps)), [str(p) for p in pps])
            ax.set_xlabel("tensor parallel (tp)")
            ax.set_ylabel("pipeline parallel (pp)")
            ax.set_title(name, fontsize=9)
        fig.colorbar(im, ax=list(axes), label="best throughput (k tokens/s); blank = nothing fits", shrink=0.9)
        fig.suptitle(title or "throughput over (tp, pp), dp = devices / (tp pp)")
        return save(fig, path)


def plot_bubble(df: pd.DataFrame, path: str | Path, pp: int | None = None, title: str = "") -> Path:
    """Bubble fraction vs microbatches per step, one line per schedule (interleaved per vpp),
    for one pipeline depth (default: the deepest pipeline with the most plans)."""
    piped = df[df["pp"] > 1]
    if pp is None and len(piped):
        pp = int(piped.groupby("pp").size().idxmax())
    sub = piped[piped["pp"] == pp]
    with rc_context(RC):
        fig = new_figure(6.4, 4.2)
        ax = fig.add_subplot()
        for sched in ("naive", "gpipe", "1f1b", "interleaved"):
            s = sub[sub["schedule"] == sched]
            vpps = sorted(s["vpp"].unique().tolist()) if sched == "interleaved" else [1]
            for k, v in enumerate(vpps):
                sv = s[s["vpp"] == v]
                if sv.empty:
                    continue
                med = sv.groupby("microbatches")["bubble_fraction"].median()
                label = sched if sched != "interleaved" else f"interleaved vpp={v}"
                # GPipe and 1F1B share a bubble (they differ in memory): GPipe dashed and wider
                ax.plot(med.index, med.to_numpy(), marker="o", ms=3.5, lw=3.2 if sched == "gpipe" else 1.4,
                        ls="--" if sched == "gpipe" else "-", color=SCHEDULE_COLORS[sched],
                        alpha=1.0 - 0.6 * k / max(len(vpps), 1), label=label, zorder=3 if sched == "1f1b" else 2)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("microbatches per step (m)")
        ax.set_ylabel("bubble fraction (idle share of the step)")
        ax.set_ylim(0, 1)
        ax.set_title(title or f"pipeline bubble vs microbatches, pp={pp}")
        ax.grid(color="#e8e8e8", lw=0.6)
        ax.legend(fontsize=7, ncol=2)
        return save(fig, path)


def plot_zero_memory(df: pd.DataFrame, path: str | Path, capacity_bytes: float | None = None, title: str = "") -> Path:
    """Peak memory per device by category for ZeRO 0-3 (and offload), the other choices held
    at those of the overall best plan (its smallest-memory variant where it has none)."""
    fits = df[df["fits"].astype(bool)]
    ref = (fits if len(fits) else df).sort_values("tokens_per_s", ascending=False).iloc[0]
    same = df
    for k in ("dp", "tp", "pp", "vpp", "mbs", "schedule", "recompute", "sp", "dtype", "dp_impl"):
        same = same[same[k] == ref[k]]
    same = same.sort_values(["zero", "offload"], key=lambda c: c.map({"none": 0, "optimizer": 1,
                                                                        "optimizer+params": 2}) if c.name == "offload" else c)
    cats = [c for c in CATEGORY_ORDER if f"peak_{c}_bytes" in same]
    colors = category_colors(cats)
    offload_words = {"none": "", "optimizer": "\n+offload\noptimizer", "optimizer+params": "\n+offload\noptim.+params"}
    labels = [f"ZeRO-{z}{offload_words[o]}" for z, o in zip(same["zero"], same["offload"])]
    with rc_context(RC):
        fig = new_figure(max(5.0, 0.9 * len(same) + 2.5), 4.4)
        ax = fig.add_subplot()
        x = np.arange(len(same))
        bottom = np.zeros(len(same))
        for c in cats:
            v = same[f"peak_{c}_bytes"].to_numpy() / GIB
            ax.bar(x, v, bottom=bottom, color=colors[c], label=c, width=0.7, edgecolor="white", lw=0.5)
            bottom += v
        for xi, t in zip(x, bottom):
            ax.text(xi, t, f"{t:.1f}", ha="center", va="bottom", fontsize=8)
        if capacity_bytes:
            ax.axhline(capacity_bytes / GIB, color=CAPACITY_COLOR, ls="--", lw=1.2, label="memory limit")
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel("peak memory per device (GiB)")
        ax.set_title(title or f"memory per ZeRO stage: dp={ref['dp']} tp={ref['tp']} pp={ref['pp']} mbs={ref['mbs']} "
                     f"recompute={ref['recompute']}", fontsize=9)
        ax.grid(axis="y", color="#e8e8e8", lw=0.6)
        ax.set_axisbelow(True)
        h, lab = ax.get_legend_handles_labels()
        ax.legend(h[::-1], lab[::-1], fontsize=7)
        return save(fig, path)


def plot_sweep(df: pd.DataFrame, out_dir: str | Path, capacity_bytes: float | None = None,
               title: str = "") -> list[Path]:
    """All four charts into ``out_dir``; the memory limit defaults to the sweep's own."""
    out = Path(out_dir)
    if capacity_bytes is None and "memory_limit_bytes" in df:
        capacity_bytes = float(df["memory_limit_bytes"].iloc[0])
    prefix = f"{title}: " if title else ""
    return [plot_pareto(df, out / "pareto.png", capacity_bytes, prefix + "throughput vs memory" if title else ""),
            plot_heatmap(df, out / "heatmap_tp_pp.png", prefix + "throughput over (tp, pp)" if title else ""),
            plot_bubble(df, out / "bubble_vs_microbatches.png"),
            plot_zero_memory(df, out / "memory_per_zero_stage.png", capacity_bytes)]
