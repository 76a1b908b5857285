"""``parsim simulate`` and ``parsim plot timeline|memory`` through the command line."""
import json

import pytest

from parsim.cli import main
from parsim.trace.chrome import load_chrome_trace

PLAN = ["--model", "gpt3-1.3b", "--cluster", "a100-80g:8", "--plan", "dp=2 pp=4 gbs=16"]


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_simulate_json_is_one_object_with_the_design_keys(capsys):
    rc, out, _ = run_cli(capsys, "simulate", *PLAN, "--json")
    assert rc == 0
    data = json.loads(out)
    for k in ("step_time_s", "tokens_per_s", "mfu", "hfu", "bubble_fraction", "peak_memory_bytes", "memory_by_stage",
              "fits", "model_flops_per_step", "exposed_comm_s", "num_events", "sim_wall_s"):
        assert k in data
    assert len(data["memory_by_stage"]) == 4


def test_simulate_prints_a_readable_summary(capsys):
    rc, out, _ = run_cli(capsys, "simulate", *PLAN)
    assert rc == 0
    for fragment in ("step time", "tokens/s", "MFU / HFU", "pipeline bubble", "exposed comm", "total GiB", "fits"):
        assert fragment in out


def test_simulate_trace_writes_chrome_json_that_loads_back(capsys, tmp_path):
    path = tmp_path / "t.json"
    rc, _, _ = run_cli(capsys, "simulate", *PLAN, "--trace", str(path), "--json")
    assert rc == 0
    raw = json.loads(path.read_text())
    assert "traceEvents" in raw and all("ph" in e for e in raw["traceEvents"])
    trace = load_chrome_trace(path)
    actions = trace.action_events()
    assert len(actions) == 4 * 2 * 8           # pp ranks x (F + B) x microbatches
    assert {e.name for e in actions} >= {"F0.0", "B3.7"}
    assert trace.meta["engine"] == "parsim.sim"


def test_simulate_slowdown_implies_full_mode(capsys):
    rc, out, _ = run_cli(capsys, "simulate", *PLAN, "--slowdown", "3=1.5", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["mode"] == "full" and len(data["simulated_ranks"]) == 8


@pytest.mark.parametrize("args, field", [
    (["--slowdown", "3:1.5"], "slowdown"),
    (["--slowdown", "99=1.5"], "slowdown"),
    (["--mode", "representative", "--slowdown", "3=1.5"], "slowdown"),
])
def test_simulate_bad_input_exits_2_with_one_message(capsys, args, field):
    rc, out, err = run_cli(capsys, "simulate", *PLAN, *args)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and f"{field}=" in err


def test_plot_timeline_writes_a_png(capsys, tmp_path):
    out = tmp_path / "t.png"
    rc, _, _ = run_cli(capsys, "plot", "timeline", *PLAN, "--out", str(out))
    assert rc == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_memory_writes_the_breakdown_and_the_timeline(capsys, tmp_path):
    out = tmp_path / "m.png"
    rc, text, _ = run_cli(capsys, "plot", "memory", *PLAN, "--out", str(out), "--json")
    assert rc == 0
    paths = json.loads(text)["outputs"]
    assert len(paths) == 2
    for p in paths:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_needs_a_chart_name(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plot", "--out", "x.png"])
    assert exc.value.code == 2


def test_parsims_own_warnings_print_as_one_line_and_others_as_python_does(capsys, monkeypatch):
    import warnings

    import parsim.cli.simulate as simulate_command
    from parsim.calibration.fit import fit_alpha_beta

    def warn(args):
        fit_alpha_beta([1e3, 2e3, 4e3], [3e-3, 2e-3, 1e-3])       # no positive slope: a FitWarning
        warnings.warn("from another library", DeprecationWarning)
        return 0
    monkeypatch.setattr(simulate_command, "run", warn)
    assert main(["simulate", "--model", "tiny", "--cluster", "cpu:2", "--plan", "dp=2"]) == 0
    err = capsys.readouterr().err
    assert "parsim: warning: non-positive slope" in err and "fit.py" not in err
    assert "DeprecationWarning: from another library" in err
