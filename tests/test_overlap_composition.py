"""Composition terms on a device whose host issues kernels ahead of it (CUDA;
``LayerComposition.overlap``): an op takes the longer of its kernels (factor x its time alone)
and the host's issue time (seconds per op), not their sum; ``calibration.layer_terms`` fits
both terms in that form over the synthetic stages and gets back the terms that generated them."""
import dataclasses
from dataclasses import replace
from pathlib import Path

import pytest

from parsim.calibration.grid import STAGES
from parsim.calibration.layer_terms import composition_terms, stage_op_seconds, stage_ops
from parsim.calibration.surface_fit import fit_overlapped_composition
from parsim.costs import layer_ops
from parsim.costs.timing import op_time
from parsim.specs import LayerComposition, Plan, SpecError, device_from_dict, load_model, load_profile_dict
from parsim.specs.surfaces import StageProbe, StageProbes

FIXTURE = Path(__file__).parent / "fixtures" / "cpu-calibrated.yaml"


def _raw():
    device = device_from_dict(load_profile_dict(FIXTURE)["device"], "cpu")
    return replace(device, tables=device.tables.replace(layer_composition=None))


def _with(device, composition):
    return replace(device, tables=device.tables.replace(layer_composition=composition))


def test_an_overlapped_op_takes_the_longer_of_its_kernels_and_its_issue_a_synchronous_one_their_sum():
    raw = _raw()
    ops = layer_ops(load_model("cpu-small"), Plan(mbs=2, gbs=2, dtype="fp32"))
    d = {op.name: {p: op_time(raw, op, p, "fp32") for p in ("fwd", "bwd_input", "bwd_weight")} for op in ops}
    issue_f = sorted(t["fwd"] for t in d.values() if t["fwd"] > 0)[len(ops) // 2]   # some ops above it, some below
    issue_b = sorted(t["bwd_input"] for t in d.values() if t["bwd_input"] > 0)[len(ops) // 2]
    both = {flag: _with(raw, LayerComposition(1.3, 1.2, issue_f, issue_b, overlap=flag)) for flag in (False, True)}
    below = above = 0
    for op in ops:
        t = d[op.name]
        if t["fwd"] > 0:
            assert op_time(both[True], op, "fwd", "fp32") == pytest.approx(max(1.3 * t["fwd"], issue_f))
            assert op_time(both[False], op, "fwd", "fp32") == pytest.approx(1.3 * t["fwd"] + issue_f)
            below, above = below + (1.3 * t["fwd"] < issue_f), above + (1.3 * t["fwd"] > issue_f)
        if t["bwd_input"] > 0:
            assert op_time(both[True], op, "bwd", "fp32") == pytest.approx(
                max(1.2 * t["bwd_input"], issue_b) + 1.2 * t["bwd_weight"])
    assert below and above      # both sides of the max were checked


def _stages():
    # the CPU stages at two micro-batch sizes: the larger ones' GEMMs outlast the issue time
    return [(spec, mbs * k) for spec, mbs in STAGES["cpu"] for k in (1, 4)]


def test_the_overlapped_fit_gets_back_the_terms_that_generated_its_stages():
    raw, truth = _raw(), LayerComposition(1.25, 1.15, 4e-4, 6e-4, overlap=True)
    priced = _with(raw, truth)
    probes = []
    for spec, mbs in _stages():
        ops = stage_ops(spec, mbs, "fp32")
        probes.append(StageProbe(spec=dataclasses.asdict(spec), mbs=mbs,
                                 fwd_s=sum(op_time(priced, op, "fwd", "fp32") for op in ops),
                                 bwd_s=sum(op_time(priced, op, "bwd", "fp32") for op in ops)))
    device = replace(raw, tables=raw.tables.replace(stage_probes=StageProbes(tuple(probes), (1.0, 1.0), overlap=True)))
    terms = composition_terms(device, "fp32")
    fit = terms.composition
    assert fit.overlap
    assert fit.fwd == pytest.approx(truth.fwd, rel=0.02) and fit.bwd == pytest.approx(truth.bwd, rel=0.02)
    assert fit.per_op_fwd_s == pytest.approx(truth.per_op_fwd_s, rel=0.05)
    assert fit.per_op_bwd_s == pytest.approx(truth.per_op_bwd_s, rel=0.05)
    assert terms.fwd.report.median < 0.02 and terms.bwd.report.median < 0.02     # leave-one-stage-out
    # the synchronous form's fit of the same stages is worse: the form matters
    sync = composition_terms(replace(device, tables=device.tables.replace(
        stage_probes=replace(device.tables.stage_probes, overlap=False))), "fp32")
    assert sync.fwd.report.median > 2 * terms.fwd.report.median


def test_the_overlapped_fit_of_noisy_stages_stays_near_the_truth():
    raw = _raw()
    split = [stage_op_seconds(raw, "fp32", spec, mbs) for spec, mbs in _stages()]
    noise = [1 + 0.02 * x for x in (1, -1, 0.7, -0.7, 0.3, -0.3, 1, -1)]      # +-2 %, a calibration's spread
    running = [s["fwd"][0] for s in split]
    times = sorted(t for run in running for t in run)
    issue = times[int(0.7 * len(times))]        # 30 % of the ops outlast the issue time
    measured = [sum(max(1.4 * t, issue) for t in run) * e for run, e in zip(running, noise)]
    fit = fit_overlapped_composition(running, [0.0] * len(split), measured)
    assert fit.factor == pytest.approx(1.4, rel=0.04) and fit.per_op_s == pytest.approx(issue, rel=0.08)
    assert 0.002 < fit.report.median < 0.03     # the noise, seen on the left-out stages


def test_overlap_reads_back_and_rejects_what_is_not_a_boolean():
    c = LayerComposition(1.2, 1.1, 1e-5, 2e-5, overlap=True)
    assert LayerComposition.from_dict("c", c.to_dict()) == c
    assert "overlap" not in LayerComposition(1.2, 1.1).to_dict()
    assert c.scaled(2.0, 2.0).overlap
    with pytest.raises(SpecError, match=r"c\.overlap"):
        LayerComposition.from_dict("c", {"fwd": 1.2, "bwd": 1.1, "overlap": "yes"})
    probes = StageProbes((), (1.0, 2.0), overlap=True)
    assert StageProbes.from_dict("s", probes.to_dict()) == probes
    with pytest.raises(SpecError, match=r"s\.overlap"):
        StageProbes.from_dict("s", {"stages": [], "reference": [1.0, 2.0], "overlap": 1})


def test_the_composition_rule_is_one_function_on_numbers_and_on_the_fits_grids():
    import numpy as np

    from parsim.costs.timing import composed
    alone = np.array([[1e-4], [5e-4], [2e-3]])           # three ops, seconds alone
    issue = np.array([[0.0, 3e-4, 1e-3]])                 # a grid of per-op seconds
    for overlap in (False, True):
        grid = composed(alone, 1.2, issue, overlap)
        assert grid.shape == (3, 3)
        for i in range(3):
            for j in range(3):
                one = composed(float(alone[i, 0]), 1.2, float(issue[0, j]), overlap)
                assert isinstance(one, float) and grid[i, j] == pytest.approx(one)
                assert one == pytest.approx(max(1.2 * alone[i, 0], issue[0, j]) if overlap
                                            else 1.2 * alone[i, 0] + issue[0, j])


def test_an_op_that_does_not_run_in_a_pass_costs_nothing_whatever_the_per_op_seconds():
    raw = _raw()
    ops = layer_ops(load_model("cpu-small"), Plan(mbs=2, gbs=2, dtype="fp32"))
    idle = {p: [op for op in ops if op_time(raw, op, p, "fp32") == 0.0] for p in ("fwd", "bwd_input")}
    assert idle["fwd"] and idle["bwd_input"]        # the gradient accumulation runs in neither
    for flag in (False, True):
        device = _with(raw, LayerComposition(1.2, 1.1, 3e-4, 2e-4, overlap=flag))
        for p, least in (("fwd", 3e-4), ("bwd_input", 2e-4)):
            assert all(op_time(device, op, p, "fp32") == 0.0 for op in idle[p])
            assert all(op_time(device, op, p, "fp32") >= least for op in ops if op not in idle[p])
