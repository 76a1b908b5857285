"""studies/equivalence: the comparison logic on small synthetic outputs, the corpus's coverage, and
the import pinning (the full before/after run is ``studies/equivalence/compare.py``)."""
from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "studies" / "equivalence"


def _load(name: str):
    if str(HARNESS) not in sys.path:
        sys.path.insert(0, str(HARNESS))      # corpus.py imports its sibling modules by name
    spec = importlib.util.spec_from_file_location(f"equivalence_{name}", HARNESS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up while it executes
    spec.loader.exec_module(mod)
    return mod


difference = _load("difference")


def _sim(**changes) -> dict:
    out = {"step_time_s": 0.36974304494505844, "mfu": 0.3225697944004479, "num_events": 2161,
           "sim_wall_s": 0.0073, "fits": True, "plan": "dp=2 tp=2 pp=2 mbs=1 gbs=16 schedule=1f1b",
           "memory_by_stage": [{"stage": 0, "total": 12767469568.0}, {"stage": 1, "total": 1.2e10}],
           "exposed_comm_s": {"tp": 0.01, "dp": 0.0, "pp": 0.002}}
    out.update(changes)
    return out


def test_equal_outputs_are_identical_whatever_their_wall_clock_fields_say():
    out = difference.compare_values(_sim(), _sim(sim_wall_s=9.9))
    assert out.verdict == "identical" and out.differences == []
    nested = {"rows": [{"plan": "a", "sim_wall_s": 1.0}], "timings_s": {"fast": 0.1}}
    same = {"rows": [{"plan": "a", "sim_wall_s": 2.0}], "timings_s": {"fast": 0.7, "sim": 3.0}}
    assert difference.compare_values(nested, same).verdict == "identical"


@pytest.mark.parametrize("key, wall", [("sim_wall_s", True), ("wall_s", True), ("timings_s", True),
                                       ("runner_wall", True), ("step_time_s", False), ("wallet_bytes", False),
                                       ("exposed_comm_s", False)])
def test_wall_clock_keys_are_recognised_by_name(key, wall):
    assert difference.is_wall_clock(key) is wall


def test_a_relative_change_below_the_tolerance_is_within_and_above_it_is_different():
    t = 0.36974304494505844
    within = difference.compare_values(_sim(), _sim(step_time_s=t * (1 + 3e-12)))
    assert within.verdict == "within"
    assert within.max_rel == pytest.approx(3e-12, rel=1e-3)
    assert [d.path for d in within.differences] == ["step_time_s"]
    changed = difference.compare_values(_sim(), _sim(step_time_s=t * (1 + 2e-9)))
    assert changed.verdict == "different"
    assert changed.differences[0].path == "step_time_s"
    assert changed.differences[0].rel == pytest.approx(2e-9, rel=1e-3)
    looser = difference.compare_values(_sim(), _sim(step_time_s=t * (1 + 2e-9)), rel_tol=1e-8)
    assert looser.verdict == "within"


def test_nested_numbers_strings_booleans_and_shapes_are_compared_exactly():
    stages = _sim()["memory_by_stage"]
    deeper = [stages[0], {**stages[1], "total": 1.2e10 + 1}]
    assert difference.compare_values(_sim(), _sim(memory_by_stage=deeper)).differences[0].path == \
        "memory_by_stage[1].total"
    assert difference.compare_values(_sim(), _sim(memory_by_stage=stages[:1])).verdict == "different"
    assert difference.compare_values(_sim(), _sim(fits=False)).verdict == "different"
    assert difference.compare_values(_sim(), _sim(plan="dp=2 tp=2 pp=2 mbs=1 gbs=16")).verdict == "different"
    extra = difference.compare_values(_sim(), _sim(new_metric=1.0))
    assert extra.verdict == "different" and extra.differences[0].before == "<missing>"
    assert difference.compare_values(_sim(), _sim(new_metric=1.0), new_keys=True).verdict == "identical"
    gone = {k: v for k, v in _sim().items() if k != "mfu"}
    assert difference.compare_values(_sim(), gone, new_keys=True).verdict == "different"   # a lost key still counts


def test_an_integer_printed_as_a_float_is_a_difference_and_nan_equals_nan():
    assert difference.compare_values({"n": 5}, {"n": 5.0}).verdict == "different"
    assert difference.compare_values({"n": True}, {"n": 1}).verdict == "different"
    assert difference.compare_values({"x": math.nan}, {"x": math.nan}).verdict == "identical"
    assert difference.compare_values({"x": math.nan}, {"x": 1.0}).verdict == "different"
    assert difference.relative_difference(0.0, 1e-30) == 1.0      # no absolute floor: a new nonzero shows


def test_failures_must_match_in_both_trees():
    spec_error = {"rc": 2, "stdout": {"error": "tp=3 is invalid: must divide model heads=16", "field": "tp"}}
    ok = {"rc": 0, "stdout": _sim()}
    assert difference.compare_records(spec_error, dict(spec_error)).verdict == "errors-same"
    other = {"rc": 2, "stdout": {"error": "tp=3 is invalid: must divide model heads=32", "field": "tp"}}
    assert difference.compare_records(spec_error, other).verdict == "errors-different"
    assert difference.compare_records(ok, spec_error).verdict == "errors-different"
    crash = {"exception": "ZeroDivisionError: division by zero", "traceback": "..."}
    assert difference.compare_records(crash, {"exception": "ZeroDivisionError: division by zero"}).verdict == \
        "errors-same"
    assert difference.compare_records(ok, {"rc": 0, "stdout": _sim(sim_wall_s=1.0)}).verdict == "identical"


def test_a_full_mode_event_count_is_engine_work_but_a_representative_one_is_compared():
    full, rep = _sim(mode="full"), _sim(mode="representative")
    fewer = {"rc": 0, "stdout": {**full, "num_events": 92}}
    assert difference.compare_records({"rc": 0, "stdout": full}, fewer).verdict == "identical"
    out = difference.compare_records({"rc": 0, "stdout": rep}, {"rc": 0, "stdout": {**rep, "num_events": 92}})
    assert out.verdict == "different" and out.differences[0].path == "stdout.num_events"
    slower = {"rc": 0, "stdout": {**full, "num_events": 92, "step_time_s": 0.37}}
    assert difference.compare_records({"rc": 0, "stdout": full}, slower).verdict == "different"


def test_table_rows_are_matched_by_plan_so_a_reordered_tie_is_no_difference():
    rows = [{"plan": "a", "step_time_s": 1.0}, {"plan": "b", "step_time_s": 1.0}]
    before = {"rc": 0, "stdout": {}, "table_rows": difference.rows_by_plan(rows)}
    after = {"rc": 0, "stdout": {}, "table_rows": difference.rows_by_plan(rows[::-1])}
    assert difference.compare_records(before, after).verdict == "identical"
    changed = difference.rows_by_plan([rows[0], {"plan": "b", "step_time_s": 1.5}])
    out = difference.compare_records(before, {"rc": 0, "stdout": {}, "table_rows": changed})
    assert out.verdict == "different" and out.differences[0].path == "table.b.step_time_s"
    assert difference.rows_by_plan([rows[0], rows[0]]) == [rows[0], rows[0]]     # repeated plans: kept in order


def test_the_corpus_is_deterministic_and_covers_every_plan_key_and_profile_family():
    corpus = _load("corpus")
    root = HARNESS.parents[1]
    items = corpus.build(root)
    assert items == corpus.build(root)
    sims = [it for it in items if it["argv"][0] == "simulate"]
    assert len(sims) >= 2000
    text = " ".join(" ".join(it["argv"]) for it in sims)
    for key in ("dp", "tp", "pp", "vpp", "mbs", "gbs", "schedule", "zero", "offload", "recompute", "sp",
                "dtype", "partition", "dp_bucket_bytes", "dp_overlap", "shifted_critical_path", "tp_overlap",
                "dp_impl", "recompute_layers"):
        assert f" {key}=" in text, key
    for value in ("schedule=naive", "schedule=gpipe", "schedule=interleaved", "zero=3", "offload=optimizer+params",
                  "recompute=stage-aware", "tp_overlap=subpipe", "dp_impl=ps", "--slowdown", "--mode"):
        assert value in text, value
    for cluster in ("a100-80g:", "a100-40g:", "h100-sxm:", "h200:", "cpu:", "cpu-calibrated:", "cpu-merak.yaml",
                    "gpt3-", "megatron-", "llama2-", "llama3-", "tiny", "cpu-small"):
        assert cluster in text, cluster
    assert {it["argv"][0] for it in items} == {"simulate", "memory", "partition", "sweep"}
    assert len({it["id"] for it in items}) == len(items)


def test_the_pin_imports_parsim_from_the_named_tree(tmp_path):
    for package, folder in (("parsim", "parsim"), ("parsim.executor", "executor"),
                            ("parsim.calibration", "calibration")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text(f"WHO = {package!r}\n")
    (tmp_path / "parsim" / "sub.py").write_text("WHO = 'sub'\n")
    code = ("import parsim, parsim.sub, parsim.executor, parsim.calibration; "
            "print(parsim.__file__, parsim.sub.WHO, parsim.executor.__file__, parsim.calibration.WHO)")
    env = dict(os.environ, PYTHONPATH=str(HARNESS / "pin"), PARSIM_EQUIV_TREE=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=tmp_path.parent).stdout.split()
    assert out == [str(tmp_path / "parsim" / "__init__.py"), "sub", str(tmp_path / "executor" / "__init__.py"),
                   "parsim.calibration"]


def test_profile_filters_pick_commands_by_the_profile_their_numbers_come_from():
    compare = _load("compare")
    items = [{"argv": ["simulate", "--model", "tiny", "--cluster", "a100-80g:8", "--plan", "dp=8", "--json"]},
             {"argv": ["memory", "--model", "tiny", "--cluster", "a100-80g:2", "--profile",
                       "{BEFORE}/studies/merak/profiles/cpu-merak.yaml", "--plan", "dp=2", "--json"]},
             {"argv": ["simulate", "--model", "tiny", "--cluster", "cpu-calibrated:4", "--plan", "dp=4", "--json"]}]
    assert [compare.profile_of(it["argv"]) for it in items] == ["a100-80g", "cpu-merak", "cpu-calibrated"]
    assert compare.select_profiles(items, "cpu*", None) == items[1:]
    assert compare.select_profiles(items, None, "a100-80g,h100-sxm") == items[1:]
    assert compare.select_profiles(items, None, None) == items
