"""The grid's memory-bound ops and attention timed round-robin (``calibration.round_robin``): one
sample of every point in turn, the backwards in groups bounded by the bytes their recorded
forwards hold, each point's two summaries returned in the points' order."""
import pytest

pytest.importorskip("torch")


@pytest.fixture()
def clock():
    import torch

    from parsim.calibration.timer import Clock
    torch.set_num_threads(1)
    return Clock(torch.device("cpu"))


@pytest.fixture()
def rotations(monkeypatch):
    """Every ``measure_many`` call of ``round_robin`` (the real one runs): its callables and the
    summaries it returned, in order."""
    from parsim.calibration import round_robin

    calls = []
    real = round_robin.measure_many

    def spy(fns, *args, **kwargs):
        out = real(fns, *args, **kwargs)
        calls.append((list(fns), out))
        return out
    monkeypatch.setattr(round_robin, "measure_many", spy)
    return calls


def _points(names, count=2):
    from parsim.calibration.grid import membound_grid
    return [p for p in membound_grid("cpu", "fp32", count) if p.name in names]


def _shape_run(fn):
    """The shape a timed callable works on: a forward's output, a backward's first input gradient."""
    out = fn()
    return tuple((out[0] if isinstance(out, tuple) else out).shape)


@pytest.mark.timeout(300)
def test_every_point_gets_its_own_forward_and_backward_in_order(clock, monkeypatch, rotations):
    from dataclasses import replace

    from parsim.calibration import round_robin
    from parsim.calibration.round_robin import bench_membound_many

    small = _points({"gelu"}, 1)[0]
    # the same op at 1x and 64x the rows, twice, with AdamW between: a summary returned in the
    # wrong slot would be another shape's
    large = replace(small, shape=(small.shape[0] * 64, *small.shape[1:]), fwd_bytes=64 * small.fwd_bytes,
                    bwd_bytes=64 * small.bwd_bytes, source="large")
    adamw = _points({"adamw"}, 1)[0]
    points = [small, large, adamw, small, large]
    # groups of one point each: the backwards' grouping must not move a result either
    monkeypatch.setattr(round_robin, "GROUP_BYTES", 1)
    monkeypatch.setattr(round_robin, "llc_bytes", lambda device: 0)
    seen = []
    out = bench_membound_many(points, "fp32", clock, 3, 0.05, seen.append)
    assert len(out) == len(points) and sorted(map(id, seen)) == sorted(map(id, points))
    assert out[2][1] is None                                  # AdamW: no backward, timed on its own
    streaming = [0, 1, 3, 4]
    assert len(rotations) == len(streaming)                   # one rotation a group, a point a group
    for i, (fns, timed) in zip(streaming, rotations):
        assert [_shape_run(fn) for fn in fns] == [points[i].shape] * 2      # its forward, its backward
        assert out[i][0] is timed[0] and out[i][1] is timed[1]
        assert out[i][0].n >= 3 and out[i][1].n >= 3 and 0 < out[i][0].p10 <= out[i][0].median <= out[i][0].p90


@pytest.mark.timeout(300)
def test_attention_points_come_back_in_order_from_one_rotation(clock, rotations):
    from parsim.calibration.round_robin import bench_attention_many
    from parsim.calibration.shapes import AttentionPoint

    points = [AttentionPoint(mbs=1, heads=2, kv_heads=2, seq=32, head_dim=16),
              AttentionPoint(mbs=4, heads=8, kv_heads=8, seq=256, head_dim=64)]
    seen = []
    out = bench_attention_many(points, "fp32", clock, 3, 0.1, seen.append)
    assert seen == points and len(out) == 2
    [(fns, timed)] = rotations                                # both points' passes in one rotation
    shapes = [(p.mbs, p.heads, p.seq, p.head_dim) for p in points]
    assert [_shape_run(fn) for fn in fns] == shapes + shapes  # forwards, then backwards
    for k in range(2):
        assert out[k][0] is timed[k] and out[k][1] is timed[2 + k]
