"""``parsim plot sweep``: the four sweep charts from a sweep's CSV or Parquet."""
import json

import pandas as pd
import pytest

from parsim.cli import main
from parsim.plots.sweep import pareto_front


@pytest.fixture(scope="module")
def sweep_csv(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "plans.csv"
    assert main(["sweep", "--model", "gpt3-2.7b", "--cluster", "a100-80g:16", "--gbs", "64", "--resimulate", "0",
                 "--no-progress", "--out", str(out)]) == 0
    return out


def test_plot_sweep_writes_four_charts(capsys, sweep_csv, tmp_path):
    rc = main(["plot", "sweep", "--csv", str(sweep_csv), "--out", str(tmp_path), "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    names = sorted(p.split("/")[-1] for p in doc["outputs"])
    assert names == ["bubble_vs_microbatches.png", "heatmap_tp_pp.png", "memory_per_zero_stage.png", "pareto.png"]
    for p in doc["outputs"]:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_pareto_front_is_not_dominated_and_dominates_the_rest(sweep_csv):
    df = pd.read_csv(sweep_csv)
    front = pareto_front(df)
    mem, tput = front["peak_memory_bytes"].to_numpy(), front["tokens_per_s"].to_numpy()
    assert (mem[1:] >= mem[:-1]).all() and (tput[1:] > tput[:-1]).all()
    for m, t in zip(df["peak_memory_bytes"], df["tokens_per_s"]):
        better = (mem <= m) & (tput >= t)
        assert better.any()


@pytest.mark.parametrize("name", ["missing.csv", "plans.txt"])
def test_plot_sweep_rejects_what_is_not_a_sweep_table(capsys, tmp_path, name):
    rc = main(["plot", "sweep", "--csv", str(tmp_path / name), "--out", str(tmp_path), "--json"])
    assert rc == 2
    assert json.loads(capsys.readouterr().out)["field"] == "csv"
