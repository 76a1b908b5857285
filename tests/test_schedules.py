"""The Schedule IR generators, checker, dry run, in-flight counts and torch conversion."""
import subprocess
import sys
from fractions import Fraction
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsim.schedules import (Action, Schedule, ScheduleError, build_schedule, build_schedule_for_plan, check_schedule,
                              dry_run, from_torch_actions, peak_inflight_microbatches, peak_inflight_per_rank,
                              textbook_bubble_fraction, to_torch_actions, warmup_forwards)
from parsim.specs import Plan, SpecError

FAST = settings(max_examples=60, deadline=None)


@st.composite
def schedules(draw, names=("naive", "gpipe", "1f1b", "interleaved")):
    name = draw(st.sampled_from(names))
    if name == "interleaved":
        pp = draw(st.integers(2, 8))
        vpp = draw(st.integers(2, 4))
        m = pp * draw(st.integers(1, 32 // pp))
    else:
        pp, vpp, m = draw(st.integers(1, 8)), 1, draw(st.integers(1, 32))
    return build_schedule(name, pp, m, vpp)


def parse(text: str) -> tuple[Action, ...]:
    """'F0.1 B0.1' -> (Action('F', 0, 1), Action('B', 0, 1))."""
    return tuple(Action(tok[0], int(tok[1:].split(".")[0]), int(tok.split(".")[1])) for tok in text.split())


def exact_bubble(schedule: Schedule, t_f: int, t_b: int) -> Fraction:
    v = schedule.vpp   # the times are per virtual-stage chunk: a stage's time / vpp
    return dry_run(schedule, t_f=Fraction(t_f, v), t_b=Fraction(t_b, v)).bubble_fraction


# --- properties of every generated schedule -------------------------------------------------

@FAST
@given(schedules())
def test_every_generated_schedule_passes_the_checker(schedule):
    check = check_schedule(schedule)
    assert check.num_actions == 2 * schedule.num_stages * schedule.num_microbatches


@FAST
@given(schedules())
def test_every_stage_and_microbatch_has_one_forward_and_one_backward_on_the_rank_holding_the_stage(schedule):
    for rank, order in enumerate(schedule.actions):
        assert len(order) == len(set(order))
        assert all(a.stage % schedule.pp == rank for a in order)
    every = sorted(a for order in schedule.actions for a in order)
    expected = sorted(Action(k, s, j) for k in "FB" for s in range(schedule.num_stages)
                      for j in range(schedule.num_microbatches))
    assert every == expected


@FAST
@given(schedules(), st.sampled_from([(1, 2), (1, 1)]))
def test_dry_run_bubble_equals_the_textbook_formula_exactly(schedule, times):
    p, m, v = schedule.pp, schedule.num_microbatches, schedule.vpp
    denominator = {"naive": p, "gpipe": m + p - 1, "1f1b": m + p - 1, "interleaved": v * m + p - 1}[schedule.name]
    assert exact_bubble(schedule, *times) == Fraction(p - 1, denominator)
    assert textbook_bubble_fraction(schedule.name, p, m, v) == (p - 1) / denominator


@FAST
@given(schedules(("gpipe",)))
def test_gpipe_keeps_all_m_microbatches_in_flight(schedule):
    assert peak_inflight_microbatches(schedule) == [schedule.num_microbatches] * schedule.pp


@FAST
@given(schedules(("1f1b",)))
def test_1f1b_rank_i_keeps_min_p_minus_i_and_m_microbatches_in_flight(schedule):
    p, m = schedule.pp, schedule.num_microbatches
    assert peak_inflight_microbatches(schedule) == [min(p - i, m) for i in range(p)]


@FAST
@given(schedules(("naive",)))
def test_naive_keeps_one_microbatch_in_flight(schedule):
    assert peak_inflight_microbatches(schedule) == [1] * schedule.pp


@FAST
@given(schedules(("interleaved",)))
def test_interleaved_rank_keeps_megatron_warmup_plus_one_chunks_in_flight(schedule):
    p, m, v = schedule.pp, schedule.num_microbatches, schedule.vpp
    expected = [min(warmup_forwards("interleaved", r, p, m, v) + 1, m * v) for r in range(p)]
    assert peak_inflight_per_rank(schedule) == expected


@FAST
@given(schedules(("interleaved",)))
def test_interleaved_rank0_activations_are_1_plus_p_minus_1_over_pv_times_1f1b(schedule):
    # Korthikanti et al. 2022, Sec 4.2.3: interleaving multiplies the first stage's activation
    # memory by (1 + (p-1)/(p v)); each in-flight chunk holds 1/v of the rank's layers.
    p, m, v = schedule.pp, schedule.num_microbatches, schedule.vpp
    if m > p:
        rank0_stage_microbatches = Fraction(peak_inflight_per_rank(schedule)[0], v)
        assert rank0_stage_microbatches == p * (1 + Fraction(p - 1, p * v))


@FAST
@given(schedules(("naive",)), st.integers(1, 5))
def test_naive_dry_run_pays_each_hop_twice_per_microbatch(schedule, t_comm):
    p, m = schedule.pp, schedule.num_microbatches
    run = dry_run(schedule, t_f=1, t_b=2, t_comm=t_comm)
    assert run.makespan == m * (3 * p + 2 * (p - 1) * t_comm)


@FAST
@given(schedules(), st.integers(1, 3))
def test_communication_time_never_shortens_a_step(schedule, t_comm):
    assert dry_run(schedule, 1, 2, t_comm).makespan >= dry_run(schedule, 1, 2).makespan


# --- named cases, pinned by hand ------------------------------------------------------------

def test_1f1b_bubble_equals_p_minus_1_over_m_plus_p_minus_1():
    assert exact_bubble(build_schedule("1f1b", 4, 8), 1, 2) == Fraction(3, 11)
    assert dry_run(build_schedule("1f1b", 4, 8), 1, 2).makespan == (8 + 4 - 1) * 3


def test_interleaved_bubble_is_p_minus_1_over_v_m_plus_p_minus_1():
    assert exact_bubble(build_schedule("interleaved", 4, 8, 2), 1, 2) == Fraction(3, 19)


def test_naive_bubble_is_p_minus_1_over_p():
    assert exact_bubble(build_schedule("naive", 4, 3), 1, 2) == Fraction(3, 4)


def test_1f1b_p4_m8_rank0_warms_up_with_three_forwards_then_alternates():
    schedule = build_schedule("1f1b", 4, 8)
    assert schedule.actions[0] == parse("F0.0 F0.1 F0.2 F0.3 B0.0 F0.4 B0.1 F0.5 B0.2 F0.6 B0.3 F0.7 B0.4 "
                                        "B0.5 B0.6 B0.7")
    assert schedule.actions[3] == parse(" ".join(f"F3.{j} B3.{j}" for j in range(8)))


def test_interleaved_p4_v2_m8_matches_megatron_by_hand():
    # rank 0 warm-up: 2*(p-1) + (v-1)*p = 10 chunk forwards, microbatches in groups of p per chunk
    schedule = build_schedule("interleaved", 4, 8, 2)
    assert schedule.actions[0] == parse("F0.0 F0.1 F0.2 F0.3 F4.0 F4.1 F4.2 F4.3 F0.4 F0.5 "
                                        "F0.6 B4.0 F0.7 B4.1 F4.4 B4.2 F4.5 B4.3 F4.6 B0.0 F4.7 B0.1 "
                                        "B0.2 B0.3 B4.4 B4.5 B4.6 B4.7 B0.4 B0.5 B0.6 B0.7")
    # last rank: warm-up (v-1)*p = 4, then one forward / one backward
    assert schedule.actions[3][:8] == parse("F3.0 F3.1 F3.2 F3.3 F7.0 B7.0 F7.1 B7.1")


def test_interleaved_with_m_equal_p_runs_every_forward_first_as_megatron_does():
    schedule = build_schedule("interleaved", 4, 4, 2)
    for order in schedule.actions:
        kinds = "".join(a.kind for a in order)
        assert kinds == "F" * 8 + "B" * 8


def test_gpipe_runs_all_forwards_then_all_backwards():
    assert build_schedule("gpipe", 2, 3).actions[1] == parse("F1.0 F1.1 F1.2 B1.0 B1.1 B1.2")


def test_naive_runs_one_microbatch_through_the_pipeline_at_a_time():
    run = dry_run(build_schedule("naive", 2, 2), 1, 2)
    starts = {str(t.action): t.start for rank in run.timed_actions for t in rank}
    assert starts == {"F0.0": 0, "F1.0": 1, "B1.0": 2, "B0.0": 4, "F0.1": 6, "F1.1": 7, "B1.1": 8, "B0.1": 10}


def test_build_schedule_for_plan_uses_gbs_over_dp_times_mbs_microbatches():
    schedule = build_schedule_for_plan(Plan(dp=2, pp=4, vpp=2, mbs=2, gbs=32, schedule="interleaved"))
    assert (schedule.pp, schedule.vpp, schedule.num_microbatches) == (4, 2, 8)


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("args, field, fragment", [
    (("zero-bubble", 4, 8, 1), "schedule", "naive, gpipe, 1f1b, interleaved"),
    (("1f1b", 0, 8, 1), "pp", "positive integer"),
    (("1f1b", 4, 0, 1), "num_microbatches", "positive integer"),
    (("1f1b", 4, 8, 0), "vpp", "positive integer"),
    (("1f1b", 4.0, 8, 1), "pp", "positive integer"),
    (("1f1b", True, 8, 1), "pp", "positive integer"),
    (("1f1b", 4, 8, 2), "vpp", "needs schedule=interleaved"),
    (("gpipe", 4, 8, 2), "vpp", "needs schedule=interleaved"),
    (("interleaved", 4, 8, 1), "vpp", "vpp >= 2"),
    (("interleaved", 1, 8, 2), "pp", "pp >= 2"),
    (("interleaved", 4, 6, 2), "num_microbatches", "multiple of pp=4"),
])
def test_bad_schedule_arguments_raise_spec_error_naming_the_field(args, field, fragment):
    for fn in (build_schedule, textbook_bubble_fraction):
        with pytest.raises(SpecError) as err:
            fn(*args)
        assert err.value.field == field and fragment in str(err.value)


@pytest.mark.parametrize("plan, fragment", [
    (Plan(dp=2, gbs=3), "divisible by dp*mbs=2"),
    (Plan(pp=4, vpp=2, gbs=6, schedule="interleaved"), "divisible by pp=4"),
])
def test_plan_with_unusable_gbs_raises_spec_error_on_gbs(plan, fragment):
    with pytest.raises(SpecError) as err:
        build_schedule_for_plan(plan)
    assert err.value.field == "gbs" and fragment in str(err.value)


@pytest.mark.parametrize("times", [dict(t_f=-1), dict(t_b=-0.5), dict(t_comm=-1), dict(t_f="1")])
def test_dry_run_rejects_negative_or_non_numeric_times(times):
    with pytest.raises(SpecError):
        dry_run(build_schedule("1f1b", 2, 2), **times)


# --- the checker rejects broken schedules ---------------------------------------------------

def hand(pp: int, m: int, *orders: str, vpp: int = 1) -> Schedule:
    return Schedule("hand", pp, vpp, m, tuple(parse(o) for o in orders))


GOOD = ("F0.0 B0.0 F0.1 B0.1", "F1.0 B1.0 F1.1 B1.1")


@pytest.mark.parametrize("orders, fragment", [
    (("F0.0 B0.0 F0.1", GOOD[1]), "B0.1 is missing"),
    (("F0.0 B0.0 F0.1 B0.1 B0.1", GOOD[1]), "B0.1 appears more than once"),
    (("F0.0 B0.0 F0.1 B0.1 F1.0", "B1.0 F1.1 B1.1"), "F1.0 is on rank 0 but stage 1 lives on rank 1"),
    (("F0.0 B0.0 F0.1 B0.1 X0.2", GOOD[1]), "kind must be one of F, B, I, W"),
    (("F0.0 B0.0 F0.1 B0.1 F2.0", GOOD[1]), "stage must be in 0..1"),
    (("F0.0 B0.0 F0.1 B0.1 F0.2", GOOD[1]), "microbatch must be in 0..1"),
    (("F0.0 B0.0 B0.1 F0.1", GOOD[1]), "on rank 0, B0.1 comes before F0.1"),
    (("F0.0 B0.0 F0.1 B0.1", "F1.1 F1.0 B1.0 B1.1"), "deadlock"),
    (("F0.0 B0.0 F0.1 B0.1 I0.0", GOOD[1]), "both B and I/W"),
    (("F0.0 B0.0 F0.1 I0.1", GOOD[1]), "W0.1 is missing"),
    (("F0.0 B0.0 F0.1 B0.1",), "one per rank, pp=2"),
])
def test_checker_rejects_broken_schedules_with_a_schedule_error(orders, fragment):
    with pytest.raises(ScheduleError) as err:
        check_schedule(hand(2, 2, *orders))
    assert isinstance(err.value, SpecError) and err.value.field == "schedule"
    assert fragment in str(err.value)


def test_checker_reports_which_ranks_wait_for_what_in_a_deadlock():
    with pytest.raises(ScheduleError) as err:
        check_schedule(hand(2, 2, GOOD[0], "F1.1 F1.0 B1.0 B1.1"))
    assert "rank 0 waits at B0.0 for B1.0" in str(err.value)
    assert "rank 1 waits at F1.1 for F0.1" in str(err.value)


def test_zero_bubble_input_and_weight_gradients_pass_and_w_waits_for_i():
    schedule = hand(2, 2, "F0.0 F0.1 I0.0 I0.1 W0.0 W0.1", "F1.0 I1.0 F1.1 I1.1 W1.0 W1.1")
    check_schedule(schedule)
    run = dry_run(schedule, t_f=1, t_b=2, t_w=1)
    end = {str(t.action): t.end for rank in run.timed_actions for t in rank}
    assert end["I1.0"] == 3 and end["I0.0"] == 4    # I0.0 needs I1.0 (1 unit each)
    # activations are held until the weight gradient, so rank 1 holds both microbatches
    assert peak_inflight_microbatches(schedule) == [2, 2]
    with pytest.raises(ScheduleError, match="W0.0 comes before I0.0"):
        check_schedule(hand(2, 2, "F0.0 F0.1 W0.0 I0.0 I0.1 W0.1", "F1.0 I1.0 F1.1 I1.1 W1.0 W1.1"))


def test_schedules_import_and_run_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from parsim.schedules import build_schedule, check_schedule\n"
            "check_schedule(build_schedule('interleaved', 2, 4, 2)); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# --- torch.distributed.pipelining ------------------------------------------------------------

@pytest.fixture(scope="module")
def torch_schedules():
    pytest.importorskip("torch")
    from torch.distributed.pipelining import schedules
    return schedules


class RecordingStage:
    """Stands in for a PipelineStage: records the compute calls torch's runtime makes and
    has no communication (every get_*_ops returns no ops)."""

    def __init__(self, stage_index: int, num_stages: int):
        self.stage_index, self.num_stages = stage_index, num_stages
        self.is_last = stage_index == num_stages - 1
        self.calls: list[Action] = []

    def forward_one_chunk(self, microbatch, *args, **kwargs):
        self.calls.append(Action("F", self.stage_index, microbatch))

    def backward_one_chunk(self, microbatch, **kwargs):
        self.calls.append(Action("B", self.stage_index, microbatch))

    def __getattr__(self, name):
        return (lambda *a, **k: []) if name.startswith("get_") else (lambda *a, **k: None)


def torch_runtime_order(schedule_class, pp: int, m: int) -> tuple[tuple[Action, ...], ...]:
    """The compute order torch's single-stage runtime (``_step_microbatches``) executes per rank."""
    orders = []
    for rank in range(pp):
        stage = RecordingStage(rank, pp)
        runtime = schedule_class(stage, m)
        runtime._initialize_stage = lambda *a, **k: None    # no shape inference: nothing runs
        runtime._step_microbatches()
        orders.append(tuple(stage.calls))
    return tuple(orders)


def torch_interleaved_order(torch_schedules, pp: int, vpp: int, m: int) -> Schedule:
    stages = [SimpleNamespace(num_stages=pp * vpp, group_size=pp, group_rank=0, stage_index=c * pp)
              for c in range(vpp)]
    order = torch_schedules.ScheduleInterleaved1F1B(stages, m).pipeline_order
    return from_torch_actions(order, name="interleaved", pp=pp, num_microbatches=m, vpp=vpp)


def test_to_torch_actions_maps_each_action_to_a_torch_compute_action(torch_schedules):
    schedule = build_schedule("interleaved", 2, 2, 2)
    converted = to_torch_actions(schedule)
    assert sorted(converted) == [0, 1]
    first = converted[1][0]
    assert isinstance(first, torch_schedules._Action)
    assert (first.stage_index, first.computation_type, first.microbatch_index) == (1, torch_schedules.FORWARD, 0)
    assert all(a is not None and a.is_compute_op for order in converted.values() for a in order)
    kinds = {a.computation_type for order in converted.values() for a in order}
    assert kinds == {torch_schedules.FORWARD, torch_schedules.FULL_BACKWARD}


def test_zero_bubble_actions_map_to_torch_input_and_weight_backward(torch_schedules):
    converted = to_torch_actions(hand(1, 1, "F0.0 I0.0 W0.0"))
    assert [a.computation_type for a in converted[0]] == [torch_schedules.FORWARD, torch_schedules.BACKWARD_INPUT,
                                                          torch_schedules.BACKWARD_WEIGHT]


@settings(max_examples=30, deadline=None)
@given(schedules())
def test_torch_actions_round_trip(torch_schedules, schedule):
    back = from_torch_actions(to_torch_actions(schedule), name=schedule.name, pp=schedule.pp,
                              num_microbatches=schedule.num_microbatches, vpp=schedule.vpp)
    assert back == schedule


@pytest.mark.parametrize("pp, m", [(1, 1), (2, 2), (2, 5), (3, 3), (4, 4), (4, 8), (4, 11), (6, 12)])
def test_1f1b_equals_the_order_torch_schedule1f1b_runs(torch_schedules, pp, m):
    ours = build_schedule("1f1b", pp, m).actions
    assert torch_runtime_order(torch_schedules.Schedule1F1B, pp, m) == ours
    # torch's pipeline_order (the IR it prints) agrees on every rank but the last: in torch
    # 2.13 Schedule1F1B._get_pipeline_order numbers the last rank's forwards from 1 (F1..Fm,
    # an off-by-one in that display-only IR); its runtime, checked above, runs F0..F(m-1).
    listed = from_torch_actions(torch_schedules.Schedule1F1B(SimpleNamespace(num_stages=pp), m).pipeline_order,
                                name="1f1b", pp=pp, num_microbatches=m).actions
    assert listed[:-1] == ours[:-1]


@pytest.mark.parametrize("pp, m", [(1, 3), (3, 2), (4, 8)])
def test_gpipe_equals_torch_schedule_gpipe(torch_schedules, pp, m):
    ours = build_schedule("gpipe", pp, m).actions
    assert torch_runtime_order(torch_schedules.ScheduleGPipe, pp, m) == ours
    listed = torch_schedules.ScheduleGPipe(SimpleNamespace(num_stages=pp), m).pipeline_order
    assert from_torch_actions(listed, name="gpipe", pp=pp, num_microbatches=m).actions == ours


@pytest.mark.parametrize("pp, vpp, m", [(2, 2, 4), (2, 3, 6), (3, 2, 9), (4, 2, 8), (4, 3, 16), (4, 4, 12),
                                        (6, 2, 12), (8, 2, 16)])
def test_interleaved_equals_torch_schedule_interleaved_1f1b(torch_schedules, pp, vpp, m):
    assert torch_interleaved_order(torch_schedules, pp, vpp, m).actions == build_schedule("interleaved", pp, m,
                                                                                          vpp).actions


@pytest.mark.parametrize("pp, vpp", [(2, 2), (4, 2), (4, 3), (6, 4)])
def test_interleaved_with_m_equal_p_differs_from_torch_only_in_warmup_with_the_same_bubble(torch_schedules, pp, vpp):
    # Megatron-LM runs every forward first when m == p; torch 2.13 caps the warm-up at
    # 2(p-1-r) + (v-1)p, so its ranks r > (p-2)/2 start backwards earlier. Both are valid and
    # take the same time; torch's later ranks hold fewer chunks in flight.
    theirs = torch_interleaved_order(torch_schedules, pp, vpp, pp)
    ours = build_schedule("interleaved", pp, pp, vpp)
    check_schedule(theirs)
    differing = [r for r in range(pp) if theirs.actions[r] != ours.actions[r]]
    assert differing == [r for r in range(pp) if r > (pp - 2) / 2]
    for times in ((1, 2), (1, 1)):
        assert exact_bubble(theirs, *times) == exact_bubble(ours, *times)
    assert all(t <= o for t, o in zip(peak_inflight_per_rank(theirs), peak_inflight_per_rank(ours)))
