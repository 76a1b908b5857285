"""``parsim partition``: JSON keys, the readable table, and exit code 2 on every bad input."""
import json

import pytest

from parsim.cli import main

KEYS = {"partition", "stage_times_s", "stage_memory_bytes", "boundaries", "uniform_stage_times_s",
        "predicted_speedup_vs_uniform"}


@pytest.fixture
def heavy_head(tmp_path):
    path = tmp_path / "heavy.yaml"
    path.write_text("name: heavy\nlayers: 8\nhidden: 512\nheads: 8\nffn_hidden: 2048\nvocab: 32000\n"
                    "seq_len: 128\ndropout: false\n")
    return str(path)


def _run(capsys, *argv):
    code = main(["partition", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_carries_the_partition_and_its_comparison_with_the_uniform_split(capsys, heavy_head):
    code, out, _ = _run(capsys, "--model", heavy_head, "--pp", "2", "--plan", "gbs=8 dtype=fp32",
                        "--cluster", "cpu", "--graph", "analytic", "--json")
    assert code == 0
    data = json.loads(out)
    assert KEYS <= set(data)
    assert sum(data["partition"]) == 8 and len(data["stage_times_s"]) == 2
    assert data["predicted_speedup_vs_uniform"] > 1.1
    assert data["boundaries"] == [f"layers.{data['partition'][0]}"]
    # the partition plugs into a plan string
    assert main(["memory", "--model", heavy_head, "--cluster", "cpu:2",
                 "--plan", f"pp=2 gbs=8 dtype=fp32 partition={','.join(map(str, data['partition']))}"]) == 0


def test_simulate_flag_plays_both_splits_in_the_engine(capsys, heavy_head):
    code, out, _ = _run(capsys, "--model", heavy_head, "--pp", "2", "--plan", "gbs=8 dtype=fp32", "--cluster", "cpu",
                        "--graph", "analytic", "--simulate", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["simulated_speedup_vs_uniform"] > 1.1
    assert data["simulated_step_time_s"] < data["simulated_uniform_step_time_s"]


def test_table_names_the_plan_partition(capsys, heavy_head):
    code, out, _ = _run(capsys, "--model", heavy_head, "--pp", "2", "--plan", "gbs=8 dtype=fp32", "--cluster", "cpu",
                        "--graph", "analytic")
    assert code == 0
    assert "partition=" in out and "uniform" in out and "x " in out


def test_vpp_defaults_to_the_interleaved_schedule(capsys, heavy_head):
    code, out, _ = _run(capsys, "--model", heavy_head, "--pp", "2", "--vpp", "2", "--cluster", "cpu",
                        "--plan", "dtype=fp32", "--graph", "analytic", "--json")
    assert code == 0
    data = json.loads(out)
    assert len(data["partition"]) == 4 and "schedule=interleaved" in data["plan"]


@pytest.mark.parametrize("argv, field", [
    (["--pp", "0"], "pp"),
    (["--pp", "2", "--vpp", "0"], "vpp"),
    (["--pp", "2", "--memory-limit", "0"], "memory_limit"),
    (["--pp", "2", "--memory-limit", "1000"], "memory_limit"),
    (["--pp", "2", "--graph", "magic"], "graph"),
    (["--pp", "2", "--plan", "colour=red"], "colour"),
    (["--pp", "9"], "pp*vpp"),
    (["--pp", "2", "--cluster", "nosuchgpu"], "cluster"),   # issue 23: it named "profile"
])
def test_bad_input_exits_2_naming_the_field(capsys, heavy_head, argv, field):
    code, out, err = _run(capsys, "--model", heavy_head, "--plan", "dtype=fp32", "--cluster", "cpu",
                          "--graph", "analytic", *argv, "--json")
    assert code == 2
    assert json.loads(out)["field"] == field
    assert "parsim: error:" in err


def test_unknown_model_exits_2(capsys):
    code, _, err = _run(capsys, "--model", "not-a-model", "--pp", "2")
    assert code == 2 and "model" in err
