"""Unfused attention's causal mask is a measured op: the calibration times the executor's
masked_fill alone, and a profile that has its benchmark prices ``attn_mask`` by it, both passes;
older profiles keep pricing it as a residual add over the same bytes.

On a 2-vCPU Zen 3 EPYC (torch 2.13, 2026-11-30) ``scores.masked_fill(causal, -inf)`` with the
broadcast bool (s, s) mask took 7-12x a residual add over the same bytes while the scores fit in
the cache (8 x 128 x 128 fp32: 369-431 against 30-59 us), 3-5x at 8 x 512 x 512, and the held-out
deep model (12 layers, explicit attention) ran its forward at 1.39x its priced ops where the four
flash-attention models ran at 1.07-1.15x."""
from __future__ import annotations

import pytest

from parsim.calibration.shapes import membound_points
from parsim.costs.ops import layer_ops
from parsim.costs.timing import op_time
from parsim.specs import CalibratedTables, DeviceProfile, Plan, load_model
from parsim.specs.surfaces import MemboundFit

EXPLICIT = load_model("tiny")            # flash_attention false: scores, scale, mask, softmax, values
ADD = MemboundFit(fwd=(2e-6, 1e-10), bwd=(1e-6, 0.0))
MASK = MemboundFit(fwd=(3e-6, 9e-10), bwd=(4e-6, 8e-10))


def _device(**surface) -> DeviceProfile:
    return DeviceProfile("t", {"fp32": 1e11, "bf16": 2e11}, 1e10, 1e10, kernel_overhead_s=1e-6,
                         tables=CalibratedTables(membound_surface=surface))


def _mask(plan):
    return next(o for o in layer_ops(EXPLICIT, plan) if o.name == "attn_mask")


def test_a_profile_with_the_mask_benchmark_prices_both_passes_by_it_and_one_without_by_the_add():
    op = _mask(Plan(mbs=2, dtype="fp32"))
    measured = _device(residual_add=ADD, causal_mask=MASK)
    assert op_time(measured, op, "fwd", "fp32") == pytest.approx(MASK.seconds("fwd", op.fwd_bytes))
    assert op_time(measured, op, "bwd", "fp32") == pytest.approx(MASK.seconds("bwd", op.bwd_bytes))
    # without it: the residual add's forward fit for both passes (a streaming pass over the gradient)
    older = _device(residual_add=ADD)
    assert op_time(older, op, "fwd", "fp32") == pytest.approx(ADD.seconds("fwd", op.fwd_bytes))
    assert op_time(older, op, "bwd", "fp32") == pytest.approx(ADD.seconds("fwd", op.bwd_bytes))
    # the scale keeps its stand-in on either profile
    scale = next(o for o in layer_ops(EXPLICIT, Plan(mbs=2, dtype="fp32")) if o.name == "attn_scale")
    assert op_time(measured, scale, "bwd", "fp32") == pytest.approx(ADD.seconds("fwd", scale.bwd_bytes))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_calibrations_mask_point_has_the_ops_bytes_and_shape(dtype):
    for tp in (1, 2):
        plan = Plan(tp=tp, mbs=2, dtype=dtype)
        point = next(p for p in membound_points(EXPLICIT, [tp], [2], dtype) if p.name == "causal_mask")
        op = _mask(plan)
        heads, s = EXPLICIT.heads // tp, EXPLICIT.seq_len
        assert point.shape == (2 * heads, s, s)
        assert (op.fwd_bytes, op.bwd_bytes) == (point.fwd_bytes, point.bwd_bytes)
    # a flash-attention model's grid measures it too: the machine grid serves models it never saw
    assert any(p.name == "causal_mask" for p in membound_points(load_model("cpu-small"), [1], [1], dtype))


def test_the_mask_benchmark_runs_the_executors_masked_fill_and_its_backward():
    torch = pytest.importorskip("torch")
    from parsim.calibration.compute import membound_case
    from parsim.calibration.shapes import MemboundPoint

    point = MemboundPoint("causal_mask", (4, 16, 16), 0.0, 0.0, "t")
    forward, (x,) = membound_case(point, torch.float32, torch.device("cpu"))
    y = forward()
    causal = torch.ones(16, 16, dtype=torch.bool).triu(1)
    assert torch.equal(y, x.masked_fill(causal, float("-inf")))
    (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert torch.equal(grad, (~causal).float().expand(4, 16, 16))     # the masked entries get none
