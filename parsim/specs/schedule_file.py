"""The shape of a ``schedule=csv:FILE`` schedule, for the plan rules: rows, stages, microbatches.

A file in torch 2.13's ``_dump_csv`` format holds one row per pipeline rank, one cell per action
(``2F0``, ``1I3``, ``0REDUCE_GRAD``, ``(0F3;1B2)OVERLAP_F_B``; ``parsim.schedules.csv_io`` reads
and checks it in full when the schedule is built). The rules (``rules.py``) need only its shape:
how many rows (pipeline ranks), stages (the largest stage index + 1) and microbatches (the largest
microbatch index + 1) it uses. Cells that are not actions are left to the full reader.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass

from .errors import SpecError

# a stage index, a kind in capitals, an optional microbatch index (torch's ``_Action`` text)
_CELL = re.compile(r"(\d+)[A-Z_]+(\d*)")


@dataclass(frozen=True)
class ScheduleShape:
    rows: int            # pipeline ranks
    stages: int          # virtual stages used: largest stage index + 1
    microbatches: int    # largest microbatch index + 1


def schedule_shape(path: str) -> ScheduleShape:
    """Rows, stages and microbatches of the schedule in ``path`` (SpecError if unreadable)."""
    try:
        with open(path, newline="") as f:
            rows = [row for row in csv.reader(f)]
    except OSError as err:
        raise SpecError("schedule", f"csv:{path}", f"a readable CSV file ({err.strerror})") from None
    except (csv.Error, UnicodeDecodeError) as err:
        raise SpecError("schedule", f"csv:{path}", f"a CSV file in torch's _dump_csv format ({err})") from None
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()
    stages = microbatches = 0
    for row in rows:
        for cell in row:
            for stage, microbatch in _CELL.findall(cell):
                stages = max(stages, int(stage) + 1)
                if microbatch:
                    microbatches = max(microbatches, int(microbatch) + 1)
    return ScheduleShape(len(rows), stages, microbatches)
