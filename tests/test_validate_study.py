"""``parsim validate``: the matrix file, rank correlation, rounds, and a real resumable run."""
from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest

from parsim.cli import main
from parsim.specs import SpecError, parse_plan, profile_tables
from parsim.study.validate import (MeasuredRound, launches, load_matrix, median_round, read_rounds, run_validation,
                                   spearman_rho)

CPU_CALIBRATED = str(Path(__file__).resolve().parent / "fixtures" / "cpu-calibrated.yaml")   # frozen measured profile


def test_spearman_rho_is_one_for_the_same_order_and_minus_one_reversed():
    assert spearman_rho([1, 2, 3, 4], [10, 20, 30, 45]) == pytest.approx(1.0)
    assert spearman_rho([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties take average ranks: [1, 2.5, 2.5, 4] against [1, 2, 3, 4]
    assert spearman_rho([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, abs=1e-6)


@pytest.mark.parametrize("text, field", [
    ("model: tiny\nplans: ['dp=2']\nrepeat: 3\n", "matrix.repeat"),
    ("model: tiny\nplans: ['dp=2']\nrounds: 0\n", "matrix.rounds"),
    ("model: tiny\nplans: ['dp=2']\nsteps: two\n", "matrix.steps"),
    ("model: tiny\nplans: ['dp=2']\nwarmup: -1\n", "matrix.warmup"),
    ("model: tiny\nplans: []\n", "matrix.plans"),
])
def test_bad_matrix_is_rejected_naming_the_key(tmp_path, text, field):
    f = tmp_path / "m.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as e:
        load_matrix(f)
    assert e.value.field == field


def test_cli_rejects_zero_rounds_with_exit_2(capsys, tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("model: tiny\nplans: ['dp=2 gbs=2']\n")
    rc = main(["validate", "--matrix", str(f), "--out", str(tmp_path / "out"), "--rounds", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "rounds=0" in err and err.count("\n") == 1


@pytest.mark.parametrize("bad, field, fragment", [
    ("pp=2 vpp=4 gbs=4 schedule=interleaved", "matrix.plans[1].pp*vpp", "4 layers"),      # the simulator's rules
    ("dp=2 gbs=2 dp_impl=ps", "matrix.plans[1].dp_impl", "no parameter server"),          # the executor's own
])
def test_a_bad_plan_anywhere_in_the_matrix_fails_before_any_round_naming_its_place(capsys, tmp_path, bad, field,
                                                                                   fragment):
    f = tmp_path / "m.yaml"
    f.write_text(f"model: tiny\nplans: ['dp=2 gbs=2', '{bad}']\n")
    out = tmp_path / "out"
    rc = main(["validate", "--matrix", str(f), "--profile", CPU_CALIBRATED, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert f"{field}=" in err and fragment in err and repr(parse_plan(bad).to_string()) in err
    assert not out.exists()         # the good first plan did not run either


def test_launches_group_consecutive_plans_of_one_world_size():
    plans = [parse_plan(t) for t in ["dp=2", "tp=2", "dp=4", "pp=2", "dp=2 zero=1", "pp=2 gbs=2", "tp=2 gbs=2",
                                     "dp=2 gbs=4"]]
    groups = launches(plans, per_launch=3)
    assert [[p.to_string() for p in g] for g in groups] == [[plans[0].to_string(), plans[1].to_string()],
                                                            [plans[2].to_string()],
                                                            [p.to_string() for p in plans[3:6]],
                                                            [p.to_string() for p in plans[6:]]]
    assert all(len({p.world_size for p in g}) == 1 for g in groups)


def test_median_round_is_the_round_closest_to_the_median():
    def r(k, t):
        return MeasuredRound("dp=2", k, t, [t], [1], [0.0], f"r{k}")
    assert median_round([r(0, 3.0), r(1, 1.0), r(2, 2.2)]).round == 2
    # even count: median 2.0 lies between 1.5 and 2.5; the earlier round wins the tie
    assert median_round([r(0, 2.5), r(1, 1.5)]).round == 0


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.timeout(600)
def test_validation_runs_rounds_on_real_processes_and_resumes_without_rerunning(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("model: tiny\nsteps: 2\nwarmup: 1\nrounds: 2\n"
                 "plans: ['dp=2 gbs=4 dtype=fp32', 'pp=2 gbs=4 schedule=1f1b dtype=fp32']\n")
    matrix = load_matrix(f)
    out = tmp_path / "out"
    report = run_validation(matrix, CPU_CALIBRATED, out, progress=False)
    assert len(report.rows) == 2
    rounds = read_rounds(out)
    assert sorted((m.plan, m.round) for m in rounds) == sorted((p.to_string(), k) for p in matrix.plans for k in (0, 1))
    for row in report.rows:
        mine = [m.step_time_s for m in rounds if m.plan == row["plan"]]
        assert json.loads(row["measured_rounds_s"]) == pytest.approx(mine, abs=1e-6)
        assert row["measured_step_s"] == pytest.approx(statistics.median(mine))
        assert row["predicted_step_s"] > 0 and row["measured_peak_bytes"] > 0
        assert (out / f"{row['trace_file']}.measured.json").exists()
        # the shipped profile has a layer probe: every round re-took it, and the row is anchored to it
        assert row["anchored_step_s"] > 0 and 0.2 < row["probe_drift"] < 5 and row["probe_contention"] > 0.5
    for m in rounds:   # one timed step: a probe right before it and one after it
        assert len(m.layer_probes) == 2
        assert all(p["solo_fwd_s"] > 0 and p["solo_bwd_s"] > 0 and p["concurrent_s"] > 0 and p["world"] == 2
                   for p in m.layer_probes)
    # the table is lost but the rounds are kept: the rows come back without running the executor again
    (out / "validation.csv").unlink()
    before = (out / "rounds.csv").read_text()
    again = run_validation(matrix, CPU_CALIBRATED, out, progress=False)
    assert (out / "rounds.csv").read_text() == before
    assert [r["measured_step_s"] for r in again.rows] == pytest.approx([r["measured_step_s"] for r in report.rows])
    with (out / "validation.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == 2
    # asked for a third round, it runs only that round of each plan and judges both again over three
    more = run_validation(matrix, CPU_CALIBRATED, out, progress=False, rounds=3)
    rounds = read_rounds(out)
    assert sorted((m.plan, m.round) for m in rounds) == sorted((p.to_string(), k) for p in matrix.plans
                                                               for k in (0, 1, 2))
    assert (out / "rounds.csv").read_text().startswith(before)       # the first two rounds kept as they were
    for row in more.rows:
        mine = [m.step_time_s for m in sorted(rounds, key=lambda m: m.round) if m.plan == row["plan"]]
        assert json.loads(row["measured_rounds_s"]) == pytest.approx(mine, abs=1e-6)
        assert row["measured_step_s"] == pytest.approx(statistics.median(mine))
    with (out / "validation.csv").open() as fh:
        assert sorted(r["plan"] for r in csv.DictReader(fh)) == sorted(p.to_string() for p in matrix.plans)


def _probes_like(profile, scale=1.0, contention=None, world=2):
    """Layer probes (before, after) reading the profile's own probe times, scaled."""
    tables = profile_tables(profile)
    fwd, bwd = tables.layer_probe.fwd_s * scale, tables.layer_probe.bwd_s * scale
    slow = tables.contention_layer.get(world) if contention is None else contention
    return [{"solo_fwd_s": fwd, "solo_bwd_s": bwd, "concurrent_s": (fwd + bwd) * slow, "world": world}] * 2


def test_anchoring_to_the_profiles_own_probe_changes_nothing_and_a_slower_layer_scales_compute():
    from parsim.calibration.layer_terms import fit_layer_terms
    from parsim.sim import simulate
    from parsim.calibration.anchor import anchored_profile, probe_drift, probe_request
    from parsim.specs import cluster_from_dict, device_from_dict, load_model, load_profile_dict

    prof = load_profile_dict(CPU_CALIBRATED)
    assert probe_request(prof) == (load_model("cpu-small"), 1, "fp32")
    refit = fit_layer_terms(device_from_dict(prof["device"]), load_model("cpu-small"), "fp32")
    same = anchored_profile(prof, _probes_like(prof))
    anchored = profile_tables(same)
    assert anchored.layer_composition.fwd == pytest.approx(refit.layer_composition.fwd, rel=1e-9)
    assert anchored.layer_composition.bwd == pytest.approx(refit.layer_composition.bwd, rel=1e-9)
    for n, v in refit.contention.values:
        assert anchored.contention.get(n) == pytest.approx(v, rel=1e-9), n
    assert probe_drift(prof, _probes_like(prof)) == pytest.approx(1.0)
    assert profile_tables(prof) == profile_tables(load_profile_dict(CPU_CALIBRATED))    # the input is untouched

    slow = anchored_profile(prof, _probes_like(prof, scale=1.25))
    assert probe_drift(prof, _probes_like(prof, scale=1.25)) == pytest.approx(1.25)
    for p in ("fwd", "bwd"):
        assert profile_tables(slow).layer_composition.factor(p) == pytest.approx(
            1.25 * refit.layer_composition.factor(p), rel=1e-9)
    # a 4-rank probe reading more contention raises the 4-rank GEMM contention only
    crowded = profile_tables(anchored_profile(prof, _probes_like(
        prof, world=4, contention=profile_tables(prof).contention_layer.get(4) + 1.0)))
    assert crowded.contention.get(4) > refit.contention.get(4) + 0.5
    assert crowded.contention.get(2) == pytest.approx(refit.contention.get(2))
    # the level only (a kept profile re-timed before a demo): the profile's 4-rank slowdown stays
    level = profile_tables(anchored_profile(prof, _probes_like(
        prof, world=4, contention=profile_tables(prof).contention_layer.get(4) + 1.0), contention=False))
    assert level.contention_layer == profile_tables(prof).contention_layer
    assert level.contention.get(4) == pytest.approx(refit.contention.get(4))

    model, plan = load_model("cpu-small"), parse_plan("pp=2 gbs=8 schedule=1f1b dtype=fp32")
    base = simulate(model, cluster_from_dict(same, 2), plan, mode="full").step_time_s
    scaled = simulate(model, cluster_from_dict(slow, 2), plan, mode="full").step_time_s
    # compute is most of a pp=2 step on this profile (communication and the bubble's wait are not scaled)
    assert 1.15 < scaled / base <= 1.25 + 1e-9


def test_profiles_without_a_layer_probe_are_not_anchored_and_old_rounds_files_resume(tmp_path):
    from parsim.specs import load_profile_dict
    from parsim.calibration.anchor import probe_request
    from parsim.study.validate import ROUND_COLUMNS, append_round

    assert probe_request(load_profile_dict("cpu")) is None
    assert probe_request(load_profile_dict("h100-sxm")) is None
    # a rounds.csv written before the probes existed keeps its header; its rounds read back unprobed
    old = [c for c in ROUND_COLUMNS if c != "layer_probes"]
    (tmp_path / "rounds.csv").write_text(",".join(old) + "\n")
    m = MeasuredRound("dp=2 gbs=4 dtype=fp32", 0, 1.5, [1.5], [10, 10], [2.0], "t.json",
                      layer_probes=[{"solo_fwd_s": 0.1, "solo_bwd_s": 0.2, "concurrent_s": 0.3, "world": 2}])
    append_round(tmp_path, m, 2)
    back, = read_rounds(tmp_path)
    assert (back.plan, back.step_time_s, back.layer_probes) == (m.plan, 1.5, [])
    (tmp_path / "rounds.csv").unlink()
    append_round(tmp_path, m, 2)
    assert read_rounds(tmp_path)[0].layer_probes == m.layer_probes


def test_a_profile_calibrated_on_a_model_file_keeps_its_spec_so_the_layer_probe_can_be_re_taken():
    """A model given as a YAML file has no preset name: the profile keeps the whole spec
    (``provenance.model_spec``), and the probe request and the anchoring build the layer from it."""
    import copy
    import dataclasses

    from parsim.specs import ModelSpec, load_profile_dict
    from parsim.calibration.anchor import anchored_profile, probe_request

    custom = ModelSpec(name="not-a-preset", layers=2, hidden=256, heads=4, ffn_hidden=1024, vocab=5000, seq_len=64)
    prof = copy.deepcopy(load_profile_dict(CPU_CALIBRATED))
    prof["provenance"].update(model="not-a-preset", model_spec=dataclasses.asdict(custom))
    assert probe_request(prof) == (custom, 1, "fp32")
    anchored = anchored_profile(prof, _probes_like(prof, scale=1.1))
    assert profile_tables(anchored).layer_probe.fwd_s == pytest.approx(1.1 * profile_tables(prof).layer_probe.fwd_s)
