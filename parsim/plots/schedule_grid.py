"""The action grid of a pipeline schedule: rows = ranks, columns = time, one box per action
(the textbook pipeline diagram, e.g. Narayanan et al. 2021, Fig. 3 and 4). Colours follow
``parsim.plots.style``: forward light blue, backward dark blue, its input-gradient (I) and
weight-gradient (W) parts mid blue and green, idle a pale red hatch; for interleaved and
V-placed schedules later model chunks are drawn lighter. An overlapped F&B slot (DualPipeV)
is split: forward on top, backward below. Sends, receives and other zero-time actions are
not drawn."""
from __future__ import annotations

from pathlib import Path

from matplotlib import rc_context
from matplotlib.colors import to_hex, to_rgb
from matplotlib.patches import Patch, Rectangle

from parsim.schedules import OVERLAP_F_B, DryRun, Schedule

from .style import BUBBLE_EDGE, BUBBLE_FACE, BUBBLE_HATCH, KIND_COLORS, KIND_LABELS, RC, new_figure, save

# How far the last model chunk is blended toward white (pale forwards have less room).
_CHUNK_FADE = {"F": 0.6, "B": 0.35, "I": 0.35, "W": 0.35}


def chunk_color(kind: str, chunk: int, vpp: int) -> str:
    """The kind's colour, blended toward white for later model chunks."""
    base = to_rgb(KIND_COLORS[kind])
    fade = _CHUNK_FADE[kind] * chunk / (vpp - 1) if vpp > 1 else 0.0
    return to_hex(tuple(c + (1 - c) * fade for c in base))


def plot_schedule_grid(schedule: Schedule, grid: DryRun, path: str | Path) -> Path:
    """Draw ``grid`` (a dry run of ``schedule`` in unit times) into a PNG at ``path``."""
    makespan = float(grid.makespan)
    with rc_context(RC):
        fig = new_figure(min(max(6.0, 0.26 * makespan + 1.5), 40.0), 0.5 * schedule.pp + 1.5)
        ax = fig.add_subplot()
        for rank, timed in enumerate(grid.timed_actions):
            y = schedule.pp - 1 - rank          # rank 0 on top, as in the papers
            ax.add_patch(Rectangle((0, y + 0.08), makespan, 0.84, facecolor=BUBBLE_FACE, edgecolor=BUBBLE_EDGE,
                                   hatch=BUBBLE_HATCH, linewidth=0))
            for t in timed:
                if t.end > t.start:
                    _draw_action(ax, schedule, t, y)
        ax.set_xlim(0, makespan)
        ax.set_ylim(0, schedule.pp)
        ax.set_yticks([schedule.pp - 1 - r + 0.5 for r in range(schedule.pp)],
                      [f"rank {r}" for r in range(schedule.pp)])
        ax.tick_params(axis="y", length=0)
        ax.spines["left"].set_visible(False)
        ax.set_xlabel("time (one unit = one forward chunk; a backward takes two, I and W one each); "
                      "box label = microbatch")
        placement = ", V placement" if schedule.placement is not None else ""
        ax.set_title(f"{schedule.name}: pp={schedule.pp}, vpp={schedule.vpp}{placement}, "
                     f"microbatches={schedule.num_microbatches} — bubble {grid.bubble_fraction:.1%}")
        handles = _legend(schedule, grid)
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.35 / schedule.pp ** 0.5),
                  ncol=len(handles) if len(handles) <= 5 else -(-len(handles) // 2), frameon=False)
        return save(fig, path)


def _draw_action(ax, schedule: Schedule, t, y: float) -> None:
    """One box (two stacked half boxes for an overlapped F&B slot), labelled with its microbatch."""
    parts = t.action.sub_actions if t.action.kind == OVERLAP_F_B else (t.action,)
    height = 0.84 / len(parts)
    for n, action in enumerate(parts):
        colour = chunk_color(action.kind, action.stage // schedule.pp, schedule.vpp)
        bottom = y + 0.08 + (len(parts) - 1 - n) * height
        ax.add_patch(Rectangle((float(t.start), bottom), float(t.end - t.start), height,
                               facecolor=colour, edgecolor="white", linewidth=1.0))
        ax.text(float(t.start + t.end) / 2, bottom + height / 2, str(action.microbatch), ha="center", va="center",
                fontsize=8 if len(parts) == 1 else 6, color="black" if sum(to_rgb(colour)) > 1.8 else "white")


def _legend(schedule: Schedule, grid: DryRun) -> list[Patch]:
    used = {a.kind for rank in grid.timed_actions for t in rank
            for a in (t.action.sub_actions if t.action.kind == OVERLAP_F_B else (t.action,))}
    kinds = [k for k in "FBIW" if k in used]
    handles = []
    for kind in kinds:
        for chunk in range(schedule.vpp):
            label = KIND_LABELS[kind] + (f", chunk {chunk}" if schedule.vpp > 1 else "")
            handles.append(Patch(facecolor=chunk_color(kind, chunk, schedule.vpp), label=label))
    handles.append(Patch(facecolor=BUBBLE_FACE, edgecolor=BUBBLE_EDGE, hatch=BUBBLE_HATCH, linewidth=0, label="idle"))
    return handles
