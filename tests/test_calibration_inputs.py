"""parsim calibrate's bad input: a malformed profile table is a SpecError naming its field, and
the CLI exits 2 with one line naming the field, the value and what is allowed (moved out of
``test_calibration.py``, whose real --quick run fills its 400 lines)."""
import pytest

from parsim.cli import main
from parsim.specs import SpecError, load_cluster


def test_malformed_layer_composition_in_a_profile_is_a_spec_error():
    from parsim.specs import cluster_from_dict, load_profile_dict

    for bad in ({"fwd": "fast", "bwd": 1.0}, {"fwd": 1.0}, {"fwd": 0.0, "bwd": 1.0}, [1.0, 1.0]):
        data = load_profile_dict("cpu")
        data["device"].setdefault("extra", {})["layer_composition"] = bad
        with pytest.raises(SpecError) as e:
            cluster_from_dict(data, 2)
        assert e.value.field == "profile.device.extra.layer_composition"
    with pytest.raises(SpecError) as e:
        load_cluster("cpu:2", profile=str(_write_profile_with({"fwd": -1, "bwd": 1})))
    assert e.value.field == "profile.device.extra.layer_composition"


def _write_profile_with(composition) -> "Path":
    import tempfile
    from pathlib import Path

    import yaml

    from parsim.specs import load_profile_dict
    data = load_profile_dict("cpu")
    data["device"].setdefault("extra", {})["layer_composition"] = composition
    path = Path(tempfile.mkdtemp()) / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("argv, field", [
    (["--ranks", "0"], "ranks"),
    (["--ranks", "two"], "ranks"),
    (["--ranks", "1"], "ranks"),            # no group to measure collectives on, no --base
    (["--dtype", "int8"], "dtype"),
    (["--repeats", "1"], "repeats"),
    (["--model", "nope"], "model"),
    (["--device", "tpu"], "device"),
    (["--tp", "3"], "tp"),                  # 3 divides no head count of cpu-small
    (["--mbs", "0"], "mbs"),
])
def test_bad_calibrate_input_exits_2_naming_the_field(capsys, argv, field):
    rc = main(["calibrate", "--quick", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and f"{field}=" in err, err


def test_python_api_rejects_bad_input_with_spec_error():
    from parsim.calibration import calibrate
    with pytest.raises(SpecError) as e:
        calibrate(ranks=[2, 0])
    assert e.value.field == "ranks"
