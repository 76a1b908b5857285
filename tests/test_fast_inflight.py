"""Interleaved schedule: the per-chunk in-flight counts the fast path weighs are exactly the
ones a rank's action order produces (allocate at forward start, free at backward end)."""
import numpy as np
import pytest

from parsim.fast.inflight import rank_moments
from parsim.schedules import build_schedule


def _walk(pp, m, vpp, rank):
    """(backward?, held count per chunk) at every moment of the rank's actions, in order."""
    held = np.zeros(vpp)
    out = []
    for a in build_schedule("interleaved", pp, m, vpp).actions[rank]:
        c = a.stage // pp
        if a.kind == "F":
            held[c] += 1
            out.append((0.0, held.copy()))
        else:
            out.append((1.0, held.copy()))
            held[c] -= 1
    return out


@pytest.mark.parametrize("pp, vpp", [(2, 2), (3, 2), (4, 3), (4, 4), (8, 2)])
@pytest.mark.parametrize("groups", [1, 2, 3, 5])
def test_heaviest_moment_matches_a_walk_through_the_schedule_for_any_chunk_sizes(pp, vpp, groups):
    m = groups * pp
    rng = np.random.default_rng(pp * 100 + vpp * 10 + groups)
    for rank in range(pp):
        walk = _walk(pp, m, vpp, rank)
        moments = rank_moments(pp, m, vpp, rank)
        for _ in range(25):
            chunk_bytes = rng.random(vpp) * rng.choice([1.0, 10.0, 1000.0], size=vpp)
            transient = rng.random() * 3
            expected = max(h @ chunk_bytes + kind * transient for kind, h in walk)
            got = max(row[1:] @ chunk_bytes + row[0] * transient for row in moments)
            assert got == pytest.approx(expected, rel=1e-12)


def test_with_as_many_microbatches_as_ranks_every_forward_is_in_flight_at_once():
    # Megatron-LM runs all forwards first when m == pp
    moments = rank_moments(4, 4, 3, 0)
    assert moments[:, 1:].sum(axis=1).max() == 4 * 3


@pytest.mark.parametrize("pp, vpp", [(2, 2), (4, 3), (8, 2), (4, 4)])
def test_more_microbatches_than_the_canonical_count_repeat_the_same_peak(pp, vpp):
    from parsim.fast.inflight import canonical_microbatches
    m_eff = int(canonical_microbatches(pp, 1000 * pp, vpp))
    assert m_eff < 1000 * pp
    rng = np.random.default_rng(5)
    for m in (m_eff, m_eff + pp, 3 * m_eff):
        for rank in range(pp):
            walk = _walk(pp, m, vpp, rank)
            moments = rank_moments(pp, m_eff, vpp, rank)
            for _ in range(10):
                w, t = rng.random(vpp) * 100, rng.random()
                assert max(row[1:] @ w + row[0] * t for row in moments) == pytest.approx(
                    max(h @ w + kind * t for kind, h in walk), rel=1e-12)
