"""What a schedule keeps in flight: the held counts ``costs.peak_moments`` lists (and the fast
path's table of them) are exactly the ones a rank's action order produces (allocate at forward
start, free at backward end), for every schedule and any chunk sizes."""
import numpy as np
import pytest

from parsim.costs import inflight_chunks, inflight_microbatches, peak_moments
from parsim.fast.inflight import canonical_microbatches, rank_rows
from parsim.schedules import build_schedule, held_at_backwards

SCHEDULES = [("naive", 4, 1, 8), ("gpipe", 4, 1, 8), ("1f1b", 4, 1, 8), ("1f1b", 8, 1, 4), ("1f1b", 3, 1, 2),
             ("interleaved", 2, 2, 4), ("interleaved", 3, 2, 6), ("interleaved", 4, 3, 4), ("interleaved", 4, 4, 8),
             ("interleaved", 8, 2, 16), ("interleaved", 4, 2, 20)]


def _walk(schedule, pp, m, vpp, rank):
    """(chunk running a backward or -1 for a forward, held count per chunk) at every moment of
    the rank's actions, in order."""
    held = np.zeros(vpp)
    out = []
    for a in build_schedule(schedule, pp, m, vpp).actions[rank]:
        c = a.stage // pp
        if a.kind == "F":
            held[c] += 1
            out.append((-1, held.copy()))
        else:
            out.append((c, held.copy()))
            held[c] -= 1
    return out


def _heaviest(moments, chunk_bytes, transient):
    return max(held @ chunk_bytes + (transient[c] if c >= 0 else 0.0) for c, held in moments)


@pytest.mark.parametrize("schedule, pp, vpp, m", SCHEDULES)
def test_held_at_each_backward_start_matches_a_walk_through_the_schedule(schedule, pp, vpp, m):
    for rank in range(pp):
        starts = [held for c, held in _walk(schedule, pp, m, vpp, rank) if c >= 0]
        assert len(starts) == m * vpp
        assert held_at_backwards(schedule, rank, pp, m, vpp, m * vpp) == [tuple(h) for h in starts]


@pytest.mark.parametrize("schedule, pp, vpp, m", SCHEDULES)
def test_heaviest_peak_moment_is_the_heaviest_moment_of_the_walk_for_any_chunk_sizes(schedule, pp, vpp, m):
    rng = np.random.default_rng(pp * 100 + vpp * 10 + m)
    for rank in range(pp):
        walk = _walk(schedule, pp, m, vpp, rank)
        moments = [(chunk, np.array(held)) for chunk, held in peak_moments(schedule, pp, m, vpp, rank)]
        assert len(moments) == (min(pp * vpp, m * vpp) if vpp > 1 else 1)
        for _ in range(25):
            chunk_bytes = rng.random(vpp) * rng.choice([1.0, 10.0, 1000.0], size=vpp)
            transient = rng.random(vpp) * 3
            assert _heaviest(moments, chunk_bytes, transient) == pytest.approx(
                _heaviest(walk, chunk_bytes, transient), rel=1e-12)


@pytest.mark.parametrize("schedule, pp, vpp, m", SCHEDULES)
def test_inflight_count_is_the_most_chunks_any_moment_holds(schedule, pp, vpp, m):
    for rank in range(pp):
        most = max(held.sum() for _, held in _walk(schedule, pp, m, vpp, rank))
        assert inflight_chunks(schedule, pp, m, rank, vpp) == most
        assert inflight_microbatches(schedule, pp, m, rank, vpp) == pytest.approx(most / vpp, rel=1e-15)


def test_with_as_many_microbatches_as_ranks_every_forward_is_in_flight_at_once():
    # Megatron-LM runs all forwards first when m == pp
    assert max(sum(held) for _, held in peak_moments("interleaved", 4, 4, 3, 0)) == 4 * 3


@pytest.mark.parametrize("pp, vpp", [(2, 2), (4, 3), (8, 2), (4, 4)])
def test_fast_rows_past_the_canonical_count_give_the_same_peak(pp, vpp):
    """The fast path's rows (non-dominated moments of each running chunk, each with its own
    chunk's transient) of the canonical microbatch count weigh like the walk of any larger count."""
    m_eff = int(canonical_microbatches(pp, 1000 * pp))
    assert m_eff < 1000 * pp
    rng = np.random.default_rng(5)
    for m in (m_eff, m_eff + pp, 3 * m_eff):
        for rank in range(pp):
            walk = _walk("interleaved", pp, m, vpp, rank)
            rows = np.array(rank_rows("interleaved", pp, m_eff, vpp, rank, uneven=True))
            for _ in range(10):
                w, t = rng.random(vpp) * 100, rng.random(vpp) * rng.choice([1.0, 100.0, 1000.0], size=vpp)
                assert max(row[:vpp] @ w + t[int(row[vpp])] for row in rows) == pytest.approx(
                    _heaviest(walk, w, t), rel=1e-12)


@pytest.mark.parametrize("schedule, pp, vpp, m", SCHEDULES)
def test_fast_row_of_a_rank_with_equal_chunks_holds_the_most_chunks(schedule, pp, vpp, m):
    for rank in range(pp):
        (row,) = np.array(rank_rows(schedule, pp, m, vpp, rank, uneven=False))
        walk = _walk(schedule, pp, m, vpp, rank)
        assert row[:vpp].sum() == row[0] == max(held.sum() for _, held in walk)
        assert row[vpp] == 0            # the running chunk: any, as every chunk weighs the same
