"""RoPE is a measured op: the calibration times the executor's rotation alone, and a profile
that has its benchmark prices it by it; older profiles keep it in their composition terms.

On a GQA model (probe-gqa: h 384, 6 query / 2 KV heads of 64, seq 192; 2-vCPU AMD EPYC,
2026-11-30) the executor's eager RoPE took ~0.7 ms of a 3.9 ms bf16 layer forward, and the
layer forward was priced 15 % fast while composed: the composition terms, fitted over stages of
which one has RoPE, held it as an average."""
from __future__ import annotations

import pytest

from parsim.calibration.shapes import membound_points, rope_point
from parsim.costs.ops import layer_ops
from parsim.costs.saved import precision
from parsim.costs.timing import op_time
from parsim.specs import CalibratedTables, DeviceProfile, LayerComposition, Plan, load_model
from parsim.specs.surfaces import MemboundFit

GQA = load_model("llama3-8b")          # 32 query heads, 8 KV heads of 128
ROPE = MemboundFit(fwd=(2e-5, 1e-10), bwd=(3e-5, 2e-10))


def _rope(model, plan):
    return next(o for o in layer_ops(model, plan) if o.name == "rope")


def _device(**tables) -> DeviceProfile:
    return DeviceProfile("t", {"fp32": 1e11, "bf16": 2e11}, 1e10, 1e10, kernel_overhead_s=1e-6,
                         tables=CalibratedTables(**tables))


def test_a_profile_with_the_rope_benchmark_prices_it_and_one_without_keeps_it_composed():
    plan = Plan(mbs=1, dtype="fp32")
    op = _rope(GQA, plan)
    composition = LayerComposition(1.1, 1.2, per_op_fwd_s=5e-5, per_op_bwd_s=7e-5)
    measured = _device(membound_surface={"rope": ROPE}, layer_composition=composition)
    assert op_time(measured, op, "fwd", "fp32") == pytest.approx(1.1 * ROPE.seconds("fwd", op.fwd_bytes) + 5e-5)
    assert op_time(measured, op, "bwd", "fp32") == pytest.approx(1.2 * ROPE.seconds("bwd", op.bwd_bytes) + 7e-5)
    older = _device(membound_surface={"layernorm": ROPE}, layer_composition=composition)
    assert op_time(older, op, "fwd", "fp32") == 0.0 and op_time(older, op, "bwd", "fp32") == 0.0
    # a datasheet profile (no calibrated tables) streams its bytes
    assert op_time(_device(), op, "fwd", "fp32") > 0.0


def test_under_autocast_rope_moves_fp32_and_a_16_bit_stack_its_own_dtype():
    # the executor's cos / sin tables are fp32: bf16 q x cos promotes, so the chain runs in fp32
    torch_bf16 = Plan(mbs=1, dtype="bf16", stack="torch")
    assert precision(torch_bf16).rope == 4.0
    assert precision(Plan(mbs=1, dtype="bf16", stack="megatron-core")).rope == 2.0
    q_and_k = 8192 * (GQA.hidden + GQA.kv_hidden)
    assert _rope(GQA, torch_bf16).fwd_bytes == pytest.approx(2 * 4.0 * q_and_k)
    assert _rope(GQA, Plan(mbs=1, dtype="bf16", stack="megatron-core")).fwd_bytes == pytest.approx(2 * 2.0 * q_and_k)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_calibrations_rope_point_has_the_ops_bytes_and_shape(dtype):
    for tp in (1, 2):
        point = rope_point(GQA, tp, 2, dtype, "t")
        op = _rope(GQA, Plan(tp=tp, mbs=2, dtype=dtype))
        assert point.shape == (2, (32 + 8) // tp, 8192, 128)
        # q and k of 2 x 8192 tokens, read and written once, fp32 in both dtypes (the torch stack's
        # autocast promotes RoPE to fp32); the backward moves as much
        expected = 2 * 4.0 * 2 * 8192 * (4096 + 1024) / tp
        assert point.fwd_bytes == pytest.approx(expected) and point.bwd_bytes == pytest.approx(expected)
        assert (op.fwd_bytes, op.bwd_bytes) == (point.fwd_bytes, point.bwd_bytes)
    # every model's grid measures it, whatever its own position encoding
    assert any(p.name == "rope" for p in membound_points(load_model("cpu-small"), [1], [1], dtype))


def test_the_rope_benchmark_runs_the_executors_rotation():
    torch = pytest.importorskip("torch")
    from parsim.calibration.compute import membound_case
    from parsim.executor.model import apply_rope, rope_tables

    point = rope_point(load_model("tiny"), 1, 1, "fp32", "t")
    forward, (x,) = membound_case(point, torch.float32, torch.device("cpu"))
    y = forward()
    assert y.shape == x.shape
    assert torch.equal(y, apply_rope(x, *rope_tables(point.shape[2], point.shape[3], x.device)))
