"""Issue 23, item 1 beyond model files and plans: cluster YAMLs, profile tables, run logs
(``validation.csv`` / ``rounds.csv``), saved traces, a SpecError raised inside the SimPy
engine, and the rule that no NaN, inf or negative number is printed with exit 0."""
from __future__ import annotations

import copy
import json
import math

import pytest
import simpy
import yaml

from parsim.cli import main
from parsim.specs import SpecError, load_cluster, profiles_dir
from parsim.study.validate import read_rounds, read_rows
from parsim.trace import load_trace

NAN, INF = float("nan"), float("inf")
A100 = yaml.safe_load((profiles_dir() / "a100-80g.yaml").read_text())
CALIBRATED = yaml.safe_load((profiles_dir() / "cpu-calibrated.yaml").read_text())


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def put(data: dict, where: tuple, value) -> dict:
    data = copy.deepcopy(data)
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    return data


# ------------------------------------------------------------------------------- cluster YAMLs

@pytest.mark.parametrize("where, value, field", [
    (("num_devices",), -1, "cluster.num_devices"),
    (("num_devices",), 2.5, "cluster.num_devices"),
    (("devices_per_node",), INF, "cluster.devices_per_node"),
    (("network", "inter_node", "bandwidth"), 0, "cluster.network.inter_node.bandwidth"),
    (("device", "memory_bytes"), -1, "cluster.device.memory_bytes"),
    (("device", "peak_flops", "bf16"), NAN, "cluster.device.peak_flops.bf16"),
    (("network",), [1, 2], "cluster.network"),
])
def test_a_cluster_yaml_names_the_bad_field_with_exit_2(capsys, tmp_path, where, value, field):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(put({**A100, "num_devices": 2}, where, value)))
    code, out, err = run(capsys, "simulate", "--model", "tiny", "--cluster", path, "--plan", "dp=2", "--json")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    error = json.loads(out)
    assert error["field"] == field and "invalid" in error["error"]


def test_every_shipped_profile_still_loads():
    for path in sorted(profiles_dir().glob("*.yaml")):
        cluster = load_cluster(f"{path.stem}:8")
        assert cluster.device.memory_bytes > 0 and cluster.network.intra_node.bandwidth > 0


# ------------------------------------------------------------------------------- calibrated tables

@pytest.mark.parametrize("where, value, fragment", [
    (("network", "collectives", "all_reduce", "2", "beta"), -1.0e-9, "all_reduce.2.beta"),
    (("network", "collectives", "all_reduce", "2", "alpha"), NAN, "all_reduce.2.alpha"),
    (("network", "collectives", "all_reduce", "2", "alpha"), 10 ** 400, "all_reduce.2.alpha"),
    (("device", "extra", "contention"), {"1": 1.0, "2": INF}, "contention"),
])
def test_bad_numbers_in_calibrated_tables_are_named(tmp_path, where, value, fragment):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(put(CALIBRATED, where, value)))
    with pytest.raises(SpecError) as err:
        load_cluster("cpu:2", profile=path)
    assert fragment in err.value.field


# ------------------------------------------------------------------------------- SpecError in SimPy

def test_a_spec_error_raised_in_a_simpy_process_arrives_whole():
    """SimPy re-raises a process's exception as ``type(e)(*e.args)`` (simpy.events): before
    issue 23 that gave ``TypeError: SpecError.__init__() missing 2 required arguments``."""
    env = simpy.Environment()

    def process():
        yield env.timeout(1)
        raise SpecError("dtype", "bf16", "a dtype the profile has a peak for")

    def waiter():
        yield env.process(process())

    env.process(waiter())
    with pytest.raises(SpecError) as err:
        env.run()
    assert err.value.field == "dtype" and str(err.value) == "dtype='bf16' is invalid: a dtype the profile has a peak for"


def test_a_profile_without_the_plans_dtype_is_refused_before_the_engine(capsys, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(put(A100, ("device", "peak_flops"), {"fp32": 1.0e13})))
    code, out, _ = run(capsys, "simulate", "--model", "tiny", "--cluster", "a100-80g:2", "--plan", "dp=2",
                       "--profile", path, "--json")
    assert code == 2 and json.loads(out)["field"] == "profile.device.peak_flops"
    code, out, _ = run(capsys, "simulate", "--model", "tiny", "--cluster", "a100-80g:2", "--plan", "dp=2 dtype=fp32",
                       "--profile", path, "--json")
    assert code == 0 and json.loads(out)["step_time_s"] > 0


# ------------------------------------------------------------------------------- run logs and traces

ROUNDS_HEADER = "plan,round,world_size,step_time_s,step_times_s,peak_bytes_by_rank,losses,trace_file,layer_probes\n"
GOOD_ROUND = 'dp=2,0,2,0.5,"[0.5, 0.5]","[100, 200]","[2.3, 2.2]",t0,[]\n'


@pytest.mark.parametrize("row, column", [
    ('dp=2,0,2,nan,"[0.5]","[1]","[2.3]",t0,[]\n', "step_time_s"),
    ('dp=2,0,2,-1,"[0.5]","[1]","[2.3]",t0,[]\n', "step_time_s"),
    ('dp=2,x,2,0.5,"[0.5]","[1]","[2.3]",t0,[]\n', "round"),
    ('dp=2,0,2,0.5,"[0.5, Infinity]","[1]","[2.3]",t0,[]\n', "step_times_s"),
    ('dp=2,0,2,0.5,"[0.5]","[1.5]","[2.3]",t0,[]\n', "peak_bytes_by_rank"),
    ('dp=2,0,2,0.5,"[0.5]","{",x,t0,[]\n', "peak_bytes_by_rank"),
    ("dp=2,0\n", "step_time_s"),
])
def test_a_bad_rounds_log_names_its_row_and_column(tmp_path, row, column):
    (tmp_path / "rounds.csv").write_text(ROUNDS_HEADER + GOOD_ROUND + row)
    with pytest.raises(SpecError) as err:
        read_rounds(tmp_path)
    assert err.value.field == f"rounds.csv row 3 column {column}"


def test_rounds_and_validation_logs_read_back_and_refuse_foreign_tables(tmp_path):
    (tmp_path / "rounds.csv").write_text(ROUNDS_HEADER + GOOD_ROUND)
    (r,) = read_rounds(tmp_path)
    assert (r.step_time_s, r.peak_memory_bytes_by_rank, r.losses) == (0.5, [100, 200], [2.3, 2.2])
    (tmp_path / "validation.csv").write_text("plan,world_size,measured_step_s,step_error\ndp=2,2,0.5,-0.1\n")
    (row,) = read_rows(tmp_path)
    assert row["step_error"] == -0.1 and row["world_size"] == 2
    (tmp_path / "validation.csv").write_text("plan,world_size,measured_step_s\ndp=2,2,-0.5\n")
    with pytest.raises(SpecError, match="measured_step_s"):
        read_rows(tmp_path)
    (tmp_path / "validation.csv").write_text("name,size\na,b\n")
    with pytest.raises(SpecError, match="missing plan, world_size"):
        read_rows(tmp_path)
    (tmp_path / "validation.csv").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(SpecError, match="UTF-8"):
        read_rows(tmp_path)


@pytest.mark.parametrize("body", [b"{", b"[]", b'{"format": "parsim-trace", "version": 1}', b"\xff\xfe",
                                  b'{"format": "parsim-trace", "version": 1, "columns": ["x"], "events": [[1]]}'])
def test_a_file_that_is_not_a_trace_is_a_spec_error(tmp_path, body):
    path = tmp_path / "t.json"
    path.write_bytes(body)
    with pytest.raises(SpecError) as err:
        load_trace(path)
    assert err.value.field == "trace"


# ------------------------------------------------------------------------------- outputs are finite

# signed by definition: < 0 where a plan does not fit; a schedule's throughput and peak memory
# relative to 1F1B at the same layout (parsim.study.schedule_advice), < 0 where it is slower / smaller
SIGNED = {"memory_headroom", "speedup", "extra_memory_bytes", "median_speedup_when_faster",
          "median_speedup_when_slower", "median_extra_memory_bytes"}


def _numbers(obj, signed: bool = False):
    """(number, whether it may be negative) of every number in a JSON document."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _numbers(v, signed or k in SIGNED)
    elif isinstance(obj, list):
        for v in obj:
            yield from _numbers(v, signed)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield obj, signed


EXTREMES = [   # legal but extreme profile values: each output is a clear error or finite and >= 0
    (("network", "intra_node", "bandwidth"), 1.0e-30), (("network", "intra_node", "latency"), 1.0e30),
    (("device", "peak_flops"), {"bf16": 1.0e-30, "fp32": 1.0e-30, "fp16": 1.0e-30}),
    (("device", "peak_flops"), {"bf16": 1.0e30, "fp32": 1.0e30, "fp16": 1.0e30}),
    (("device", "memory_bytes"), 1.0e-30), (("device", "kernel_overhead_s"), 1.0e30),
    (("device", "memory_bandwidth"), 1.0e-30),
]


@pytest.mark.parametrize("where, value", EXTREMES)
def test_no_nan_inf_or_negative_number_is_printed_with_exit_0(capsys, tmp_path, where, value):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(put(A100, where, value)))
    common = ("--model", "tiny", "--cluster", "a100-80g:4", "--profile", path, "--json")
    for argv in (("simulate", "--plan", "dp=2 pp=2", *common), ("memory", "--plan", "dp=2 pp=2", *common),
                 ("sweep", "--no-progress", "--top", "3", "--resimulate", "2", "--fix", "mbs=1", *common)):
        code, out, err = run(capsys, *argv)
        assert "NaN" not in out and "Infinity" not in out and "Traceback" not in err
        if code == 2:
            assert len([ln for ln in err.splitlines() if not ln.startswith("parsim: warning")]) == 1
            continue
        assert code == 0, (argv, err)
        numbers = list(_numbers(json.loads(out)))
        assert numbers and all(math.isfinite(x) and (signed or x >= 0) for x, signed in numbers), argv[0]
