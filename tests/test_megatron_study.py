"""studies/megatron2021: Narayanan et al. 2021 Table 1 predicted with the a100-80g profile."""
import csv
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "studies" / "megatron2021"
TABLE = REPO.parent / "shared" / "validation" / "megatron2021_table1.csv"


def _study():
    spec = importlib.util.spec_from_file_location("megatron2021_run", STUDY / "run.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def table():
    if not TABLE.exists():
        pytest.skip(f"published table not found at {TABLE}")
    return _rows(TABLE)


def test_saved_results_have_one_row_per_table_row_in_order(table):
    saved = _rows(STUDY / "results.csv")
    assert [r["model"] for r in saved] == [r["model"] for r in table]
    for s, t in zip(saved, table):
        assert (int(s["tp"]), int(s["pp"]), int(s["dp"]), int(s["global_batch"])) == \
            (int(t["tp"]), int(t["pp"]), int(t["dp"]), int(t["global_batch"]))
        assert float(s["published_tflops"]) == float(t["achieved_tflops_per_gpu"])
        assert s["fits"] == "True"
    assert (STUDY / "results.png").stat().st_size > 10_000
    assert "MAPE" in (STUDY / "results.txt").read_text()


def test_saved_results_meet_the_issue_6_accuracy_bar(table):
    """MAPE <= 5% over the ten rows and no row worse than 10%, one profile for all rows."""
    saved = _rows(STUDY / "results.csv")
    errors = [abs(float(r["error_pct"])) for r in saved]
    assert sum(errors) / len(errors) <= 5.0
    assert max(errors) <= 10.0
    for r in saved:   # the error column is what the TFLOP/s columns say
        pred, pub = float(r["predicted_tflops"]), float(r["published_tflops"])
        assert float(r["error_pct"]) == pytest.approx(100 * (pred - pub) / pub, abs=0.02)


def test_candidate_plans_follow_megatron_lm_rules(table):
    study = _study()
    row = table[-1]                                    # 1T: 128 layers, pp 64
    model = study.model_of(row)
    plans = study.candidate_plans(model, row)
    assert plans
    for p in plans:
        assert p.mbs in (1, 2, 4, 8) and p.gbs % (p.dp * p.mbs) == 0
        assert model.layers % (p.pp * p.vpp) == 0
        assert (p.schedule == "interleaved") == (p.vpp > 1)
        if p.vpp > 1:
            assert p.num_microbatches % p.pp == 0
        assert (p.recompute, p.dtype, p.sp) == ("full", "fp16", False)
    assert {p.vpp for p in plans} == {1, 2}


def test_two_row_subset_runs_end_to_end(table, tmp_path):
    study = _study()
    subset = tmp_path / "table.csv"
    with open(subset, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table[:2])
    assert study.main(["--table", str(subset), "--out", str(tmp_path), "--top", "1"]) == 0
    out = _rows(tmp_path / "results.csv")
    assert [r["model"] for r in out] == [r["model"] for r in table[:2]]
    for r in out:
        assert float(r["predicted_tflops"]) > 0 and r["fits"] == "True"
    assert (tmp_path / "results.png").exists()
