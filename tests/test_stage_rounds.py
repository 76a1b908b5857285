"""The synthetic stages timed in rounds spread over a calibration (``calibration.stages.StageRounds``):
every round's samples pooled per stage, each round's total kept in the profile
(``StageProbes.rounds``), read back, checked and printed by ``parsim calibrate``. The rounds'
placement in a real run (after the grid, beside the layer probe after each collectives job) is
checked on the suite's real --quick calibration (``test_calibration.py``)."""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from parsim.calibration.grid import _stage
from parsim.specs import SpecError
from parsim.specs.surfaces import StageProbe, StageProbes

FIXTURE = Path(__file__).parent / "fixtures" / "cpu-calibrated.yaml"


def test_stage_rounds_pool_every_rounds_samples_and_keep_each_rounds_total():
    torch = pytest.importorskip("torch")
    from parsim.calibration.stages import StageRounds
    from parsim.calibration.timer import Clock

    torch.set_num_threads(1)
    tiny = _stage("tiny", 1, 32, 2, 64, 8, 64, flash_attention=True)
    wider = _stage("wider", 1, 48, 2, 96, 16, 96, flash_attention=False)
    rounds = StageRounds([(tiny, 1), (wider, 2)], "fp32", Clock(torch.device("cpu")), repeats=3)
    labels: list[str] = []
    rounds.round(labels.append)
    rounds.round()
    assert labels == ["stage tiny", "stage wider"]
    assert len(rounds.rounds) == 2
    for fwd, bwd in rounds.samples:
        assert len(fwd) == len(bwd) == 6 and min(fwd + bwd) > 0
    # a round's total: the sum over stages of its own forward and backward medians
    for k, total in enumerate(rounds.rounds):
        mine = [(f[3 * k:3 * k + 3], b[3 * k:3 * k + 3]) for f, b in rounds.samples]
        assert total == pytest.approx(sum(statistics.median(f) + statistics.median(b) for f, b in mine))
    # a stage's summary: every round's samples pooled
    for (spec, mbs, f, b), (fwd, bwd) in zip(rounds.summaries(), rounds.samples):
        assert f.median == pytest.approx(statistics.median(fwd)) and b.median == pytest.approx(statistics.median(bwd))
    assert [(s.name, m) for s, m, *_ in rounds.summaries()] == [("tiny", 1), ("wider", 2)]


def _probes(**kw) -> StageProbes:
    stage = StageProbe(spec={"name": "s"}, mbs=1, fwd_s=0.01, bwd_s=0.02)
    return StageProbes(stages=(stage,), reference=(0.005, 0.01), **kw)


def test_stage_probes_keep_their_rounds_through_the_profile_and_older_profiles_have_none():
    probes = _probes(rounds=(0.031, 0.029, 0.030))
    assert StageProbes.from_dict("p", probes.to_dict()) == probes
    old = _probes()
    assert "rounds" not in old.to_dict() and StageProbes.from_dict("p", old.to_dict()).rounds is None


@pytest.mark.parametrize("bad", [[], "fast", [0.03, "x"], {"1": 0.03}])
def test_stage_probe_rounds_that_are_not_seconds_are_refused_by_name(bad):
    raw = {**_probes().to_dict(), "rounds": bad}
    with pytest.raises(SpecError) as err:
        StageProbes.from_dict("device.extra.stage_probes", raw)
    assert "device.extra.stage_probes.rounds" in str(err.value)


def test_calibrate_prints_the_stages_rounds_and_how_far_apart_they_are():
    from parsim.cli.calibrate import render

    profile = yaml.safe_load(FIXTURE.read_text())
    profile["device"]["extra"]["stage_probes"] = {**_probes().to_dict(), "rounds": [0.100, 0.104, 0.101]}
    line = next(x for x in render(profile, FIXTURE).splitlines() if "synthetic stages" in x)
    assert "1 synthetic stages' forward + backward in 3 rounds over the run: 100.0 / 104.0 / 101.0 ms (4% apart" in line
    profile["device"]["extra"]["stage_probes"] = {**_probes().to_dict(), "rounds": [0.100]}
    assert "synthetic stages" not in render(profile, FIXTURE)
