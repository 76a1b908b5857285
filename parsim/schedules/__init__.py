"""The Schedule IR, its generators (naive, gpipe, 1f1b, interleaved, looped-bfs, and the
zero-bubble family zb-h1, zb-h2, interleaved-zb, zbv, dualpipev), its checks and dry run, the
explicit-communication lowering, torch's CSV format, and the conversion to
torch.distributed.pipelining actions (torch imported lazily)."""
from .bubbles import closed_form_idle_time
from .check import ScheduleCheck, check_schedule
from .csv_io import dump_schedule_csv, load_schedule_csv
from .dryrun import (DryRun, TimedAction, dependencies, dry_run, list_schedule, peak_inflight_microbatches,
                     peak_inflight_per_rank)
from .generators import (V_PLACED, build_schedule, cached_schedule, build_schedule_for_plan, chunk_of_pass, default_vpp, held_at_backwards,
                         stage_placement,
                         passes_by_chunk, textbook_bubble_fraction, warmup_forwards)
from .ir import (ALL_KINDS, COMM_KINDS, KINDS, OVERLAP_F_B, STAGE_KINDS, Action, OverlapFB, Schedule, ScheduleError,
                 loop_placement, v_placement)
from .lowering import compute_only, lower_schedule
from .torch_actions import from_torch_actions, to_torch_actions

__all__ = [
    "KINDS", "COMM_KINDS", "STAGE_KINDS", "OVERLAP_F_B", "ALL_KINDS", "Action", "OverlapFB", "Schedule",
    "loop_placement", "v_placement",
    "build_schedule", "cached_schedule", "build_schedule_for_plan", "stage_placement", "default_vpp", "textbook_bubble_fraction", "warmup_forwards",
    "chunk_of_pass", "passes_by_chunk", "held_at_backwards",
    "V_PLACED", "closed_form_idle_time",
    "DryRun", "ScheduleCheck", "ScheduleError", "TimedAction", "check_schedule", "dependencies", "dry_run",
    "list_schedule", "peak_inflight_microbatches", "peak_inflight_per_rank",
    "lower_schedule", "compute_only",
    "load_schedule_csv", "dump_schedule_csv",
    "to_torch_actions", "from_torch_actions",
]
