"""Read and write schedules in torch 2.13's ``_dump_csv`` format.

torch's ``PipelineScheduleMulti._dump_csv`` / ``_PipelineScheduleRuntime._dump_csv`` write
one CSV row per pipeline rank (rank 0 first) with Python's ``csv.writer`` (so rows end in
CRLF), one cell per action in the rank's order, each cell ``str(_Action)``:
``[stage][kind][microbatch]`` such as ``2F0``, ``1I3``, ``0W3``, ``3SEND_F1``, ``2RECV_B0``;
per-stage actions without a microbatch (``0UNSHARD``, ``1RESHARD``, ``1REDUCE_GRAD``); an
overlapped slot as ``(0F3;1B2)OVERLAP_F_B``; an idle slot (``None``) as an empty cell.
``_load_csv`` reads it back with ``_Action.from_str`` (format "compute_only", or
"compute_comms" with explicit SEND/RECV). Here a file with any SEND/RECV is read as a lowered
schedule (every cross-rank transfer must then have both), otherwise as compute-only.

Every problem -- a cell that is not an action, the wrong number of rows, a RECV without its
SEND, a microbatch never backpropagated, a deadlock -- is one SpecError naming the file, the
row (rank) and column, and what is allowed.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

from parsim.specs import SpecError

from .check import check_schedule
from .ir import COMM_KINDS, KINDS, OVERLAP_F_B, STAGE_KINDS, Action, Item, OverlapFB, Schedule, ScheduleError
from .torch_actions import infer_placement

_ACTION = re.compile(r"(\d+)(" + "|".join(sorted(KINDS + COMM_KINDS + STAGE_KINDS, key=len, reverse=True))
                     + r")(\d*)")
_OVERLAP = re.compile(r"\((.*)\)" + OVERLAP_F_B)
_FORMAT = ("an action in torch's format [stage][kind][microbatch] with kind one of "
           + ", ".join(KINDS + COMM_KINDS + STAGE_KINDS)
           + " (e.g. 2F0, 1I3, 3SEND_F1, 0REDUCE_GRAD), an overlapped slot such as (0F3;1B2)OVERLAP_F_B, "
           "or an empty cell")


def action_text(item: Item) -> str:
    """``item`` as torch prints it (``_Action.__repr__``): 2F0, 0UNSHARD, (0F3;1B2)OVERLAP_F_B."""
    if item.kind == OVERLAP_F_B:
        return "(" + ";".join(action_text(a) for a in item.sub_actions) + ")" + OVERLAP_F_B
    return f"{item.stage}{item.kind}" + ("" if item.microbatch is None else str(item.microbatch))


def parse_action(text: str) -> Item | None:
    """The action a CSV cell holds (None for an empty cell); ValueError if it is none."""
    text = text.strip()
    if not text:
        return None
    overlap = _OVERLAP.fullmatch(text)
    if overlap:
        parts = [parse_action(p) for p in overlap.group(1).split(";")]
        if len(parts) != 2 or any(p is None or p.kind == OVERLAP_F_B for p in parts):
            raise ValueError("an overlapped slot holds exactly two actions, a forward and a backward")
        return OverlapFB(*parts)
    match = _ACTION.fullmatch(text)
    if not match:
        raise ValueError(f"not {_FORMAT}")
    stage, kind, microbatch = match.groups()
    if kind in STAGE_KINDS and microbatch:
        raise ValueError(f"{kind} acts on a whole stage and takes no microbatch (e.g. {stage}{kind})")
    if kind not in STAGE_KINDS and not microbatch:
        raise ValueError(f"{kind} needs a microbatch index (e.g. {stage}{kind}0)")
    return Action(kind, int(stage), int(microbatch) if microbatch else None)


def dump_schedule_csv(schedule: Schedule, path: str | Path) -> Path:
    """Write ``schedule`` as torch's ``_dump_csv`` does (one row per rank)."""
    from parsim.specs.files import output_file
    path = Path(path)
    with output_file(path, "dump_csv") as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        for order in schedule.actions:
            writer.writerow([action_text(a) for a in order])
    return path


def load_schedule_csv(path: str | Path, pp: int | None = None, *, num_microbatches: int | None = None,
                      vpp: int | None = None, name: str | None = None) -> Schedule:
    """The checked Schedule in a torch ``_dump_csv`` file. ``pp`` (default: the number of
    rows) must equal the number of rows; ``vpp`` defaults to the stages used / pp and
    ``num_microbatches`` to the largest microbatch used + 1; stage placement is read off the
    rows that run each stage. Raises SpecError naming the file, row and column."""
    rows = _read_rows(path)
    where = _Locator(path)
    pp = len(rows) if pp is None else pp
    if len(rows) != pp:
        raise SpecError("csv", str(path), f"has {len(rows)} rows; needs one per pipeline rank, pp={pp}")
    actions: list[tuple[Item, ...]] = []
    for r, row in enumerate(rows):
        order = []
        for c, cell in enumerate(row):
            try:
                item = parse_action(cell)
            except ValueError as err:
                raise SpecError("csv", cell, f"{where(r, c)}: {err}") from None
            if item is not None:
                where.place(r, c, item)
                order.append(item)
        actions.append(tuple(order))
    leaves = [a for order in actions for item in order for a in (item.sub_actions if item.kind == OVERLAP_F_B
                                                                   else (item,))]
    if not leaves:
        raise SpecError("csv", str(path), "holds no actions")
    stages = max(a.stage for a in leaves) + 1
    vpp = _vpp(path, stages, pp) if vpp is None else vpp
    m = 1 + max((a.microbatch for a in leaves if a.microbatch is not None), default=0)
    m = m if num_microbatches is None else num_microbatches
    schedule = Schedule(name=name or f"csv:{Path(path).name}", pp=pp, vpp=vpp, num_microbatches=m,
                        actions=tuple(actions), placement=infer_placement(actions, pp, vpp))
    try:
        check_schedule(schedule)
    except ScheduleError as err:
        raise where.error(err) from None
    return schedule


def _read_rows(path) -> list[list[str]]:
    """The cells of the CSV ``path``, checked for size (at most ``MAX_INPUT_BYTES``, and at most
    the event limit of cells: each is an action the schedule checks and dry-runs)."""
    from parsim.specs.bounds import max_events
    from parsim.specs.files import MAX_INPUT_BYTES

    try:
        if Path(path).is_dir():
            raise SpecError("csv", str(path), "a CSV file, not a directory")
        size = Path(path).stat().st_size
        if size > MAX_INPUT_BYTES:
            raise SpecError("csv", str(path), f"a CSV file of at most {MAX_INPUT_BYTES // 2**20} MiB "
                            f"(it has {size:,} bytes)")
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        cells = sum(len(r) for r in rows)
        if cells > max_events():
            raise SpecError("csv", str(path), f"a schedule of at most {max_events():,} actions (it has {cells:,} "
                            "cells)")
    except OSError as err:
        raise SpecError("csv", str(path), f"a readable CSV file ({err.strerror})") from None
    except (csv.Error, UnicodeDecodeError) as err:
        raise SpecError("csv", str(path), f"a CSV file in torch's _dump_csv format ({err})") from None
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()                        # a trailing blank line is not a rank
    return rows


def _vpp(path, stages: int, pp: int) -> int:
    if stages % pp:
        raise SpecError("csv", str(path), f"uses stages 0..{stages - 1}, {stages} in all; needs a multiple of "
                        f"the {pp} ranks (vpp stages each)")
    return stages // pp


class _Locator:
    """Where each action sits in the file, to point an error at its cell."""

    def __init__(self, path):
        self.path = path
        self.cells: dict[tuple[int, Item], tuple[int, str]] = {}

    def __call__(self, row: int, column: int) -> str:
        return f"{self.path} row {row + 1} (rank {row}), column {column + 1}"

    def place(self, row: int, column: int, item: Item) -> None:
        for key in [item, *(item.sub_actions if item.kind == OVERLAP_F_B else ())]:
            self.cells.setdefault((row, key), (column, action_text(item)))

    def error(self, err: ScheduleError) -> SpecError:
        found = self.cells.get((err.rank, err.action)) if err.rank is not None else None
        if found is None:
            where = f"{self.path}" + (f" row {err.rank + 1} (rank {err.rank})" if err.rank is not None else "")
            return SpecError("csv", str(self.path), f"{where}: {err.problem}")
        column, text = found
        return SpecError("csv", text, f"{self(err.rank, column)}: {err.problem}")
