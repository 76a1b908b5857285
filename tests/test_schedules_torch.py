"""Our generated action lists equal torch 2.13's, compute and communication actions alike.

For every schedule torch.distributed.pipelining also generates, at pp in {2, 4, 8} and
microbatch counts including the edges torch accepts: the compute order equals torch's
``pipeline_order`` (idle ``None`` slots dropped), and our lowering equals torch's
``pipeline_order_with_comms`` action for action (SEND/RECV, UNSHARD/RESHARD, REDUCE_GRAD),
with and without ``defer_pp_recv``. For schedules torch only runs from a file (ours that it
has no class for, and its single-stage 1F1B/GPipe, whose runtime sends implicitly), torch's
runtime loads our CSV and lowers it, and that equals our lowering.
"""
from types import SimpleNamespace

import pytest

from parsim.schedules import (build_schedule, check_schedule, dump_schedule_csv, from_torch_actions, lower_schedule,
                              to_torch_actions)

torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")

PPS = (2, 4, 8)


def fake_stages(pp: int, vpp: int):
    """What a torch schedule's constructor reads from its stages (rank 0's view; every rank
    computes the whole pipeline_order)."""
    return [SimpleNamespace(num_stages=pp * vpp, group_size=pp, group_rank=0, stage_index=c * pp, submod=None)
            for c in range(vpp)]


def torch_accepts(schedule_class, pp: int, vpp: int, m: int) -> bool:
    try:
        schedule_class(fake_stages(pp, vpp), m)
    except ValueError:
        return False
    return True


def cases(name, class_name, vpps, microbatches):
    schedule_class = getattr(torch_schedules, class_name)
    out = []
    for pp in PPS:
        for vpp in vpps:
            for m in sorted(set(microbatches(pp))):
                if torch_accepts(schedule_class, pp, vpp, m):
                    out.append(pytest.param(name, schedule_class, pp, vpp, m, id=f"{name}-pp{pp}-v{vpp}-m{m}"))
    return out


# microbatch counts: the smallest torch accepts, around pp and 2 pp, and a large one
SHARED = (
    cases("looped-bfs", "ScheduleLoopedBFS", (1, 2, 3), lambda p: (1, 2, p - 1, p, 2 * p + 1, 4 * p))
    + cases("zb-h1", "ScheduleInterleavedZeroBubble", (1,), lambda p: (1, 2, p - 1, p, p + 1, 2 * p, 4 * p))
    + cases("interleaved-zb", "ScheduleInterleavedZeroBubble", (2, 3),
            lambda p: (1, 2, p - 1, p, p + 1, 2 * p, 3 * p))
    + cases("zbv", "ScheduleZBVZeroBubble", (2,), lambda p: (1, 2, p, 2 * p - 1, 2 * p, 3 * p + 1))
    + cases("dualpipev", "ScheduleDualPipeV", (2,), lambda p: (2 * p, 2 * p + 1, 3 * p, 4 * p))
    # Megatron-LM's interleaving equals torch's except at m == pp (tests/test_schedules.py)
    + cases("interleaved", "ScheduleInterleaved1F1B", (2, 4), lambda p: (2 * p, 3 * p))
)


def torch_order(order, pp, m, vpp, with_comms=False):
    return from_torch_actions(order, name="torch", pp=pp, num_microbatches=m, vpp=vpp, with_comms=with_comms).actions


@pytest.mark.parametrize("name, schedule_class, pp, vpp, m", SHARED)
def test_generated_actions_equal_torch_compute_and_communication(name, schedule_class, pp, vpp, m):
    ours = build_schedule(name, pp, m, vpp)
    theirs = schedule_class(fake_stages(pp, vpp), m)
    assert ours.actions == torch_order(theirs.pipeline_order, pp, m, vpp)
    lowered = lower_schedule(ours)
    assert lowered.actions == torch_order(theirs.pipeline_order_with_comms, pp, m, vpp, with_comms=True)
    deferred = schedule_class(fake_stages(pp, vpp), m, defer_pp_recv=True)
    assert lower_schedule(ours, defer_recv=True).actions == torch_order(deferred.pipeline_order_with_comms, pp, m,
                                                                        vpp, with_comms=True)
    # torch's stage placement is ours (V for zbv and dualpipev)
    assert [ours.rank_of_stage(s) for s in range(pp * vpp)] == [theirs.stage_index_to_group_rank[s]
                                                                for s in range(pp * vpp)]
    check_schedule(lowered)


def test_the_equality_matrix_covers_every_shared_schedule_at_pp_2_4_8():
    covered = {(p.values[0], p.values[2]) for p in SHARED}
    names = ("looped-bfs", "zb-h1", "interleaved-zb", "zbv", "dualpipev", "interleaved")
    assert covered == {(n, pp) for n in names for pp in PPS}


def torch_runtime_from_csv(tmp_path, schedule, defer_recv=False):
    """torch's _PipelineScheduleRuntime after loading our compute-only CSV (torch lowers it)."""
    path = dump_schedule_csv(schedule, tmp_path / f"{schedule.name}.csv")
    runtime = torch_schedules._PipelineScheduleRuntime(fake_stages(schedule.pp, schedule.vpp),
                                                        schedule.num_microbatches, defer_pp_recv=defer_recv)
    runtime._load_csv(str(path), format="compute_only")
    return runtime


@pytest.mark.parametrize("name, pp, m", [("1f1b", 2, 2), ("1f1b", 4, 8), ("1f1b", 8, 11), ("gpipe", 4, 6),
                                         ("naive", 4, 3), ("zb-h2", 2, 3), ("zb-h2", 4, 7), ("zb-h2", 8, 20),
                                         ("zb-h1", 4, 9)])
def test_torch_runtime_lowers_our_csv_to_our_lowering(tmp_path, name, pp, m):
    ours = build_schedule(name, pp, m)
    for defer in (False, True):
        runtime = torch_runtime_from_csv(tmp_path, ours, defer)
        assert torch_order(runtime.pipeline_order, pp, m, 1) == ours.actions
        assert (torch_order(runtime.pipeline_order_with_comms, pp, m, 1, with_comms=True)
                == lower_schedule(ours, defer_recv=defer).actions)


def test_torch_actions_round_trip_with_comms_overlap_and_v_placement():
    for schedule in (lower_schedule(build_schedule("dualpipev", 4, 9, 2)), build_schedule("zbv", 2, 5, 2)):
        back = from_torch_actions(to_torch_actions(schedule), name=schedule.name, pp=schedule.pp,
                                  num_microbatches=schedule.num_microbatches, vpp=schedule.vpp, with_comms=True)
        assert back == schedule
    overlap = next(a for a in to_torch_actions(build_schedule("dualpipev", 2, 4, 2))[0]
                   if a.computation_type == torch_schedules.OVERLAP_F_B)
    assert [s.computation_type for s in overlap.sub_actions] == [torch_schedules.FORWARD,
                                                                 torch_schedules.FULL_BACKWARD]
