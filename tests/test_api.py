"""The public Python API (``parsim.api``): the same numbers as the CLI's ``--json``, every
input form (preset, file, string, spec object), SpecError on bad input, and the README's
example runs as written."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import parsim
from parsim.cli import main
from parsim.specs import SpecError, load_cluster, load_model, parse_plan

ROOT = Path(__file__).resolve().parents[1]
PLAN = "dp=2 pp=4 gbs=16 zero=1"


def _cli_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _without_wall_times(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("sim_wall_s", "timings_s")}


@pytest.fixture(scope="module")
def result() -> parsim.Result:
    return parsim.simulate("gpt3-1.3b", "a100-80g:8", PLAN)


def test_importing_parsim_and_simulating_imports_no_torch():
    code = ("import sys, parsim; r = parsim.simulate('tiny', 'a100-80g:2', 'dp=2'); m = parsim.memory('tiny', "
            "'a100-80g:2', 'dp=2'); assert r.step_time_s > 0 and m.fits; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_simulate_to_dict_is_the_cli_json_and_the_metrics_are_attributes(result, capsys):
    cli = _cli_json(capsys, "simulate", "--model", "gpt3-1.3b", "--cluster", "a100-80g:8", "--plan", PLAN, "--json")
    assert _without_wall_times(json.loads(json.dumps(result.to_dict()))) == _without_wall_times(cli)
    for key, value in result.to_dict().items():
        assert getattr(result, key) == value, key
    assert 0 < result.mfu <= result.hfu < 1 and 0 < result.bubble_fraction < 1
    assert result.peak_memory_bytes == max(s["total"] for s in result.memory_by_stage)


def test_spec_objects_files_and_strings_give_the_same_step(result, tmp_path):
    plan_yaml = tmp_path / "plan.yaml"
    plan_yaml.write_text("dp: 2\npp: 4\ngbs: 16\nzero: 1\n")
    model, cluster, plan = load_model("gpt3-1.3b"), load_cluster("a100-80g:8"), parse_plan(PLAN)
    for args in ((model, cluster, plan), ("gpt3-1.3b", "a100-80g:8", plan_yaml),
                 ("gpt3-1.3b", cluster, {"dp": 2, "pp": 4, "gbs": 16, "zero": 1})):
        assert parsim.simulate(*args).step_time_s == result.step_time_s


def test_a_profile_overrides_the_cluster_numbers():
    plan = "dp=2 gbs=4 dtype=fp32"
    preset = parsim.simulate("cpu-small", "cpu:2", plan)
    calibrated = parsim.simulate("cpu-small", "cpu:2", plan, profile="cpu-calibrated")
    direct = parsim.simulate("cpu-small", load_cluster("cpu:2", profile="cpu-calibrated"), plan)
    assert calibrated.step_time_s == direct.step_time_s != preset.step_time_s


def test_straggler_slowdown_as_a_string_runs_every_device_and_slows_the_step(result):
    slow = parsim.simulate("gpt3-1.3b", "a100-80g:8", PLAN, slowdown="3=1.5")
    assert slow.mode == "full" and len(slow.simulated_ranks) == 8
    assert slow.step_time_s > result.step_time_s


def test_to_pandas_events_memory_and_stages_agree_with_the_metrics(result):
    events = result.to_pandas()
    assert len(events) == len(result.events.events)
    assert (events["duration"] >= 0).all() and events["end"].max() == pytest.approx(result.step_time_s)
    memory = result.to_pandas("memory")
    assert set(memory["rank"]) == set(result.simulated_ranks)
    # one simulated device per pipeline stage: the peak of each one's total is its stage's peak
    peaks = memory.groupby("rank")["total"].max().tolist()
    assert peaks == pytest.approx([s["total"] for s in result.memory_by_stage], rel=1e-12)
    stages = result.to_pandas("stages")
    assert stages["total"].tolist() == [s["total"] for s in result.memory_by_stage]
    with pytest.raises(SpecError) as err:
        result.to_pandas("gantt")
    assert err.value.field == "what"


def test_trace_returns_the_chrome_object_and_writes_what_the_cli_writes(result, tmp_path, capsys):
    obj = result.trace()
    complete = [e for e in obj["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(result.events.events)
    written = result.trace(tmp_path / "api.json")
    assert json.loads(written.read_text()) == json.loads(json.dumps(obj))
    main(["simulate", "--model", "gpt3-1.3b", "--cluster", "a100-80g:8", "--plan", PLAN,
          "--trace", str(tmp_path / "cli.json"), "--json"])
    capsys.readouterr()
    assert (tmp_path / "cli.json").read_bytes() == written.read_bytes()


def test_memory_to_dict_is_the_cli_json(capsys):
    args = ("gpt3-175b", "a100-80g:1024", "dp=8 tp=8 pp=16 gbs=1536 sp=true recompute=selective")
    report = parsim.memory(*args)
    cli = _cli_json(capsys, "memory", "--model", args[0], "--cluster", args[1], "--plan", args[2], "--json")
    assert json.loads(json.dumps(report.to_dict())) == cli
    assert len(report.to_pandas()) == 16 and report.peak_memory_bytes == max(report.to_pandas()["total"])


def test_memory_warnings_are_returned_not_printed(capsys):
    report = parsim.memory("gpt3-1.3b", "a100-80g:8", "dp=2 pp=4 zero=2 gbs=16")
    assert len(report.warnings) == 1 and "zero=2 with pp=4" in report.warnings[0]
    assert capsys.readouterr() == ("", "")


@pytest.fixture(scope="module")
def small_sweep() -> parsim.Sweep:
    return parsim.sweep("gpt3-1.3b", "a100-80g:8", gbs=16, fix="pp=2", resimulate=2)


def test_sweep_to_dict_is_the_cli_json_and_the_frame_holds_every_plan(small_sweep, capsys, tmp_path):
    cli = _cli_json(capsys, "sweep", "--no-progress", "--gbs", "16", "--fix", "pp=2", "--resimulate", "2",
                    "--top", "4", "--json")
    assert _without_wall_times(json.loads(json.dumps(small_sweep.to_dict(top=4)))) == _without_wall_times(cli)
    frame = small_sweep.to_pandas()
    assert len(frame) == small_sweep.num_plans == cli["num_plans"] and set(frame["pp"]) == {2}
    assert (frame["source"] == "sim").sum() == small_sweep.result.num_resimulated >= 2
    small_sweep.write(tmp_path / "plans.csv")
    assert len((tmp_path / "plans.csv").read_text().splitlines()) == small_sweep.num_plans + 1


def test_recommend_to_dict_is_the_cli_json(capsys):
    rec = parsim.recommend("gpt3-1.3b", "a100-80g:8", gbs=16, fix="pp=2", top=2, resimulate=2)
    cli = _cli_json(capsys, "recommend", "--no-progress", "--gbs", "16", "--fix", "pp=2", "--top", "2",
                    "--resimulate", "2", "--json")
    assert json.loads(json.dumps(rec.to_dict())) == cli
    assert [a.rank for a in rec.plans] == [1, 2]


def test_partition_accepts_a_profile_and_matches_the_partitioner():
    from parsim.partition import partition
    api = parsim.api.partition("gpt3-1.3b", "pp=4 gbs=16", "a100-80g:4", graph="analytic")
    assert api.partition == partition("gpt3-1.3b", "pp=4 gbs=16", "a100-80g:4", graph="analytic").partition
    assert sum(api.partition) == load_model("gpt3-1.3b").layers


@pytest.mark.parametrize("call, field", [
    (lambda: parsim.simulate("nope", "a100-80g:8", "dp=8"), "model"),
    (lambda: parsim.simulate("gpt3-1.3b", "a100-80g:x", "dp=8"), "cluster"),
    (lambda: parsim.simulate("gpt3-1.3b", "a100-80g:8", "dp=8 foo=1"), "foo"),
    (lambda: parsim.simulate("gpt3-1.3b", "a100-80g:8", "dp=8", profile="nope"), "profile"),
    (lambda: parsim.simulate("gpt3-1.3b", "a100-80g:8", "dp=8", slowdown="3"), "slowdown"),
    (lambda: parsim.memory("gpt3-1.3b", "a100-80g:8", "dp=3"), "dp*tp*pp"),
    (lambda: parsim.sweep("gpt3-1.3b", "a100-80g:8", headroom=1.5), "headroom"),
    (lambda: parsim.sweep("gpt3-1.3b", "a100-80g:8", out="plans.txt"), "out"),
    (lambda: parsim.sweep("gpt3-1.3b", "a100-80g:8", fix="tp=3"), "space"),
    (lambda: parsim.recommend("gpt3-1.3b", "a100-80g:8", top=0), "top"),
    (lambda: parsim.api.partition("gpt3-1.3b", "pp=0", "a100-80g:8"), "pp"),
    (lambda: parsim.execute("nope"), "model"),
    (lambda: parsim.calibrate("cpu-small", ranks="x"), "ranks"),
    (lambda: parsim.validate("no-such-matrix.yaml"), "matrix"),
    # wrongly typed keyword arguments: the field, not a TypeError from deep inside
    (lambda: parsim.sweep("tiny", "a100-80g:4", gbs="8"), "gbs"),
    (lambda: parsim.sweep("tiny", "a100-80g:4", seq_len="16"), "seq-len"),
    (lambda: parsim.sweep("tiny", "a100-80g:4", headroom="0.1"), "headroom"),
    (lambda: parsim.sweep("tiny", "a100-80g:4", resimulate=2.5), "resimulate"),
    (lambda: parsim.sweep("tiny", "a100-80g:4", workers="1"), "workers"),
    (lambda: parsim.recommend("tiny", "a100-80g:4", top=True), "top"),
    (lambda: parsim.simulate("tiny", "a100-80g:4", "dp=2 pp=2 gbs=8", slowdown={0: "x"}), "slowdown"),
    (lambda: parsim.simulate("tiny", "a100-80g:4", "dp=2 pp=2 gbs=8", slowdown=5), "slowdown"),
    (lambda: parsim.simulate("tiny", "a100-80g:4", "dp=2 pp=2 gbs=8", max_events=2.5), "max_events"),
    (lambda: parsim.simulate("tiny", "a100-80g:4", "dp=2 pp=2 gbs=8", link_slowdown={0: float("inf")}),
     "link_slowdown"),
])
def test_bad_input_raises_a_spec_error_naming_the_field(call, field):
    with pytest.raises(SpecError) as err:
        call()
    assert err.value.field == field


def test_the_readme_python_api_example_runs(tmp_path, monkeypatch, capsys):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Python API"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md (Python API)", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert re.match(r"step [0-9.]+ ms, [0-9,]+ tokens/s, MFU [0-9.]+%", out)
    assert json.loads((tmp_path / "step.json").read_text())["traceEvents"]


def test_integer_keywords_take_numpy_integers_and_integral_floats():
    import numpy as np
    for gbs in (np.int64(8), 8.0):
        assert parsim.sweep("tiny", "a100-80g:4", gbs=gbs, resimulate=0, workers=1).num_plans > 0
