"""Dropout as torch runs it on a CPU (the ``torch`` stack, ``Stack.dropout_noise``): Bernoulli
noise, its scale and the product, RNG bound -- 15-40x a residual add's time over the same
elements (studies/validation_cpu/dropout). The residual and embedding dropouts are ops of their
own there (a GPU stack fuses them or keeps them in the add), and every dropout is priced by the
profile's own "dropout" benchmark where the calibration measured one (``calibration.shapes``),
else as the residual add it stood for before."""
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from parsim.costs import layer_ops
from parsim.costs.ops import embedding_ops
from parsim.costs.timing import membound_time, op_time
from parsim.specs import cluster_from_dict, load_model, parse_plan

# a calibrated profile with fitted memory-bound surfaces, frozen with its held-out run
FIXTURE = Path(__file__).resolve().parents[1] / "studies/validation_cpu/heldout/run_20261203d_zen4/profile.yaml"
MODEL = replace(load_model("tiny"), dropout=True, flash_attention=False)
PLAN = "mbs=2 gbs=2 dtype=fp32"
DROPOUTS = ("attn_dropout", "attn_residual_dropout", "mlp_residual_dropout")


def _device(dropout_fit=None):
    data = yaml.safe_load(FIXTURE.read_text())
    if dropout_fit:
        data["device"]["extra"]["membound_surface"]["dropout"] = dropout_fit
    return cluster_from_dict(data, 1).device


def _ops(model, text: str) -> dict:
    return {op.name: op for op in layer_ops(model, parse_plan(text))}


def test_a_cpus_residual_and_embedding_dropouts_are_ops_of_their_own_only_there():
    assert set(DROPOUTS) <= set(_ops(MODEL, PLAN))            # an unresolved plan reads as torch
    for stack in ("torch-cuda", "megatron-core"):
        gpu = _ops(MODEL, f"{PLAN} stack={stack}")
        assert "attn_residual_dropout" not in gpu and "mlp_residual_dropout" not in gpu
    assert not set(DROPOUTS) & set(_ops(replace(MODEL, dropout=False), PLAN))
    assert "embedding_dropout" in [op.name for op in embedding_ops(MODEL, parse_plan(PLAN))]
    assert "embedding_dropout" not in [op.name for op in embedding_ops(MODEL, parse_plan(f"{PLAN} stack=torch-cuda"))]


def test_dropouts_take_the_profiles_dropout_benchmark_else_the_residual_adds():
    fit = {"fwd": [3e-5, 9e-10], "bwd": [4e-5, 4e-11], "points": 8}
    measured, older = _device(fit), _device()
    ops = _ops(MODEL, PLAN)
    for name in DROPOUTS:
        op = ops[name]
        as_dropout, as_add = replace(op, name="dropout"), replace(op, name="mlp_residual")    # same bytes
        assert op_time(measured, op, "fwd", "fp32") == op_time(measured, as_dropout, "fwd", "fp32")
        assert op_time(older, op, "fwd", "fp32") == op_time(older, as_add, "fwd", "fp32")
        assert membound_time(measured, op.fwd_bytes, "dropout") == pytest.approx(3e-5 + 9e-10 * op.fwd_bytes)
        # the RNG-bound fit prices it well above the add it stood for
        assert op_time(measured, op, "fwd", "fp32") > 2 * op_time(older, op, "fwd", "fp32")


def test_sdpas_math_path_runs_its_products_and_casts_in_fp32_in_a_16_bit_plan():
    """A flash model with dropout on a CPU (``ops.attention_path``: math): its two products are
    priced at the fp32 rate whatever the plan's dtype, and under autocast q, k, v go to fp32 and
    the output back (``attention_math_casts``)."""
    flash = replace(MODEL, flash_attention=True)
    device = _device()
    bf16, fp32 = _ops(flash, "mbs=2 gbs=2 dtype=bf16"), _ops(flash, PLAN)
    assert "flash_attention" not in bf16 and "attention_math_casts" in bf16 and "attention_math_casts" not in fp32
    for name in ("attn_scores", "attn_values"):
        assert bf16[name].dtype == "fp32"
        assert op_time(device, bf16[name], "fwd", "bf16") == op_time(device, replace(bf16[name], dtype=""), "fwd", "fp32")
    assert "flash_attention" in _ops(flash, "mbs=2 gbs=2 dtype=bf16 stack=torch-cuda")


def test_the_calibrations_dropout_points_count_the_bytes_the_ops_count():
    """The "dropout" fit maps bytes to seconds, so the calibration's points and the ops must count
    a dropout's bytes alike: over the residual stream and over the scores (fp32, tp = 1)."""
    from parsim.calibration.shapes import membound_points
    points = [p for p in membound_points(MODEL, [1], [2], "fp32") if p.name == "dropout"]
    by_shape = {p.shape: p.fwd_bytes for p in points}
    ops = _ops(MODEL, PLAN)
    s, h = MODEL.seq_len, MODEL.hidden
    assert by_shape[(2 * s, h)] == ops["attn_residual_dropout"].fwd_bytes == ops["mlp_residual_dropout"].fwd_bytes
    assert by_shape[(2 * MODEL.heads, s, s)] == ops["attn_dropout"].fwd_bytes
