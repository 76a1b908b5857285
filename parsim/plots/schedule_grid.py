"""The action grid of a pipeline schedule: rows = ranks, columns = time, one box per action
(the textbook pipeline diagram, e.g. Narayanan et al. 2021, Fig. 3 and 4). Colours follow
``parsim.plots.style``: forward light blue, backward dark blue, idle a pale red hatch; for
interleaved schedules later model chunks are drawn lighter."""
from __future__ import annotations

from pathlib import Path

from matplotlib import rc_context
from matplotlib.colors import to_hex, to_rgb
from matplotlib.patches import Patch, Rectangle

from parsim.schedules import DryRun, Schedule

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
                kind, chunk = t.action.kind, t.action.stage // schedule.pp
                colour = chunk_color(kind, chunk, schedule.vpp)
                ax.add_patch(Rectangle((float(t.start), y + 0.08), float(t.end - t.start), 0.84,
                                       facecolor=colour, edgecolor="white", linewidth=1.0))
                ax.text(float(t.start + t.end) / 2, y + 0.5, str(t.action.microbatch), ha="center", va="center",
                        fontsize=8, color="black" if sum(to_rgb(colour)) > 1.8 else "white")
        ax.set_xlim(0, makespan)
        ax.set_ylim(0, schedule.pp)
        ax.set_yticks([schedule.pp - 1 - r + 0.5 for r in range(schedule.pp)],
                      [f"rank {r}" for r in range(schedule.pp)])
        ax.tick_params(axis="y", length=0)
        ax.spines["left"].set_visible(False)
        ax.set_xlabel("time (one unit = one forward chunk; a backward takes two); box label = microbatch")
        ax.set_title(f"{schedule.name}: pp={schedule.pp}, vpp={schedule.vpp}, "
                     f"microbatches={schedule.num_microbatches} — bubble {grid.bubble_fraction:.1%}")
        handles = _legend(schedule, grid)
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.35 / schedule.pp ** 0.5),
                  ncol=min(len(handles), 9), frameon=False)
        return save(fig, path)


def _legend(schedule: Schedule, grid: DryRun) -> list[Patch]:
    kinds = [k for k in "FBIW" if any(t.action.kind == k for rank in grid.timed_actions for t in rank)]
    handles = []
    for kind in kinds:
        for chunk in range(schedule.vpp):
            label = KIND_LABELS[kind] + (f", chunk {chunk}" if schedule.vpp > 1 else "")
            handles.append(Patch(facecolor=chunk_color(kind, chunk, schedule.vpp), label=label))
    handles.append(Patch(facecolor=BUBBLE_FACE, edgecolor=BUBBLE_EDGE, hatch=BUBBLE_HATCH, linewidth=0, label="idle"))
    return handles
