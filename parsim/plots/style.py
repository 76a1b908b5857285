"""Colours, labels and figure settings shared by every parsim plot.

Compute kinds are blues (forward light, backward dark) so the eye reads a pipeline as
"light then dark"; communication streams get the warm/green hues of the Okabe-Ito
colour-blind-safe palette (Okabe & Ito 2008); idle time is a pale red hatch.
Nothing here touches matplotlib's global state: plots build a ``Figure`` directly and use
``rc_context(RC)``.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

MS = 1e3          # milliseconds per second (printing only)
GIB = 2.0 ** 30   # bytes per GiB (printing only)

KIND_COLORS = {
    "F": "#a6cee3",          # forward: light blue
    "B": "#1f5f9e",          # backward: dark blue
    "I": "#3f8fcf",          # backward, input grad only (zero-bubble)
    "W": "#5aae61",          # backward, weight grad only (zero-bubble)
    "R": "#fdd49e",          # recompute forward: pale orange, hatched
    "optimizer": "#7b3294",  # optimizer step: purple
    "embedding": "#c2a5cf",
    "head": "#c2a5cf",
}
KIND_LABELS = {
    "F": "forward", "B": "backward", "I": "backward (input grad)", "W": "backward (weight grad)",
    "R": "recompute", "optimizer": "optimizer step", "embedding": "embedding / head", "head": "embedding / head",
}
TEXT_ON = {"F": "#08306b", "R": "#7f2704", "embedding": "#2d004b", "head": "#2d004b"}   # dark text on pale bars
RECOMPUTE_HATCH = "////"
OTHER_KIND_COLOR = "#bdbdbd"

STREAM_COLORS = {
    "tp": "#e69f00",    # Okabe-Ito orange
    "dp": "#009e73",    # Okabe-Ito bluish green
    "pp": "#cc79a7",    # Okabe-Ito reddish purple
    "host": "#7f7f7f",
}
STREAM_LABELS = {"tp": "TP comm", "dp": "DP / ZeRO comm", "pp": "PP send/recv", "host": "host / offload"}
COMM_STREAMS = ("tp", "dp", "pp", "host")

BUBBLE_FACE = "#fde0dd"
BUBBLE_EDGE = "#ef6548"
BUBBLE_HATCH = "//"

CATEGORY_COLORS = {
    "params": "#4575b4",
    "grads": "#91bfdb",
    "optimizer": "#7b3294",
    "activations": "#fc8d59",
    "other": "#bdbdbd",
}
CATEGORY_ORDER = ("params", "grads", "optimizer", "activations", "other")
EXTRA_CATEGORY_COLORS = ("#fee090", "#d73027", "#1a9850", "#8c510a")
CAPACITY_COLOR = "#d62728"

RC = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "hatch.linewidth": 0.5,
    "savefig.dpi": 130,
}


def category_colors(categories: list[str]) -> dict[str, str]:
    """A colour per memory category; unknown categories get the extra colours in turn."""
    extra = iter(EXTRA_CATEGORY_COLORS * (1 + len(categories)))
    return {c: CATEGORY_COLORS.get(c) or next(extra) for c in categories}


def ordered_categories(names) -> list[str]:
    """The known categories in their usual order, then the rest alphabetically."""
    names = set(names)
    return [c for c in CATEGORY_ORDER if c in names] + sorted(names - set(CATEGORY_ORDER))


def new_figure(width_in: float, height_in: float) -> Figure:
    """A Figure not registered with pyplot (no global state; saved with the Agg canvas)."""
    return Figure(figsize=(width_in, height_in), layout="constrained")


def save(fig: Figure, path: str | Path) -> Path:
    """Write the figure whole (a temporary file renamed into place: ``parsim.specs.files``)."""
    from parsim.specs.files import output_file
    path = Path(path)
    with output_file(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png")
    return path
