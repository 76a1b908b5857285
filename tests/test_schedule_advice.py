"""Sweep and recommend say when the zero-bubble schedules beat 1F1B and when they lose, with
numbers read off the sweep: the win at few microbatches per stage, the loss under
recompute=full (W re-runs the checkpointed forward) and where memory is tight."""
import json

import pytest

from parsim.api import sweep
from parsim.cli import main
from parsim.study.schedule_advice import layout_verdicts, schedule_summary, versus_reference

# gpt3-13b on one 8-GPU node, one layout family: pp=4, 8 or 64 microbatches per step
FIX = "dp=2 tp=1 pp=4 mbs=1 zero=1 offload=none sp=false"


@pytest.fixture(scope="module")
def few():
    return sweep("gpt3-13b", "a100-80g:8", gbs=16, fix=FIX, resimulate=0).frame      # 2 microbatches per stage


@pytest.fixture(scope="module")
def many():
    return sweep("gpt3-13b", "a100-80g:8", gbs=128, fix=FIX, resimulate=0).frame     # 16 per stage


def _row(table, schedule, recompute):
    rows = table[(table["schedule"] == schedule) & (table["recompute"] == recompute)]
    assert len(rows) == 1
    return rows.iloc[0]


def test_zero_bubble_schedules_beat_1f1b_at_two_microbatches_per_stage(few):
    table = versus_reference(few)
    for schedule in ("zb-h1", "zbv", "interleaved-zb"):
        row = _row(table, schedule, "selective")
        assert row["fits"] and row["fits_ref"]
        assert row["speedup"] > 0.10, schedule
        assert row["bubble_fraction"] < row["bubble_fraction_ref"] - 0.10
        assert row["speedup"] == pytest.approx(row["tokens_per_s"] / row["tokens_per_s_ref"] - 1, rel=1e-12)


def test_the_win_shrinks_with_more_microbatches_per_stage(few, many):
    for schedule in ("zb-h1", "zbv"):
        at_few = _row(versus_reference(few), schedule, "selective")["speedup"]
        at_many = _row(versus_reference(many), schedule, "selective")["speedup"]
        assert 0 < at_many < at_few / 2, schedule


def test_recompute_full_makes_split_backward_schedules_lose(few):
    table = versus_reference(few)
    for schedule in ("zbv", "interleaved-zb", "dualpipev"):
        assert _row(table, schedule, "full")["speedup"] < -0.2, schedule
    summary = {s["schedule"]: s for s in schedule_summary(few)}
    assert summary["zbv"]["slower_with_recompute_full"] >= 1
    assert "with recompute=full" in summary["zbv"]["verdict"] and "faster at" in summary["zbv"]["verdict"]


def test_zb_h2_does_not_fit_where_1f1b_does_and_says_by_how_much(few):
    summary = {s["schedule"]: s for s in schedule_summary(few)}
    h2 = summary["zb-h2"]
    assert h2["does_not_fit_where_1f1b_does"] >= 1 and h2["median_extra_memory_bytes"] > 10 * 2**30
    assert "does not fit at" in h2["verdict"]
    row = few[(few["schedule"] == "1f1b") & (few["recompute"] == "selective") & few["fits"]].iloc[0].to_dict()
    text = " ".join(layout_verdicts(row, few))
    assert "zb-h2 does not fit" in text and "GiB over" in text
    assert "zbv" in text and "faster" in text and "microbatches per stage" in text


def test_sweep_and_recommend_print_the_schedule_verdicts(capsys):
    args = ["--model", "gpt3-13b", "--cluster", "a100-80g:8", "--gbs", "16", "--fix", FIX, "--no-progress"]
    assert main(["sweep", *args, "--resimulate", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    zbv = next(s for s in doc["schedules"] if s["schedule"] == "zbv")
    assert zbv["faster"] >= 1 and zbv["median_speedup_when_faster"] > 0.1
    assert main(["recommend", *args, "--top", "1", "--resimulate", "0"]) == 0
    out = capsys.readouterr().out
    assert "other schedules at this layout" in out and "pipeline schedules against 1f1b" in out
    assert "zb-h1 vs 1f1b" in out
