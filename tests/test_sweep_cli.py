"""``parsim sweep``: JSON shape, ranking, files out, and exit code 2 on bad input."""
import json

import pandas as pd
import pytest

from parsim.cli import main
from parsim.study.enumerate import enumerate_plans
from parsim.study.space import build_space
from parsim.specs import load_cluster, load_model

BASE = ["sweep", "--model", "gpt3-1.3b", "--cluster", "a100-80g:16", "--gbs", "64", "--resimulate", "0",
        "--no-progress"]


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_carries_num_plans_and_ranked_rows(capsys):
    rc, out, _ = run_cli(capsys, *BASE, "--json", "--top", "5")
    assert rc == 0
    doc = json.loads(out)
    n = len(enumerate_plans(load_model("gpt3-1.3b"), load_cluster("a100-80g:16"), build_space(gbs=64)))
    assert doc["num_plans"] == n
    rows = doc["rows"]
    assert len(rows) == 5
    for key in ("plan", "step_time_s", "tokens_per_s", "mfu", "bubble_fraction", "exposed_comm_s",
                "peak_memory_bytes", "fits", "source"):
        assert key in rows[0]
    assert set(rows[0]["exposed_comm_s"]) == {"tp", "dp", "pp"}
    assert all(r["fits"] for r in rows) and all(r["source"] == "fast" for r in rows)
    tput = [r["tokens_per_s"] for r in rows]
    assert tput == sorted(tput, reverse=True)
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5]


def test_plans_that_fit_rank_before_plans_that_do_not(capsys, tmp_path):
    out = tmp_path / "plans.csv"
    rc, _, _ = run_cli(capsys, *BASE, "--out", str(out), "--headroom", "0.5")
    assert rc == 0
    df = pd.read_csv(out)
    fits = df["fits"].to_numpy()
    assert fits.any() and not fits.all()
    first_nofit = int((~fits).argmax())
    assert fits[:first_nofit].all() and not fits[first_nofit:].any()
    assert (df["peak_memory_bytes"][fits] <= df["memory_limit_bytes"][fits]).all()
    nofit = df["peak_memory_bytes"][~fits].to_numpy()
    assert (nofit[:-1] <= nofit[1:]).all()          # closest to fitting first


def test_parquet_out_holds_every_plan_with_its_metrics(capsys, tmp_path):
    out = tmp_path / "plans.parquet"
    rc, _, _ = run_cli(capsys, *BASE, "--out", str(out), "--fix", "tp=2")
    assert rc == 0
    df = pd.read_parquet(out)
    assert set(df["tp"]) == {2}
    for col in ("plan", "dp", "pp", "schedule", "zero", "step_time_s", "tokens_per_s", "mfu", "peak_memory_bytes",
                "exposed_tp_s", "exposed_dp_s", "exposed_pp_s", "fits", "source"):
        assert col in df.columns


def test_table_output_is_readable(capsys):
    rc, out, _ = run_cli(capsys, *BASE, "--top", "3")
    assert rc == 0
    assert "valid plans" in out and "tokens/s" in out and "peak GiB" in out


def test_seq_len_overrides_the_models(capsys):
    _, short, _ = run_cli(capsys, *BASE, "--json", "--top", "1", "--seq-len", "512")
    assert json.loads(short)["seq_len"] == 512


@pytest.mark.parametrize("extra, field", [
    (["--headroom", "1.5"], "headroom"),
    (["--fix", "tp=x"], "tp"),
    (["--fix", "nonsense=1"], "nonsense"),
    (["--space", "/nonexistent/space.yaml"], "space"),
    (["--out", "plans.txt"], "out"),
    (["--top", "0"], "top"),
    (["--workers", "0"], "workers"),
    (["--seq-len", "0"], "seq-len"),
    (["--fix", "tp=3"], "space"),
    (["--fix", "gbs=32"], "gbs"),
    (["--model", "nope"], "model"),
    (["--cluster", "a100-80g:zero"], "cluster"),
])
def test_bad_input_exits_2_naming_the_field(capsys, extra, field):
    rc, out, err = run_cli(capsys, *BASE, *extra, "--json")
    assert rc == 2
    assert json.loads(out)["field"] == field
    assert field in err


def test_resimulated_rows_carry_the_simpy_engines_numbers(capsys):
    from parsim.sim import simulate
    rc, out, _ = run_cli(capsys, "sweep", "--model", "gpt3-1.3b", "--cluster", "a100-80g:8", "--gbs", "32",
                         "--fix", "dp=1", "--resimulate", "3", "--workers", "2", "--no-progress", "--json", "--top", "500")
    assert rc == 0
    doc = json.loads(out)
    # the 3 best, and every approximate plan within reach of them (parsim.fast.honesty), at most 30
    assert 3 <= doc["num_resimulated"] <= 30
    sims = [r for r in doc["rows"] if r["source"] == "sim"]
    assert len(sims) == doc["num_resimulated"] and all(r["source"] == "sim" for r in doc["rows"][:3])
    for r in sims:
        ref = simulate("gpt3-1.3b", "a100-80g:8", r["plan"], record_events=False)
        assert r["step_time_s"] == pytest.approx(ref.step_time_s, rel=1e-12)
        assert r["peak_memory_bytes"] == pytest.approx(ref.peak_memory_bytes, rel=1e-12)
        assert r["fast_step_time_s"] == pytest.approx(ref.step_time_s, rel=0.25 if r["approximate"] else 0.02)
    fitting = [r["tokens_per_s"] for r in doc["rows"] if r["fits"]]
    assert fitting == sorted(fitting, reverse=True)


def test_a_cpu_sweep_says_when_its_re_simulation_budget_ran_out(capsys):
    """On a shared CPU host every row is approximate ('shared host') and the fast path is
    optimistic, so one re-simulation a plan in the top leaves fast~ rows there: the table says
    the budget ran out; with a budget large enough it does not."""
    from pathlib import Path

    fixture = str(Path(__file__).parent / "fixtures" / "cpu-calibrated.yaml")
    argv = ["sweep", "--model", "tiny", "--cluster", f"{fixture}:4", "--profile", fixture, "--gbs", "8",
            "--no-progress", "--top", "3", "--workers", "1", "--fix", "offload=none recompute=none sp=false dtype=fp32"]
    rc, out, _ = run_cli(capsys, *argv, "--resimulate", "1")
    assert rc == 0 and "fast~" in out and "re-simulation budget (10 x --resimulate = 10 plans) ran out" in out
    rc, out, _ = run_cli(capsys, *argv, "--resimulate", "100")
    assert rc == 0 and "ran out" not in out
