"""parsim demo predicts this machine with a profile of this machine (issue 20): the shipped CPU
profile only where its provenance names this host, else a quick profile kept for this host,
else a quick calibration first, said so. Fixture profiles are frozen copies; the real quick
calibration (the branch that calibrates) is the one ``tests/test_calibration.py`` takes, and is
checked there for what it records, never for a time."""
import re
from pathlib import Path

import pytest
import yaml

from parsim.api.hardware import UNSTEADY, apart, cache_dir, host_profile, kept_profile_refused, probe_drift
from parsim.calibration.machine import host_id

FIXTURE = Path(__file__).parent / "fixtures" / "cpu-calibrated.yaml"


def profile_of(host: str, path: Path) -> Path:
    """The frozen fixture profile with its provenance saying it was measured on ``host``."""
    from parsim.calibration.profile_io import FORMAT
    data = yaml.safe_load(FIXTURE.read_text())
    data["provenance"]["host_id"] = host
    data["provenance"]["format"] = FORMAT             # as a calibration of today's code writes it
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PARSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PARSIM_HOST_MEMORY", "keep")   # host_profile sets it only where unset
    return tmp_path / "cache"


def test_cache_dir_is_outside_the_repository_and_follows_the_environment(cache, monkeypatch):
    assert cache_dir() == cache
    monkeypatch.delenv("PARSIM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert cache_dir() == Path("/somewhere/parsim")


def test_a_profile_measured_on_this_host_is_used_as_it_is(cache, tmp_path):
    said = []
    shipped = profile_of(host_id(), tmp_path / "shipped.yaml")
    chosen = host_profile(shipped, say=said.append)
    assert chosen.path == shipped and not chosen.calibrated and said == []
    assert "measured on this host" in chosen.note


def test_a_kept_quick_profile_of_this_host_wins_over_a_shipped_one_from_another_host(cache, tmp_path):
    said = []
    shipped = profile_of("another-host-0000", tmp_path / "shipped.yaml")
    kept = profile_of(host_id(), cache / "profiles" / f"cpu-{host_id()}.yaml")
    chosen = host_profile(shipped, say=said.append)
    assert chosen.path == kept and not chosen.calibrated and said == []
    assert "quick profile of this host" in chosen.note


def test_the_shipped_cpu_profile_has_no_host_id_so_it_is_never_taken_for_this_host():
    # measured before provenance recorded host ids: on a fresh clone the demo calibrates first
    shipped = yaml.safe_load((Path(__file__).parents[1] / "calibration" / "profiles" / "cpu-calibrated.yaml")
                             .read_text())
    assert shipped["provenance"].get("host_id") != host_id()


def test_a_kept_profile_measured_while_the_machine_was_busy_is_refused(tmp_path):
    """The layer probe's blocks (forward + backward, spread over the calibration) tell a steady
    run from a disturbed one: the fixture's vary 19 %; slow one block down 2x (as a kept quick
    profile of this VM that priced TP collectives 2x did) and it is refused, with the reason."""
    path = profile_of(host_id(), tmp_path / "kept.yaml")
    data = yaml.safe_load(path.read_text())
    assert probe_drift(data) == pytest.approx(41.46 / 34.93 - 1, abs=0.005) and probe_drift(data) < UNSTEADY
    assert kept_profile_refused(data, host_id()) is None
    assert "another host" in kept_profile_refused(data, "another-host-0000")
    blocks = data["device"]["extra"]["layer_probe"]["blocks"]
    blocks[1] = [2 * x for x in blocks[1]]
    assert probe_drift(data) == pytest.approx(2 * 39.88 / 34.93 - 1, abs=0.005) and probe_drift(data) > UNSTEADY
    assert "busy" in kept_profile_refused(data, host_id())
    del data["device"]["extra"]["layer_probe"]["blocks"]
    assert probe_drift(data) == 0.0        # no blocks recorded: nothing to judge by


def test_a_kept_profile_written_by_an_older_calibration_is_measured_again(tmp_path):
    """A quick profile kept by an older calibration (no ``provenance.format``, or a lower one)
    lacks tables the simulator now prices with (the pipeline message's CPU): it is refused, with
    the reason, and the host calibrated again."""
    from parsim.calibration.profile_io import FORMAT
    data = yaml.safe_load(profile_of(host_id(), tmp_path / "kept.yaml").read_text())
    assert kept_profile_refused(data, host_id()) is None
    for old in (None, FORMAT - 1, "2"):
        if old is None:
            del data["provenance"]["format"]
        else:
            data["provenance"]["format"] = old
        assert "older calibration" in kept_profile_refused(data, host_id())
    assert "another host" in kept_profile_refused(data, "another-host-0000")      # checked first


def test_the_demo_says_when_the_machine_no_longer_runs_at_its_profiles_speed():
    """``parsim demo`` adds one line when the plans' median drift leaves 1 +- STALE_DRIFT: with a
    kept profile it points at --recalibrate, with one taken just now at the machine itself."""
    from parsim.cli.demo import STALE_DRIFT, drift_hint

    inside = [1.0, 1 + STALE_DRIFT * 0.9, 1 / (1 + STALE_DRIFT * 0.9)]
    assert drift_hint(inside, calibrated_now=False) is None and drift_hint([], calibrated_now=True) is None
    kept = drift_hint([0.79, 0.76, 0.95], calibrated_now=False)
    assert "0.79x" in kept and "--recalibrate" in kept
    fresh = drift_hint([1.28, 1.24, 1.08], calibrated_now=True)
    assert "1.24x" in fresh and "unsteady" in fresh and "--recalibrate" not in fresh
    # the layer alone on time, but anchoring moves the predictions: the contention was off
    assert drift_hint([0.99, 1.07, 1.04], calibrated_now=True, shifts=[0.97, 1.02, 1.05]) is None
    contention = drift_hint([0.99, 1.07, 1.04], calibrated_now=True, shifts=[0.78, 0.74, 0.85])
    assert "-22%" in contention and "contention" in contention and "--recalibrate" in contention


def test_apart_is_the_largest_over_the_smallest_and_zero_without_a_pair():
    """``apart``: how far repeated timings of one thing spread (the layer probe's blocks, the
    synthetic stages' rounds), largest / smallest - 1; nothing to compare gives 0."""
    assert apart([0.2, 0.25, 0.22]) == pytest.approx(0.25)
    assert apart(iter([3.0, 1.5])) == pytest.approx(1.0)      # any iterable, in any order
    assert apart([0.3]) == 0.0 and apart([]) == 0.0
    assert apart([0.0, 1.0]) == 0.0                           # a zero timing is no scale


def _layer_probe(data: dict) -> dict:
    """The real-layer probe's mapping in a profile's YAML data (``device.extra`` or ``.tables``)."""
    return data["device"].get("extra", {}).get("layer_probe") or data["device"]["tables"]["layer_probe"]


@pytest.mark.slow
def test_a_kept_profile_is_re_anchored_to_its_layer_timed_now_before_the_demo_predicts():
    """``reanchored_now``: the kept profile's real-layer probe is taken again in a 2-rank launch
    started as the executor's, and its solo times replace the profile's (the contention stays);
    said in one line. A profile whose layer is priced 10,000x faster than any CPU runs it comes
    back at the machine's speed; a profile without the probe (a GPU preset) comes back as it was,
    untouched."""
    pytest.importorskip("torch")
    from parsim.api.hardware import reanchored_now
    from parsim.specs import load_profile_dict, profile_tables

    data = yaml.safe_load(FIXTURE.read_text())
    probe = _layer_probe(data)
    probe["fwd_s"], probe["bwd_s"] = 1e-6, 2e-6
    said = []
    out = reanchored_now(data, 2, say=said.append, probes=1)
    now = profile_tables(out).layer_probe
    assert now.fwd_s > 1e-4 and now.bwd_s > 1e-4            # the layer as it ran, not the fake 1-2 us
    kept = dict(profile_tables(data).contention_layer.values)
    assert dict(profile_tables(out).contention_layer.values) == kept
    assert len(said) == 1 and "re-anchored" in said[0] and "x its time in the profile" in said[0]
    assert profile_tables(data).layer_probe.fwd_s == 1e-6    # the kept profile itself is not changed
    gpu = load_profile_dict("a100-80g")
    assert reanchored_now(gpu, 2, say=said.append) == gpu and len(said) == 1


@pytest.mark.slow
def test_a_probe_launch_that_fails_leaves_the_kept_profile_as_it_was_and_says_why():
    """Where the probe's launch fails (here its ranks cannot build a layer of -1 samples),
    ``reanchored_now`` says so, naming the rank and the error, and the demo predicts at the kept
    level: the plans' own launch right after says more if the machine cannot run ranks."""
    pytest.importorskip("torch")
    from parsim.api.hardware import reanchored_now

    data = yaml.safe_load(FIXTURE.read_text())
    _layer_probe(data)["mbs"] = -1
    said = []
    assert reanchored_now(data, 2, say=said.append, probes=1) is data
    # every rank fails alike: whichever the launcher notices first is named (rank 1 in a fresh clone once)
    assert len(said) == 1 and "could not time its layer now" in said[0]
    assert re.search(r"\(rank [01]: RuntimeError: .*negative dimension", said[0])
