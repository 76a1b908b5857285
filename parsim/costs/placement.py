"""Which pipeline rank holds each virtual stage of a plan (the schedule's placement).

Loop placement (rank r holds stages r, r + pp, ...; Megatron-LM interleaving) for every
schedule but the V-placed ones (zbv, dualpipev: rank r holds stages r and 2 pp - 1 - r, Qi
et al. 2023 Sec 6) and CSV schedules (the file's own). Every engine asks here (via
``parsim.schedules.stage_placement``), never assumes ``stage % pp``.
"""
from __future__ import annotations

from parsim.schedules import stage_placement
from parsim.specs import Plan


def loop_placed(plan: Plan) -> bool:
    """Stage s on rank s % pp (the placement every schedule had before the V-shaped ones)."""
    return plan.schedule_file is None and plan.schedule not in ("zbv", "dualpipev")


def rank_of_stage(plan: Plan, vstage: int) -> int:
    """The pipeline rank that runs virtual stage ``vstage``."""
    if loop_placed(plan):
        return vstage % plan.pp
    return stage_placement(plan)[vstage]


def stages_of_rank(plan: Plan, pp_rank: int) -> list[int]:
    """The virtual stages a pipeline rank holds, in increasing order (its model chunks 0, 1, ...)."""
    if loop_placed(plan):
        return list(range(pp_rank, plan.pp * plan.vpp, plan.pp))
    return [s for s, r in enumerate(stage_placement(plan)) if r == pp_rank]


def remote_messages(plan: Plan, vstage: int, kind: str) -> tuple[int, int]:
    """(received, sent) pipeline messages of one action that cross to another rank: F takes the
    previous stage's activations and sends its own on; B and I take the next stage's gradients
    and send theirs back; W moves nothing. A neighbour on the same rank (the turn of a V) hands
    over in memory."""
    if kind not in ("F", "B", "I"):
        return 0, 0
    last = plan.pp * plan.vpp - 1
    src, dst = (vstage - 1, vstage + 1) if kind == "F" else (vstage + 1, vstage - 1)
    me = rank_of_stage(plan, vstage)
    return (int(0 <= src <= last and rank_of_stage(plan, src) != me),
            int(0 <= dst <= last and rank_of_stage(plan, dst) != me))
