"""Trace metrics, exports and I/O, checked on hand-built traces with known answers."""
import gzip
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsim.trace import (Event, Trace, bubble_fraction, bubble_fraction_by_rank, busy_time, exposed_comm,
                          exposed_comm_by_rank, from_chrome, hardware_flops, hfu, idle_time, load_chrome_trace,
                          load_trace, mfu, save_chrome_trace, save_trace, step_time, summary)
from parsim.trace.frame import EVENT_COLUMNS, from_dataframe, to_dataframe
from parsim.trace.metrics import complement, intersect_intervals, merge_intervals, union_length


def compute(rank, start, end, kind="F", mb=0, layer=-1, flops=0.0, stage=None):
    return Event(rank, rank if stage is None else stage, "compute", kind, mb, layer, start, end, flops=flops,
                 name=f"{kind}{rank}.{mb}" if layer < 0 else "")


def comm(rank, stream, start, end, kind="tp_allreduce", nbytes=1e6):
    return Event(rank, rank, stream, kind, -1, -1, start, end, bytes=nbytes)


def gpipe_trace(p: int, m: int, t_f: float, t_b: float) -> Trace:
    """GPipe with uniform stages and free comm: F(s, j) at (s + j) t_f; the backwards start
    when the last stage has done every forward and run in reverse stage order."""
    events = []
    for s in range(p):
        for j in range(m):
            events.append(compute(s, (s + j) * t_f, (s + j + 1) * t_f, "F", j))
        b0 = (m + p - 1) * t_f + (p - 1 - s) * t_b
        for k in range(m):
            events.append(compute(s, b0 + k * t_b, b0 + (k + 1) * t_b, "B", k))
    return Trace(events, meta={"world_size": p})


# ------------------------------------------------------------------ bubble and busy time

def test_two_rank_trace_bubble_is_idle_device_time_over_total():
    tr = Trace([compute(0, 0.0, 3.0), compute(1, 1.0, 4.0)])
    assert step_time(tr) == 4.0
    assert busy_time(tr) == {0: 3.0, 1: 3.0}
    assert idle_time(tr) == {0: 1.0, 1: 1.0}
    assert bubble_fraction(tr) == pytest.approx(1 - 6 / 8)
    assert bubble_fraction_by_rank(tr) == {0: pytest.approx(0.25), 1: pytest.approx(0.25)}


@pytest.mark.parametrize("p,m", [(4, 8), (2, 1), (8, 32), (16, 100)])
def test_gpipe_bubble_equals_p_minus_1_over_m_plus_p_minus_1(p, m):
    tr = gpipe_trace(p, m, t_f=1.0, t_b=2.0)
    assert step_time(tr) == pytest.approx((m + p - 1) * 3.0)
    assert bubble_fraction(tr) == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)


def test_gpipe_p4_m8_bubble_is_3_over_11_with_seconds_scale_times():
    tr = gpipe_trace(4, 8, t_f=1.3e-3, t_b=2.6e-3)
    assert bubble_fraction(tr) == pytest.approx(3 / 11, rel=1e-9)


def test_nested_layer_events_do_not_double_count_busy_time():
    tr = Trace([compute(0, 0.0, 4.0), compute(0, 0.0, 2.0, layer=0), compute(0, 2.0, 4.0, layer=1),
                compute(0, 5.0, 6.0, kind="optimizer")])
    assert busy_time(tr) == {0: 5.0}
    assert bubble_fraction(tr) == pytest.approx(1 / 6)


def test_rank_with_only_comm_events_counts_as_fully_idle():
    tr = Trace([compute(0, 0.0, 2.0), comm(1, "dp", 0.0, 2.0)])
    assert busy_time(tr) == {0: 2.0, 1: 0.0}
    assert bubble_fraction(tr) == pytest.approx(0.5)


def test_empty_trace_has_zero_metrics():
    tr = Trace()
    assert step_time(tr) == 0.0 and bubble_fraction(tr) == 0.0 and exposed_comm(tr)["tp"] == 0.0


# ------------------------------------------------------------------ exposed communication

def test_comm_fully_hidden_under_compute_is_not_exposed():
    tr = Trace([compute(0, 0.0, 10.0), comm(0, "dp", 2.0, 6.0, "dp_allreduce")])
    assert exposed_comm(tr) == {"tp": 0.0, "dp": 0.0, "pp": 0.0, "total": 0.0}


def test_comm_after_compute_is_exposed_for_its_whole_length():
    tr = Trace([compute(0, 0.0, 10.0), comm(0, "dp", 10.0, 13.5, "dp_allreduce")])
    assert exposed_comm(tr)["dp"] == pytest.approx(3.5)


def test_partly_overlapping_comm_exposes_only_the_part_outside_compute():
    tr = Trace([compute(0, 0.0, 3.0), comm(0, "pp", 2.0, 5.0, "send")])
    assert exposed_comm(tr)["pp"] == pytest.approx(2.0)


def test_overlapping_comm_intervals_count_once():
    tr = Trace([compute(0, 0.0, 1.0), comm(0, "dp", 1.0, 4.0), comm(0, "dp", 2.0, 5.0), comm(0, "dp", 2.5, 3.0)])
    assert exposed_comm(tr)["dp"] == pytest.approx(4.0)


def test_total_exposed_counts_two_streams_in_flight_at_once_once():
    tr = Trace([compute(0, 0.0, 1.0), comm(0, "dp", 1.0, 3.0), comm(0, "pp", 2.0, 4.0, "send")])
    got = exposed_comm(tr)
    assert (got["dp"], got["pp"], got["total"]) == (pytest.approx(2.0), pytest.approx(2.0), pytest.approx(3.0))


def test_exposed_comm_is_averaged_over_ranks_and_reported_per_rank():
    tr = Trace([compute(0, 0.0, 4.0), comm(0, "tp", 4.0, 6.0), compute(1, 0.0, 6.0), comm(1, "tp", 1.0, 2.0)])
    assert exposed_comm_by_rank(tr)[0]["tp"] == pytest.approx(2.0)
    assert exposed_comm_by_rank(tr)[1]["tp"] == 0.0
    assert exposed_comm(tr)["tp"] == pytest.approx(1.0)


def test_blocking_tp_allreduce_between_layers_is_exposed_inside_an_action():
    # one F action [0, 5]: layer 0 computes [0, 2], all-reduce [2, 2.5], layer 1 [2.5, 4.5], all-reduce [4.5, 5]
    tr = Trace([compute(0, 0.0, 5.0), compute(0, 0.0, 2.0, layer=0), comm(0, "tp", 2.0, 2.5),
                compute(0, 2.5, 4.5, layer=1), comm(0, "tp", 4.5, 5.0)])
    assert exposed_comm(tr)["tp"] == pytest.approx(1.0)
    assert bubble_fraction(tr) == 0.0          # inside the action: not pipeline bubble


def test_tp_comm_inside_an_action_without_layer_events_counts_as_hidden():
    tr = Trace([compute(0, 0.0, 5.0), comm(0, "tp", 2.0, 2.5)])
    assert exposed_comm(tr)["tp"] == 0.0


intervals = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 10)), max_size=25)


def _grid(ivs, n=60):
    cover = np.zeros(n, dtype=bool)
    for s, d in ivs:
        cover[s:s + d] = True
    return cover


@settings(max_examples=150, deadline=None)
@given(intervals)
def test_union_length_equals_brute_force_on_a_grid(ivs):
    s = np.array([a for a, _ in ivs], dtype=float)
    e = np.array([a + d for a, d in ivs], dtype=float)
    assert union_length(s, e) == _grid(ivs).sum()
    ms, me = merge_intervals(s, e)
    assert np.all(ms[1:] > me[:-1])                       # disjoint and sorted


@settings(max_examples=150, deadline=None)
@given(intervals, intervals)
def test_exposed_comm_equals_brute_force_on_a_grid(work, talk):
    events = [compute(0, float(s), float(s + d), layer=0) for s, d in work]
    events += [comm(0, "dp", float(s), float(s + d)) for s, d in talk]
    expected = (_grid(talk) & ~_grid(work)).sum()
    assert exposed_comm(Trace(events))["dp"] == pytest.approx(expected)


@settings(max_examples=100, deadline=None)
@given(intervals, intervals)
def test_intersection_and_complement_match_brute_force(a, b):
    arr = lambda ivs: (np.array([s for s, _ in ivs], float), np.array([s + d for s, d in ivs], float))
    xs, xe = intersect_intervals(arr(a), arr(b))
    assert np.sum(xe - xs) == (_grid(a) & _grid(b)).sum()
    gs, ge = complement(*arr(a), 0.0, 60.0)
    assert np.sum(ge - gs) == (~_grid(a)).sum()


# ------------------------------------------------------------------ FLOPs, MFU, HFU

def test_mfu_is_model_flops_per_second_over_aggregate_peak():
    # 1e15 FLOP in 0.5 s on 8 devices of 312 TFLOP/s (A100 bf16 dense): 2e15 / 2.496e15
    assert mfu(1e15, 0.5, 8, 312e12) == pytest.approx(2e15 / (8 * 312e12))


def test_hfu_with_recompute_flops_exceeds_mfu():
    # full recompute adds one forward: hardware = 4/3 x model FLOPs (Korthikanti et al. 2022, Sec. 5)
    model = 6e15
    assert hfu(model * 4 / 3, 1.0, 64, 1e15) / mfu(model, 1.0, 64, 1e15) == pytest.approx(4 / 3)


def test_utilisation_rejects_a_zero_step_time():
    with pytest.raises(ValueError, match="step_time"):
        mfu(1e12, 0.0, 1, 1e12)


def test_hardware_flops_counts_nested_layer_flops_once_and_includes_recompute():
    tr = Trace([
        compute(0, 0.0, 4.0, "B", flops=30.0),                       # action carries all its FLOPs ...
        compute(0, 0.0, 1.0, "R", layer=0, flops=10.0),             # ... its layers repeat them
        compute(0, 1.0, 4.0, "B", layer=0, flops=20.0),
        compute(1, 0.0, 2.0, "F", flops=0.0),                       # action without FLOPs ...
        compute(1, 0.0, 1.0, "F", layer=0, flops=7.0),              # ... layers carry them
        compute(1, 1.0, 2.0, "F", layer=1, flops=8.0),
        comm(1, "tp", 2.0, 3.0),
    ])
    assert hardware_flops(tr) == pytest.approx(30.0 + 15.0)


def test_summary_reports_every_metric_and_mfu_uses_world_size_from_meta():
    tr = gpipe_trace(4, 8, 1e-3, 2e-3)
    for e in tr.events:
        e.flops = 1e12 if e.kind == "F" else 2e12
    tr.meta["world_size"] = 8                                       # 4 pp ranks stand for 2 dp replicas
    s = summary(tr, model_flops_per_step=2 * 4 * 8 * 3e12, peak_flops_per_device=1e15)
    t = 11 * 3e-3
    assert s["step_time_s"] == pytest.approx(t)
    assert s["bubble_fraction"] == pytest.approx(3 / 11)
    assert s["hardware_flops"] == pytest.approx(4 * 8 * 3e12)
    assert s["hfu"] == pytest.approx(4 * 8 * 3e12 / (t * 4 * 1e15))
    assert s["mfu"] == pytest.approx(2 * 4 * 8 * 3e12 / (t * 8 * 1e15))
    assert set(s["exposed_comm_s"]) == {"tp", "dp", "pp", "total"}
    assert s["num_events"] == 64 and s["num_ranks"] == 4
    json.dumps(s)


def test_summary_leaves_utilisation_empty_without_a_peak():
    s = summary(gpipe_trace(2, 2, 1.0, 2.0))
    assert s["mfu"] is None and s["hfu"] is None


# ------------------------------------------------------------------ Chrome trace, JSON, DataFrame

def mixed_trace() -> Trace:
    tr = gpipe_trace(2, 3, 1.25e-3, 2.5e-3)
    tr.events += [comm(0, "tp", 0.5e-3, 0.7e-3), comm(1, "pp", 1.25e-3, 1.5e-3, "recv", 3.2e7),
                  Event(0, 0, "compute", "R", 1, 2, 4.0e-3, 4.5e-3, 0.0, 5.5e11, "")]
    tr.meta.update(engine="test", plan="pp=2")
    return tr


def test_chrome_export_has_complete_events_in_microseconds_and_row_names(tmp_path):
    tr = mixed_trace()
    path = save_chrome_trace(tr, tmp_path / "t.json")
    obj = json.loads(path.read_text())
    assert obj["displayTimeUnit"] == "ms"
    complete = [r for r in obj["traceEvents"] if r["ph"] == "X"]
    assert len(complete) == len(tr.events)
    for r in complete:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(r)
        assert {"stage", "microbatch", "layer", "bytes", "flops"} <= set(r["args"])
    first = next(r for r in complete if r["name"] == "F0.1")
    assert first["ts"] == pytest.approx(1250.0) and first["dur"] == pytest.approx(1250.0)
    meta = {(r["name"], r["pid"], r.get("tid")): r["args"] for r in obj["traceEvents"] if r["ph"] == "M"}
    assert meta[("process_name", 1, 0)]["name"] == "rank 1"
    assert {a["name"] for (n, _, _), a in meta.items() if n == "thread_name"} == {"compute", "tp", "pp"}


def test_chrome_trace_round_trips(tmp_path):
    tr = mixed_trace()
    back = load_chrome_trace(save_chrome_trace(tr, tmp_path / "t.json"))
    assert back.meta == tr.meta
    assert len(back.events) == len(tr.events)
    for a, b in zip(tr.events, back.events):
        assert (a.rank, a.stage, a.stream, a.kind, a.microbatch, a.layer, a.bytes, a.flops) == \
               (b.rank, b.stage, b.stream, b.kind, b.microbatch, b.layer, b.bytes, b.flops)
        assert b.start == pytest.approx(a.start, abs=1e-12) and b.end == pytest.approx(a.end, abs=1e-12)
        assert b.name == (a.name or a.kind)


def test_foreign_chrome_trace_takes_the_stream_from_thread_names():
    obj = {"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 3, "tid": 7, "args": {"name": "tp"}},
                           {"ph": "X", "name": "allreduce", "cat": "tp_allreduce", "pid": 3, "tid": 7,
                            "ts": 10.0, "dur": 5.0}]}
    (e,) = from_chrome(obj).events
    assert (e.rank, e.stream, e.kind, e.start, e.end) == (3, "tp", "tp_allreduce", pytest.approx(1e-5),
                                                         pytest.approx(1.5e-5))


@pytest.mark.parametrize("name", ["trace.json", "trace.json.gz"])
def test_save_and_load_trace_round_trip_exactly(tmp_path, name):
    tr = mixed_trace()
    path = save_trace(tr, tmp_path / name)
    if name.endswith(".gz"):
        assert json.loads(gzip.decompress(path.read_bytes()))["format"] == "parsim-trace"
    back = load_trace(path)
    assert back.events == tr.events and back.meta == tr.meta


def test_load_trace_rejects_a_chrome_file(tmp_path):
    path = save_chrome_trace(mixed_trace(), tmp_path / "c.json")
    with pytest.raises(ValueError, match="not a parsim trace"):
        load_trace(path)


def test_dataframe_has_one_row_per_event_with_duration():
    tr = mixed_trace()
    df = to_dataframe(tr)
    assert list(df.columns) == [*EVENT_COLUMNS, "duration"]
    assert len(df) == len(tr.events)
    assert np.allclose(df["duration"], [e.end - e.start for e in tr.events])
    assert from_dataframe(df, tr.meta).events == tr.events


def test_dataframe_of_empty_trace_has_the_columns():
    assert list(to_dataframe(Trace()).columns) == [*EVENT_COLUMNS, "duration"]
