"""The composition terms never price the real layer below what its probe measured alone
(``calibration.layer_terms.at_least_the_layer``): a layer inside a stage does not run faster
than alone with its weights hot."""
from dataclasses import replace
from pathlib import Path

import pytest

from parsim.calibration.layer_terms import at_least_the_layer
from parsim.costs import layer_ops
from parsim.costs.timing import op_time
from parsim.specs import LayerComposition, Plan, device_from_dict, load_model, load_profile_dict

FIXTURE = Path(__file__).parent / "fixtures" / "cpu-calibrated.yaml"


def _setup():
    device = device_from_dict(load_profile_dict(FIXTURE)["device"], "cpu")
    probe = device.tables.layer_probe
    ops = layer_ops(load_model("cpu-small"), Plan(mbs=int(probe.mbs), gbs=int(probe.mbs), dtype="fp32"))
    return device, probe, ops


def _priced(device, composition, ops, pass_):
    dev = replace(device, tables=device.tables.replace(layer_composition=composition))
    return sum(op_time(dev, op, pass_, "fp32") for op in ops)


def test_terms_that_price_the_layer_below_its_probe_are_raised_to_it():
    device, probe, ops = _setup()
    low = LayerComposition(0.6, 0.5, 0.0, 2e-5)
    raised = at_least_the_layer(device, low, ops, probe, "fp32")
    assert _priced(device, raised, ops, "fwd") == pytest.approx(probe.fwd_s, rel=1e-9)
    assert _priced(device, raised, ops, "bwd") == pytest.approx(probe.bwd_s, rel=1e-9)
    assert raised.per_op_bwd_s / low.per_op_bwd_s == pytest.approx(raised.bwd / low.bwd)   # both terms, alike


def test_terms_that_price_the_layer_at_or_above_its_probe_are_kept():
    device, probe, ops = _setup()
    high = LayerComposition(1.6, 1.5)
    assert at_least_the_layer(device, high, ops, probe, "fp32") == high
    # one pass below, the other above: only the one below moves
    mixed = LayerComposition(0.5, 1.5)
    out = at_least_the_layer(device, mixed, ops, probe, "fp32")
    assert out.bwd == mixed.bwd and out.fwd > mixed.fwd
