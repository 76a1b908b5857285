"""Validation charts: predicted vs measured step time and peak memory, one point per plan."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from parsim.specs.files import output_file


def plot_validation(rows: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5.2), dpi=110)
    axes = fig.subplots(1, 2)
    colours = {2: "#1f77b4", 4: "#d62728", 8: "#2ca02c"}
    for ax, meas_key, pred_key, unit, scale, label in (
        (axes[0], "measured_step_s", "predicted_step_s", "ms", 1e3, "step time"),
        (axes[1], "measured_peak_bytes", "predicted_peak_bytes", "MiB", 2.0 ** -20, "peak memory (max over ranks)"),
    ):
        xs = [r[meas_key] * scale for r in rows]
        ys = [r[pred_key] * scale for r in rows]
        # step time: the drift-anchored predictions too, hollow (``parsim.study.validate``)
        anchored = ("step" in meas_key and rows and all(r.get("anchored_step_s") is not None for r in rows))
        ya = [r["anchored_step_s"] * scale for r in rows] if anchored else []
        lo, hi = min(xs + ys + ya) * 0.9, max(xs + ys + ya) * 1.1
        band = 0.15 if "step" in meas_key else 0.03
        ax.fill_between([lo, hi], [lo * (1 - band), hi * (1 - band)], [lo * (1 + band), hi * (1 + band)],
                        color="#dddddd", label=f"±{band:.0%}")
        ax.plot([lo, hi], [lo, hi], color="#555555", lw=1, label="predicted = measured")
        for w in sorted({r["world_size"] for r in rows}):
            sel = [(x, y) for x, y, r in zip(xs, ys, rows) if r["world_size"] == w]
            ax.scatter([s[0] for s in sel], [s[1] for s in sel], s=28, color=colours.get(w, "#9467bd"),
                       label=f"{w} ranks", zorder=3)
            if anchored:
                sel = [(x, y) for x, y, r in zip(xs, ya, rows) if r["world_size"] == w]
                ax.scatter([s[0] for s in sel], [s[1] for s in sel], s=34, facecolors="none",
                           edgecolors=colours.get(w, "#9467bd"), label=f"{w} ranks, anchored to the layer probe",
                           zorder=3)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {label} ({unit})")
        ax.set_ylabel(f"predicted {label} ({unit})")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    with output_file(path) as tmp:
        fig.savefig(tmp, format=Path(path).suffix.lstrip(".") or "png")
    return Path(path)
