"""``parsim montecarlo``, ``parsim plan-run``, ``recommend --rank-by time-to-train`` and the charts."""
from __future__ import annotations

import json

import pytest

from parsim.cli import main

SMALL = ["--model", "gpt3-1.3b", "--cluster", "a100-80g:16", "--plan", "dp=2 tp=2 pp=4 gbs=16"]


def _json(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_montecarlo_json_has_quantiles_and_critical_path(capsys, tmp_path):
    out = _json(capsys, ["montecarlo", *SMALL, "--steps", "5", "--variability", "lognormal:0.05", "--workers", "1",
                         "--slow-ranks", "13=1.3", "--json", "--plot", str(tmp_path / "mc")])
    q = out["step_time_s"]
    assert q["p50"] <= q["p90"] <= q["p99"]
    assert q["min"] > out["clean_step_time_s"]          # rank 13 is 30% slower every step
    assert out["critical_rank_share"] == {"13": 1.0}
    assert len(out["step_times_s"]) == 5
    assert (tmp_path / "mc_steps.png").stat().st_size > 0 and (tmp_path / "mc_critical.png").stat().st_size > 0


@pytest.mark.parametrize("flag, value, field", [("--variability", "weibull:1", "variability"),
                                                ("--slow-nodes", "7=2", "slow_nodes"),
                                                ("--degraded-nics", "1=x", "degraded_nics"),
                                                ("--steps", "0", "steps"),
                                                ("--steps", "9999999999999999999", "steps"),
                                                ("--variability", "lognormal:1e300", "variability"),
                                                ("--variability", "normal:nan", "variability")])
def test_montecarlo_bad_input_exits_2_naming_the_field(capsys, flag, value, field):
    assert main(["montecarlo", *SMALL, flag, value, "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["field"] == field


def test_plan_run_reports_time_to_train_and_checkpoint_interval(capsys, tmp_path):
    out = _json(capsys, ["plan-run", *SMALL, "--tokens", "1e10", "--json", "--plot", str(tmp_path / "g.png"),
                         "--usd-per-gpu-hour", "3"])
    assert out["step_source"] == "simulate"
    assert out["power_w"] == 400.0 and "TDP" in out["power_source"]
    assert out["wall_s"] >= out["compute_s"]
    assert out["cost_usd"] == pytest.approx(3 * out["gpu_hours"])
    assert out["interval_s"] == pytest.approx(out["daly_s"], rel=0.01)
    assert (tmp_path / "g.png").stat().st_size > 0


def test_plan_run_with_variability_uses_the_monte_carlo_mean(capsys):
    clean = _json(capsys, ["plan-run", *SMALL, "--tokens", "1e10", "--json"])
    noisy = _json(capsys, ["plan-run", *SMALL, "--tokens", "1e10", "--json", "--variability", "lognormal:0.1",
                           "--steps", "4", "--workers", "1"])
    assert noisy["step_source"] == "monte-carlo mean of 4 steps"
    assert noisy["step_time_s"] > clean["step_time_s"]
    assert noisy["wall_s"] > clean["wall_s"]


def test_plan_run_bad_inputs_exit_2(capsys):
    assert main(["plan-run", *SMALL, "--tokens", "0"]) == 2
    assert main(["plan-run", *SMALL, "--tokens", "1e9", "--device-mtbf-h", "-5"]) == 2
    assert "device_mtbf_h" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--device-mtbf-h", "0.001"], ["--device-mtbf-h", "0.5", "--ckpt-write-bw", "1"],
                                   ["--ckpt-read-bw", "1e-300"]])
def test_plan_run_that_would_make_no_progress_exits_2_naming_its_inputs(capsys, flags):
    # an interruption every second against a 10-minute restart: no wall time, no overflow
    assert main(["plan-run", *SMALL, "--tokens", "1e9", *flags, "--json"]) == 2
    err = json.loads(capsys.readouterr().out)
    assert err["field"] == "reliability" and "shorten the restart" in err["error"]


def test_recommend_ranks_by_time_to_train(capsys):
    args = ["recommend", "--model", "gpt3-1.3b", "--cluster", "a100-80g:8", "--gbs", "32", "--workers", "1",
            "--no-progress", "--json", "--top", "2"]
    out = _json(capsys, [*args, "--rank-by", "time-to-train", "--tokens", "1e10"])
    times = [p["time_to_train_s"] for p in out["plans"]]
    assert len(times) == 2 and times == sorted(times)
    assert [p["rank"] for p in out["plans"]] == [1, 2]
    assert main([*args, "--rank-by", "time-to-train"]) == 2
