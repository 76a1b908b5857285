"""Plots write readable PNGs and survive the edge cases (1 rank, no comm, 64 ranks, empty)."""
import numpy as np
import pytest
from matplotlib.image import imread

from parsim.plots import plot_memory_breakdown, plot_memory_over_time, plot_timeline, plot_timeline_pair
from parsim.plots.timeline import coverage, layout_rows, select_ranks
from parsim.trace import Event, Trace

GIB = 2.0 ** 30


def one_f_one_b_trace(p: int, m: int, t_f: float = 1e-3, t_b: float = 2e-3, with_comm: bool = True) -> Trace:
    """Uniform 1F1B by list scheduling (PipeDream-Flush order, Narayanan et al. 2021 Fig. 4),
    with a TP all-reduce after each F, a PP send after each action and a DP all-reduce at the end."""
    order = []
    for r in range(p):
        warm = min(p - 1 - r, m)
        o = [("F", j) for j in range(warm)]
        for j in range(m - warm):
            o += [("F", warm + j), ("B", j)]
        order.append(o + [("B", j) for j in range(m - warm, m)])
    done, free, events = {}, [0.0] * p, []
    while any(order):
        for r in range(p):
            while order[r]:
                kind, j = order[r][0]
                dep = (("F", r - 1, j) if r else None) if kind == "F" else (("B", r + 1, j) if r < p - 1 else ("F", r, j))
                if dep and dep not in done:
                    break
                start = max(free[r], done[dep] if dep else 0.0)
                end = start + (t_f if kind == "F" else t_b)
                events.append(Event(r, r, "compute", kind, j, -1, start, end, name=f"{kind}{r}.{j}"))
                if with_comm:
                    if kind == "F":
                        events.append(Event(r, r, "tp", "tp_allreduce", j, 0, end - 0.2 * t_f, end))
                    events.append(Event(r, r, "pp", "send", j, -1, end, end + 0.1 * t_f))
                done[(kind, r, j)] = free[r] = end
                order[r].pop(0)
    if with_comm:
        for r in range(p):
            events.append(Event(r, -1, "dp", "dp_allreduce", -1, -1, free[r], free[r] + 2 * t_f))
    return Trace(events)


def assert_png(path, min_px=200):
    assert path.exists() and path.stat().st_size > 5_000
    img = imread(path)
    assert img.shape[0] >= min_px and img.shape[1] >= min_px


def test_timeline_of_1f1b_with_tp_pp_dp_comm_writes_a_png(tmp_path):
    assert_png(plot_timeline(one_f_one_b_trace(4, 8), tmp_path / "t.png", title="1f1b"))


def test_timeline_of_a_single_rank_without_comm(tmp_path):
    tr = Trace([Event(0, 0, "compute", "F", 0, -1, 0.0, 1e-3), Event(0, 0, "compute", "B", 0, -1, 1e-3, 3e-3),
                Event(0, -1, "compute", "optimizer", -1, -1, 3.5e-3, 4e-3)])
    assert layout_rows([tr], 16).streams == ()
    assert_png(plot_timeline(tr, tmp_path / "one.png"))


def test_timeline_with_a_comm_stream_empty_on_some_ranks(tmp_path):
    tr = one_f_one_b_trace(2, 2, with_comm=False)
    tr.events.append(Event(1, 1, "tp", "tp_allreduce", 0, 0, 0.0, 1e-4))
    assert_png(plot_timeline(tr, tmp_path / "sparse.png"))


def test_timeline_of_64_ranks_is_subsampled_and_full(tmp_path):
    tr = one_f_one_b_trace(64, 8)
    assert_png(plot_timeline(tr, tmp_path / "sub.png"))
    assert_png(plot_timeline(tr, tmp_path / "all.png", max_ranks=64))


def test_timeline_of_an_empty_trace_still_writes_a_png(tmp_path):
    assert_png(plot_timeline(Trace(), tmp_path / "empty.png"), min_px=100)


def test_timeline_draws_per_layer_events_and_nested_recompute(tmp_path):
    ev = [Event(0, 0, "compute", "B", 0, -1, 0.0, 3e-3, name="B0.0"),
          Event(0, 0, "compute", "R", 0, 0, 0.0, 1e-3), Event(0, 0, "compute", "B", 0, 0, 1e-3, 3e-3),
          Event(0, 0, "compute", "F", 1, 0, 3e-3, 4e-3), Event(0, 0, "compute", "zz-custom", 1, -1, 4e-3, 5e-3)]
    assert_png(plot_timeline(Trace(ev), tmp_path / "layers.png"))


def test_timeline_pair_shares_the_x_axis(tmp_path):
    a = one_f_one_b_trace(4, 8)
    b = one_f_one_b_trace(4, 8, t_f=1.1e-3, t_b=2.3e-3)
    assert_png(plot_timeline_pair(a, b, tmp_path / "pair.png"))


def test_select_ranks_keeps_first_and_last_evenly_spaced():
    got = select_ranks(list(range(64)), 16)
    assert len(got) == 16 and got[0] == 0 and got[-1] == 63
    assert np.ptp(np.diff(got)) <= 1
    assert select_ranks([3, 5], 16) == [3, 5]


def test_coverage_is_the_covered_fraction_of_each_bin():
    edges = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    got = coverage(np.array([0.5, 0.75, 2.0]), np.array([1.0, 1.5, 4.0]), edges)
    assert got == pytest.approx([0.5, 0.5, 1.0, 1.0])


def memory_rows(n):
    return [{"stage": s, "params": 2 * GIB, "grads": 4 * GIB, "optimizer": 6 * GIB,
             "activations": (n - s) * GIB, "other": 0.5 * GIB, "total": (12.5 + n - s) * GIB} for s in range(n)]


@pytest.mark.parametrize("n,capacity", [(1, None), (4, 15 * GIB), (64, 80 * GIB)])
def test_memory_breakdown_writes_a_png(tmp_path, n, capacity):
    assert_png(plot_memory_breakdown(memory_rows(n), tmp_path / "m.png", capacity_bytes=capacity))


def test_memory_breakdown_accepts_rows_without_total_and_extra_categories(tmp_path):
    rows = [{"stage": 0, "params": GIB, "comm_buffers": 0.25 * GIB}]
    assert_png(plot_memory_breakdown(rows, tmp_path / "m.png"))


@pytest.mark.parametrize("ranks", [1, 4, 32])
def test_memory_over_time_writes_a_png(tmp_path, ranks):
    timeline = {r: [(t * 1e-3, {"params": 2 * GIB, "activations": (t % 5 + r % 3) * GIB})
                    for t in range(20)] for r in range(ranks)}
    assert_png(plot_memory_over_time(timeline, tmp_path / "mt.png", capacity_bytes=8 * GIB))


def test_memory_over_time_of_nothing_still_writes_a_png(tmp_path):
    assert_png(plot_memory_over_time({}, tmp_path / "none.png"), min_px=100)
