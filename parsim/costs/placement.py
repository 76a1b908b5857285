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
