"""The Schedule IR, its generators (naive, gpipe, 1f1b, interleaved), its checks and dry run,
and the conversion to torch.distributed.pipelining actions (torch imported lazily)."""
from .check import (DryRun, ScheduleCheck, ScheduleError, TimedAction, check_schedule, dependencies, dry_run,
                    peak_inflight_microbatches, peak_inflight_per_rank)
from .generators import (build_schedule, build_schedule_for_plan, chunk_of_pass, held_at_backwards,
                         passes_by_chunk, textbook_bubble_fraction, warmup_forwards)
from .ir import KINDS, Action, Schedule
from .torch_actions import from_torch_actions, to_torch_actions

__all__ = [
    "KINDS", "Action", "Schedule",
    "build_schedule", "build_schedule_for_plan", "textbook_bubble_fraction", "warmup_forwards",
    "chunk_of_pass", "passes_by_chunk", "held_at_backwards",
    "DryRun", "ScheduleCheck", "ScheduleError", "TimedAction", "check_schedule", "dependencies", "dry_run",
    "peak_inflight_microbatches", "peak_inflight_per_rank",
    "to_torch_actions", "from_torch_actions",
]
