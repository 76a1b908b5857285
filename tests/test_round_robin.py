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


def _points(names, count=2):
    from parsim.calibration.grid import membound_grid
    return [p for p in membound_grid("cpu", "fp32", count) if p.name in names]


@pytest.mark.timeout(300)
def test_every_point_gets_its_own_forward_and_backward_in_order(clock, monkeypatch):
    from dataclasses import replace

    from parsim.calibration import round_robin
    from parsim.calibration.round_robin import bench_membound_many

    small = _points({"gelu"}, 1)[0]
    # the same op at 1x and 64x the elements, twice, with AdamW between: a summary returned in the
    # wrong slot would put the large op's time on a small point
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
    assert out[2][1] is None                                  # AdamW: no backward
    for i in (0, 1, 3, 4):
        fwd, bwd = out[i]
        assert fwd.n >= 3 and bwd.n >= 3 and 0 < fwd.p10 <= fwd.median <= fwd.p90
    for s, b in ((0, 1), (3, 4), (0, 4), (3, 1)):
        assert out[b][0].median > 4 * out[s][0].median       # 64x the bytes: not within 4x
        assert out[b][1].median > 4 * out[s][1].median


@pytest.mark.timeout(300)
def test_attention_points_come_back_in_order(clock):
    from parsim.calibration.round_robin import bench_attention_many
    from parsim.calibration.shapes import AttentionPoint

    points = [AttentionPoint(mbs=1, heads=2, kv_heads=2, seq=32, head_dim=16),
              AttentionPoint(mbs=4, heads=8, kv_heads=8, seq=256, head_dim=64)]
    seen = []
    out = bench_attention_many(points, "fp32", clock, 3, 0.1, seen.append)
    assert seen == points and len(out) == 2
    assert out[1][0].median > 4 * out[0][0].median and out[1][1].median > 4 * out[0][1].median

