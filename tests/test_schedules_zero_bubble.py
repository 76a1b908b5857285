"""The zero-bubble family, looped BFS and V placement: checked, and their unit-time bubbles
equal to the published closed forms (parsim.schedules.bubbles) inside each form's range."""
from fractions import Fraction
from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsim.schedules import (Action, OverlapFB, Schedule, ScheduleError, build_schedule, check_schedule,
                              closed_form_idle_time, dry_run, lower_schedule, peak_inflight_per_rank,
                              textbook_bubble_fraction, v_placement)
from parsim.specs import SpecError

FAST = settings(max_examples=40, deadline=None)
VPP = {"zbv": 2, "dualpipev": 2}
# the schedules that arrived with zero bubble (issue 21)
ZERO_BUBBLE_FAMILY = ("zb-h1", "zb-h2", "interleaved-zb", "zbv", "dualpipev", "looped-bfs")


@st.composite
def new_schedules(draw):
    name = draw(st.sampled_from(ZERO_BUBBLE_FAMILY))
    pp = draw(st.integers(1, 8))
    vpp = VPP.get(name, draw(st.integers(2, 3)) if name in ("interleaved-zb", "looped-bfs") else 1)
    m = draw(st.integers(2 * pp if name == "dualpipev" else 1, 24))
    if name == "interleaved-zb":
        m -= m % max(1, m // pp)      # torch's rounds of equal size
    return build_schedule(name, pp, m, vpp)


def idle_per_rank(schedule: Schedule, t_f, t_i, t_w, t_fb=None) -> list[Fraction]:
    run = dry_run(schedule, t_f=Fraction(t_f), t_b=Fraction(t_i + t_w), t_w=Fraction(t_w),
                  t_fb=None if t_fb is None else Fraction(t_fb))
    return [run.makespan - busy for busy in run.busy_time]


@FAST
@given(new_schedules())
def test_every_new_schedule_passes_the_checker_lowered_or_not_with_the_same_unit_time(schedule):
    check = check_schedule(schedule)
    lowered = check_schedule(lower_schedule(schedule))
    assert lowered.unit_time_makespan == check.unit_time_makespan
    assert lowered.num_actions > check.num_actions


@FAST
@given(new_schedules())
def test_each_pass_of_each_stage_and_microbatch_runs_once_on_the_rank_of_its_stage(schedule):
    passes = [(a, r) for r, order in enumerate(schedule.actions) for item in order
              for a in (item.sub_actions if item.kind == "OVERLAP_F_B" else (item,))]
    assert all(schedule.rank_of_stage(a.stage) == r for a, r in passes)
    kinds = {(a.stage, a.microbatch): set() for a, _ in passes}
    for a, _ in passes:
        kinds[a.stage, a.microbatch].add(a.kind)
    assert len(kinds) == schedule.num_stages * schedule.num_microbatches
    assert all(k in ({"F", "B"}, {"F", "I", "W"}) for k in kinds.values())


# --- closed forms (bubbles.py states each source) --------------------------------------------

TIMES = list(product((1, 2, 3), repeat=3))     # (t_f, t_i, t_w) per chunk


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
def test_zb_h1_idles_p_minus_1_times_f_plus_i_minus_w_when_w_fits(pp):
    # Qi et al. 2023 Table 1: (p-1)(T_F + T_B - T_W); DeepSeek-V3 Table 2: (PP-1)(F + B - 2W)
    for m in (pp, pp + 1, 2 * pp, 3 * pp + 2):
        schedule = build_schedule("zb-h1", pp, m)
        for t_f, t_i, t_w in TIMES:
            if t_w <= min(t_f, t_i):
                assert idle_per_rank(schedule, t_f, t_i, t_w) == [(pp - 1) * (t_f + t_i - t_w)] * pp


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_zb_h1_bubble_is_a_third_of_1f1b_at_equal_pass_times(pp):
    # Qi et al. 2023, Sec 3.1: with T_F = T_B = T_W, ZB-H1's bubble is 1/3 of 1F1B's
    zb, one_f_one_b = build_schedule("zb-h1", pp, 2 * pp), build_schedule("1f1b", pp, 2 * pp)
    assert 3 * idle_per_rank(zb, 1, 1, 1)[0] == idle_per_rank(one_f_one_b, 1, 1, 1)[0] == 3 * (pp - 1)


@pytest.mark.parametrize("name", ["zb-h2", "zbv"])
@pytest.mark.parametrize("pp", [2, 3, 4, 8])
def test_zb_h2_and_zbv_idle_only_the_warm_up_ramp_at_equal_times(name, pp):
    for m in (2 * pp - 1, 2 * pp, 3 * pp + 1):
        schedule = build_schedule(name, pp, m, VPP.get(name, 1))
        for t in (1, 2):
            assert idle_per_rank(schedule, t, t, t) == [(pp - 1) * t] * pp
        # zero bubble once steps tile: each rank busy without a gap from first to last pass
        run = dry_run(schedule, t_f=1, t_b=2)
        for timed in run.timed_actions:
            assert all(a.end == b.start for a, b in zip(timed, timed[1:]))


def test_zb_h2_holds_2p_minus_1_microbatches_on_rank_0_zb_h1_p():
    # Qi et al. 2023 Table 1: peak activation memory (2p-1) M_B for ZB-H2, p M_B for ZB-H1
    for pp in (2, 4, 8):
        assert peak_inflight_per_rank(build_schedule("zb-h2", pp, 4 * pp))[0] == 2 * pp - 1
        assert peak_inflight_per_rank(build_schedule("zb-h1", pp, 4 * pp))[0] == pp


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_dualpipev_largest_idle_is_deepseeks_closed_form(pp):
    # DeepSeek-V3 report Table 2 / DualPipe README: (PP/2 - 1)(F&B + B - 3W), PP = 2p stages
    for m in (2 * pp, 2 * pp + 1, 3 * pp):
        schedule = build_schedule("dualpipev", pp, m, 2)
        for t_f, t_w in ((1, 1), (2, 1), (3, 2), (3, 3)):
            t_b = t_f + t_w                         # t_i = t_f
            for t_fb in (t_f + t_b, Fraction(3, 4) * (t_f + t_b), t_b):
                expected = closed_form_idle_time("dualpipev", pp, m, 2, t_f=t_f, t_b=t_b, t_w=t_w, t_fb=t_fb)
                assert max(idle_per_rank(schedule, t_f, t_f, t_w, t_fb)) == expected


@pytest.mark.parametrize("vpp", [1, 2, 3])
def test_looped_bfs_idles_like_interleaving_once_m_reaches_p(vpp):
    for pp, m in ((2, 2), (4, 5), (8, 8), (8, 13)):
        schedule = build_schedule("looped-bfs", pp, m, vpp)
        for t_f, t_i, t_w in ((1, 1, 1), (1, 2, 1), (2, 1, 3)):
            assert idle_per_rank(schedule, t_f, t_i, t_w) == [(pp - 1) * (t_f + t_i + t_w)] * pp


def test_textbook_fraction_of_new_schedules_is_the_unit_time_dry_run_or_none():
    for name, pp, m, vpp in (("zb-h1", 4, 8, 1), ("zb-h2", 4, 8, 1), ("zbv", 4, 8, 2), ("dualpipev", 4, 8, 2),
                             ("looped-bfs", 4, 8, 2)):
        assert textbook_bubble_fraction(name, pp, m, vpp) == check_schedule(
            build_schedule(name, pp, m, vpp)).unit_time_bubble_fraction
    assert textbook_bubble_fraction("interleaved-zb", 4, 8, 2) is None
    assert textbook_bubble_fraction("zb-h1", 4, 3) is None     # m < p: outside the published form


# --- placement -------------------------------------------------------------------------------

def test_v_placement_puts_stage_r_and_2p_minus_1_minus_r_on_rank_r():
    assert v_placement(4, 2) == (0, 1, 2, 3, 3, 2, 1, 0)
    schedule = build_schedule("zbv", 4, 8, 2)
    assert [schedule.stages_of_rank(r) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert build_schedule("1f1b", 4, 8).placement is None        # loop placement stays the default
    assert Schedule("x", 2, 2, 1, ((), ()), placement=(0, 1, 0, 1)).placement is None


def test_v_placed_forward_to_the_next_stage_on_the_same_rank_has_no_hop():
    schedule = build_schedule("zbv", 2, 3, 2)
    run = dry_run(schedule, t_f=1, t_b=2, t_comm=10)
    end = {t.action: t.end for rank in run.timed_actions for t in rank}
    start = {t.action: t.start for rank in run.timed_actions for t in rank}
    assert start[Action("F", 2, 0)] == end[Action("F", 1, 0)]            # stages 1, 2 on rank 1
    assert start[Action("F", 1, 0)] == end[Action("F", 0, 0)] + 10       # stages 0 -> 1 cross ranks


# --- bad schedules and arguments ---------------------------------------------------------------

def hand(pp, m, *orders, vpp=1, placement=None) -> Schedule:
    def parse(tok):      # "SEND_F0.1" -> Action("SEND_F", 0, 1); "REDUCE_GRAD0" -> microbatch None
        head, _, microbatch = tok.partition(".")
        stage = head.lstrip("".join(ch for ch in head if not ch.isdigit()))
        return Action(head[:len(head) - len(stage)], int(stage), int(microbatch) if microbatch else None)
    return Schedule("hand", pp, vpp, m, tuple(tuple(parse(t) for t in o.split()) for o in orders), placement)


LOWERED = ("F0.0 SEND_F0.0 RECV_B0.0 B0.0", "RECV_F1.0 F1.0 B1.0 SEND_B1.0")


@pytest.mark.parametrize("orders, fragment", [
    (("F0.0 B0.0", "F1.0 I1.0"), "W1.0 is missing (microbatch 0 is never fully backpropagated through stage 1)"),
    (("F0.0 B0.0", "F1.0 W1.0"), "I1.0 is missing"),
    (("F0.0 SEND_F0.0 B0.0", "RECV_F1.0 F1.0 B1.0 SEND_B1.0"), "SEND_B1.0 on rank 1 has no matching RECV_B0.0"),
    (("F0.0 RECV_B0.0 B0.0", "RECV_F1.0 F1.0 B1.0 SEND_B1.0"), "RECV_F1.0 on rank 1 has no matching SEND_F0.0"),
    (("F0.0 SEND_F0.0 RECV_B0.0 B0.0", "F1.0 RECV_F1.0 B1.0 SEND_B1.0"), "F1.0 comes before RECV_F1.0"),
    (("F0.0 SEND_F0.0 SEND_F0.0 RECV_B0.0 B0.0", LOWERED[1]), "SEND_F0.0 appears more than once"),
    ((LOWERED[0] + " SEND_B0.0", LOWERED[1]), "SEND_B0.0 on rank 0 has no peer: stage -1 does not exist"),
    ((LOWERED[0] + " REDUCE_GRAD0", LOWERED[1] + " REDUCE_GRAD1"), None),
    (("F0.0 REDUCE_GRAD0 B0.0", "F1.0 B1.0"), "REDUCE_GRAD0 comes before B0.0"),
    (("F0.0 B0.0 UNSHARD0.0", "F1.0 B1.0"), "UNSHARD acts on a whole stage"),
    (("F0.0 B0.0 SEND_X0.0", "F1.0 B1.0"), "kind must be one of F, B, I, W, SEND_F"),
])
def test_checker_names_the_broken_action_for_new_kinds(orders, fragment):
    if fragment is None:
        check_schedule(hand(2, 1, *orders))
        return
    with pytest.raises(ScheduleError) as err:
        check_schedule(hand(2, 1, *orders))
    assert err.value.field == "schedule" and fragment in str(err.value)


def test_checker_rejects_a_malformed_overlap_and_a_bad_placement():
    f, b = Action("F", 0, 0), Action("B", 1, 0)
    with pytest.raises(ScheduleError, match="must pair a forward"):
        check_schedule(Schedule("x", 1, 2, 1, ((OverlapFB(b, f), Action("F", 1, 0), Action("B", 0, 0)),)))
    with pytest.raises(ScheduleError, match="placement"):
        check_schedule(Schedule("x", 2, 1, 1, ((), ()), placement=(0, 5)))


def test_an_overlapped_slot_waits_for_both_passes_inputs_and_takes_t_fb():
    schedule = build_schedule("dualpipev", 2, 4, 2)
    run = dry_run(schedule, t_f=1, t_b=2, t_fb=Fraction(5, 2))
    slots = [t for rank in run.timed_actions for t in rank if t.action.kind == "OVERLAP_F_B"]
    assert slots and all(t.end - t.start == Fraction(5, 2) for t in slots)


@pytest.mark.parametrize("args, field, fragment", [
    (("zbv", 4, 8, 1), "vpp", "zbv schedule needs vpp=2"),
    (("dualpipev", 4, 8, 3), "vpp", "dualpipev schedule needs vpp=2"),
    (("dualpipev", 4, 7, 2), "num_microbatches", "2*pp=8"),
    (("interleaved-zb", 4, 9, 2), "num_microbatches", "multiple of 2"),
    (("interleaved-zb", 4, 8, 1), "vpp", "vpp >= 2"),
    (("zb-h1", 4, 8, 2), "vpp", "vpp > 1 needs schedule=interleaved"),
    (("zb-h3", 4, 8, 1), "schedule", "zb-h1, zb-h2, interleaved-zb, zbv, dualpipev, looped-bfs"),
])
def test_bad_arguments_for_new_schedules_raise_spec_error_naming_the_field(args, field, fragment):
    with pytest.raises(SpecError) as err:
        build_schedule(*args)
    assert err.value.field == field and fragment in str(err.value)


def test_dry_run_takes_per_kind_durations():
    schedule = build_schedule("zb-h1", 2, 2)
    run = dry_run(schedule, t_f=1, t_b=5, t_i=3, t_w=2)
    span = {t.action.kind: t.end - t.start for rank in run.timed_actions for t in rank}
    assert span == {"F": 1, "I": 3, "W": 2}
    with pytest.raises(SpecError):
        dry_run(schedule, t_fb=-1)
