"""``parsim recommend``: reasons in plain words, the rule-of-thumb regimes, and what to change
when nothing fits."""
import json

import pytest
import yaml

from parsim.cli import main
from parsim.specs import load_cluster, load_model, load_profile_dict
from parsim.study.recommend import classify


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def slow_link_profile(tmp_path):
    d = load_profile_dict("a100-80g")
    d["name"] = "a100-80g-slow"
    d["network"]["nics_per_node"] = 1
    d["network"]["inter_node"] = {"bandwidth": 12.5e9, "latency": 1e-5}     # one 100 Gb/s NIC per node
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def test_regimes_follow_device_count_and_link_speed(tmp_path):
    m = load_model("gpt3-13b")
    assert classify(m, load_cluster("a100-80g:1"), 0.1).name == "single-device"
    assert classify(m, load_cluster("a100-80g:8"), 0.1).name == "single-node"
    assert classify(m, load_cluster("a100-80g:64"), 0.1).name == "multi-node-fast"
    assert classify(m, load_cluster("a100-80g:64", profile=slow_link_profile(tmp_path)), 0.1).name == "multi-node-slow"


def test_model_that_does_not_fit_one_device_is_told_to_offload(capsys):
    rc, out, _ = run_cli(capsys, "recommend", "--model", "gpt3-13b", "--cluster", "a100-80g:1", "--gbs", "8",
                         "--resimulate", "0", "--no-progress", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["regime"]["name"] == "single-device" and not doc["regime"]["model_fits_one_device"]
    assert doc["plans"] and all(p["plan"].count("offload=") == 1 for p in doc["plans"])
    assert "follows it" in doc["rule_check"]


def test_each_plan_comes_with_bubble_comm_and_memory_reasons(capsys):
    rc, out, _ = run_cli(capsys, "recommend", "--model", "gpt3-13b", "--cluster", "a100-80g:32", "--gbs", "128",
                         "--resimulate", "0", "--no-progress", "--json", "--top", "2")
    assert rc == 0
    plans = json.loads(out)["plans"]
    assert len(plans) == 2
    text = " ".join(plans[0]["reasons"])
    assert "tokens/s" in text and "peak memory" in text and "allowed per device" in text and "free" in text
    assert "bubble" in text
    assert "communication" in text


def test_nothing_fits_says_how_much_less_memory_and_what_to_try(capsys):
    rc, out, _ = run_cli(capsys, "recommend", "--model", "gpt3-175b", "--cluster", "a100-80g:8", "--gbs", "8",
                         "--fix", "zero=0 recompute=none offload=none", "--resimulate", "0", "--no-progress", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["num_fit"] == 0 and doc["plans"] == []
    advice = " ".join(doc["memory_advice"])
    assert "x less memory" in advice
    assert "zero=3" in advice or "recompute=full" in advice


def test_plain_output_lists_reasons(capsys):
    rc, out, _ = run_cli(capsys, "recommend", "--model", "gpt3-1.3b", "--cluster", "a100-80g:8", "--gbs", "32",
                         "--resimulate", "0", "--no-progress")
    assert rc == 0
    assert "rule of thumb" in out and "#1" in out and "    - " in out


@pytest.mark.parametrize("extra, field", [(["--top", "0"], "top"), (["--resimulate", "-1"], "resimulate"),
                                          (["--headroom", "-0.1"], "headroom")])
def test_bad_input_exits_2(capsys, extra, field):
    rc, out, _ = run_cli(capsys, "recommend", "--model", "gpt3-1.3b", "--cluster", "a100-80g:8", "--no-progress",
                         "--json", *extra)
    assert rc == 2 and json.loads(out)["field"] == field
