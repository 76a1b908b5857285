"""The memory-bound grid in passes (``machine_bench.MemboundPasses``, ``MEMBOUND_PASSES``): a slow
phase of a shared VM moves whole points when a point's samples are taken back to back, so the
full calibration goes over every memory-bound point three times, minutes apart (the first pass
with the per-op tables, the next after each collectives job, ``runner.run_calibration``), and
keeps each point's median of its passes."""
import pytest

from parsim.calibration.fit import Summary
from parsim.calibration.machine_bench import FULL_GRID, QUICK_GRID, GridPlan, measure_grid, median_of, steps_of


def test_a_points_passes_combine_into_their_median():
    passes = [Summary(1.0, 0.9, 1.2, 10), Summary(1.3, 1.1, 1.5, 10), Summary(1.1, 1.0, 1.4, 8)]
    assert median_of(passes) == Summary(1.1, 1.0, 1.4, 28)
    assert median_of([None, None]) is None                      # no backward pass (AdamW)
    assert median_of([Summary(2.0, 1.0, 3.0, 5)]) == Summary(2.0, 1.0, 3.0, 5)


def test_the_full_grid_takes_three_passes_and_the_quick_one_one():
    assert FULL_GRID.membound_passes == 3 and QUICK_GRID.membound_passes == 1


@pytest.mark.timeout(300)
def test_measure_grid_goes_over_every_memory_bound_point_once_a_pass():
    pytest.importorskip("torch")
    import torch

    from parsim.calibration.grid import membound_grid
    from parsim.calibration.timer import Clock

    torch.set_num_threads(1)
    points = [p for p in membound_grid("cpu", "fp32", 1) if p.name in ("residual_add", "gelu")]
    assert len(points) == 2
    plan = GridPlan(gemm={}, attention=[], membound=points, stages=[], membound_passes=3)
    seen: list[str] = []
    out = measure_grid(plan, "fp32", Clock(torch.device("cpu")), 3, 0.01, 0.02, seen.append)
    assert len(seen) == 2 and all("(pass 1)" in s for s in seen)     # the first pass only
    assert out.membound_rounds.left == 2
    out.time_membound(seen.append)                                     # after a collectives job: one more
    assert len(seen) == 4 and out.membound_rounds.left == 1
    out.time_membound(seen.append, every=True)                         # at the end: the rest
    out.time_membound(seen.append, every=True)                         # and no more than the plan asks
    assert len(seen) == steps_of(plan, 3) == 6 and sum("(pass 3)" in s for s in seen) == 2
    assert [p for p, _, _ in out.membound] == points
    for _, fwd, bwd in out.membound:
        assert fwd.n >= 9 and bwd.n >= 9 and 0 < fwd.p10 <= fwd.median <= fwd.p90


def test_calibrate_prints_each_passes_level_where_the_profile_keeps_them(tmp_path):
    from pathlib import Path

    from parsim.cli.calibrate import render
    from parsim.specs import load_profile_dict

    fixture = Path(__file__).parent / "fixtures" / "cpu-calibrated.yaml"
    profile = load_profile_dict(fixture)
    assert "the memory-bound grid in" not in render(profile, fixture)      # profiles before the passes' levels
    profile["provenance"]["membound_passes"] = [0.98, 1.31, 1.0]
    lines = [ln for ln in render(profile, fixture).splitlines() if "the memory-bound grid in" in ln]
    assert lines == ["  the memory-bound grid in 3 passes over the run, each point's time over its median: "
                     "0.98 / 1.31 / 1.00 (the profile takes the median)"]


def test_a_passes_level_is_its_points_time_over_their_median():
    pytest.importorskip("torch")
    import torch

    from parsim.calibration.grid import membound_grid
    from parsim.calibration.machine_bench import MemboundPasses
    from parsim.calibration.timer import Clock

    points = [p for p in membound_grid("cpu", "fp32", 1) if p.name == "residual_add"]
    passes = MemboundPasses(points, 3, "fp32", Clock(torch.device("cpu")), 3, 0.01)
    # three passes as measured: the second one 2x slower on every point (a slow spell)
    passes.done = [[(Summary(1.0, 0.9, 1.1, 3), None)], [(Summary(2.0, 1.8, 2.2, 3), None)],
                   [(Summary(1.1, 1.0, 1.2, 3), None)]]
    assert passes.left == 0
    assert passes.summaries()[0][1].median == 1.1                       # the spell set aside
    assert passes.levels() == pytest.approx([1.0 / 1.1, 2.0 / 1.1, 1.0])
