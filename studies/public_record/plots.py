"""Parity and residual plots of the public-record fit (matplotlib, Agg)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

MARKERS = {"a100-80g": "o", "a100-40g": "s", "h100-sxm": "^", "h200": "D"}


def _colours(stacks):
    cmap = plt.get_cmap("tab10")
    return {s: cmap(i % 10) for i, s in enumerate(sorted(set(stacks)))}


def parity_plot(rows: list[dict], path) -> None:
    """Predicted vs published time per step (or per layer), log-log; colour = stack, marker = GPU."""
    col = _colours(r["stack"] for r in rows)
    fig, ax = plt.subplots(figsize=(6.5, 6.0))
    for stack in col:
        for gpu, m in MARKERS.items():
            sel = [r for r in rows if r["stack"] == stack and r["gpu"] == gpu]
            if sel:
                ax.scatter([r["published_s"] for r in sel], [r["predicted_s"] for r in sel], s=16, marker=m,
                           color=col[stack], alpha=0.75, label=f"{stack} / {gpu}")
    lo = min(min(r["published_s"], r["predicted_s"]) for r in rows) / 1.5
    hi = max(max(r["published_s"], r["predicted_s"]) for r in rows) * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.9, 1.1):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel="published (s per step; per layer for layer rows)", ylabel="parsim (s)",
           title="Public runs: parsim vs published (dotted: +-10 %)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def residual_plot(rows: list[dict], variables, path) -> None:
    """log(published / predicted time) against each variable; colour = stack."""
    col = _colours(r["stack"] for r in rows)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, label) in zip(axes.ravel(), variables):
        for stack, c in col.items():
            sel = [r for r in rows if r["stack"] == stack]
            ax.scatter([r[key] for r in sel], [100 * (np.exp(r["log_speed_error"]) - 1) for r in sel], s=10,
                       color=c, alpha=0.7, label=stack)
        ax.axhline(0, color="k", lw=0.8)
        ax.set(xscale="log", xlabel=label, ylabel="error % (+ = predicted faster)")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("Residuals of the fitted GPU model against the four variables")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
