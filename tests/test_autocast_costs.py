"""A 16-bit run of the torch stack (the executor: ``torch.autocast`` over fp32 parameters) as the
cost model prices it: the conversions autocast adds, counted against the executor's own layer and
head (every ``aten._to_copy`` between dtypes under a ``TorchDispatchMode``); the fp32 side of its
TP collectives and ZeRO gathers; and a calibration's attention surfaces in every dtype, which
price a 16-bit run's attention where no GEMM rate can (a CPU's 16-bit SDPA is no faster than
fp32's)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from parsim.costs import layer_params, plan_state_bytes, zero3_gather_bytes_per_layer
from parsim.costs.comm import tp_collectives_edge, tp_collectives_per_layer
from parsim.costs.ops import head_ops, layer_ops
from parsim.specs import Plan, load_model

TINY = load_model("tiny")
GPT = replace(TINY, flash_attention=True, seq_len=64)
VARIANTS = {"gpt-sdpa": GPT, "gpt-explicit-gqa": replace(GPT, flash_attention=False),
            "llama-sdpa": replace(GPT, activation="swiglu", norm="rmsnorm", position="rope", bias=False,
                                  tied_embeddings=False)}


def converted_elements(spec, mbs: int, last: bool) -> dict[str, int]:
    """Elements of the 2-D and 3-D tensors (weights; (b, s, h) activations and logits) one
    executor stage converts between dtypes under bf16 autocast, forward and backward; 1-D (biases,
    norm weights) and 4-D (RoPE's per-head rotations, priced in the composition terms) left out."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    from parsim.executor.model import StageModule
    from parsim.executor.weights import init_stage
    from parsim.executor.optimizer import autocast_factory

    counts = {"fwd": 0, "bwd": 0}

    class Conversions(TorchDispatchMode):
        phase = "fwd"

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket is torch.ops.aten._to_copy and args[0].dtype != out.dtype and out.dim() in (2, 3):
                counts[self.phase] += out.numel()
            return out

    torch.manual_seed(0)
    stage = StageModule(spec, 0, 1, is_first=last, is_last=last)
    init_stage(stage, seed=0)
    shape = (mbs, spec.seq_len)
    with Conversions() as mode:
        with autocast_factory("bf16", torch.device("cpu"))():
            if last:
                y = stage(torch.randint(0, spec.vocab, shape), torch.randint(0, spec.vocab, shape))
            else:
                x = torch.randn(*shape, spec.hidden, requires_grad=True)
                y = stage(x)
        mode.phase = "bwd"
        y.backward(None if last else torch.randn_like(y))
    return counts


def priced_elements(ops) -> dict[str, float]:
    """Elements the cast ops of ``ops`` convert (6 bytes each: 4 read or written in fp32, 2 in bf16)."""
    casts = [op for op in ops if op.name.endswith("casts")]
    return {"fwd": sum(op.fwd_bytes for op in casts) / 6, "bwd": sum(op.bwd_bytes for op in casts) / 6}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_layer_casts_priced_are_the_ones_the_executor_makes(variant):
    spec = VARIANTS[variant]
    plan = Plan(mbs=2, dtype="bf16")
    assert priced_elements(layer_ops(spec, plan)) == converted_elements(spec, 2, last=False)


def test_the_head_casts_priced_are_the_ones_the_executor_makes():
    """A one-stage model's last stage: embedding, one layer, head; the head's casts (its weight,
    the final norm's output, the logits to fp32 for the loss and each gradient back) beside the
    layer's."""
    spec = replace(GPT, layers=1)
    plan = Plan(mbs=2, dtype="bf16")
    priced = priced_elements(layer_ops(spec, plan) + head_ops(spec, plan))
    assert priced == converted_elements(spec, 2, last=True)


def test_no_casts_in_fp32_or_on_stacks_with_16_bit_parameters():
    for plan in (Plan(dtype="fp32"), Plan(dtype="bf16", stack="megatron-core"), Plan(dtype="fp16", stack="fsdp2")):
        assert priced_elements(layer_ops(GPT, plan) + head_ops(GPT, plan)) == {"fwd": 0, "bwd": 0}


def test_autocast_moves_the_residual_side_of_tp_collectives_and_its_parameters_in_fp32():
    """Under autocast a norm's output entering the TP region, the embedding's output and their
    gradients are fp32, a GEMM's output and its gradient 16-bit; the parameters (ZeRO gathers)
    fp32. Megatron's 16-bit parameters and activations: every buffer 16-bit."""
    for sp in (False, True):
        torch_plan, mcore = Plan(tp=2, sp=sp, dtype="bf16"), Plan(tp=2, sp=sp, dtype="bf16", stack="megatron-core")
        for phase in ("fwd", "bwd"):
            ours = tp_collectives_per_layer(GPT, torch_plan, phase)
            theirs = tp_collectives_per_layer(GPT, mcore, phase)
            residual_side = {"attn_in_allgather", "mlp_in_allgather", "mlp_in_grad_allreduce", "attn_in_grad_allreduce",
                             "mlp_in_grad_reducescatter", "attn_in_grad_reducescatter"}
            for a, b in zip(ours, theirs):
                assert a.nbytes == (2 if a.name in residual_side else 1) * b.nbytes, (sp, phase, a.name)
            for part in ("embedding", "head"):
                for a, b in zip(tp_collectives_edge(GPT, torch_plan, part, phase),
                                tp_collectives_edge(GPT, mcore, part, phase)):
                    assert a.nbytes == (1 if a.name.startswith("loss") else 2) * b.nbytes, (part, a.name)
    zero3 = dict(dp=2, zero=3, dtype="bf16")
    assert zero3_gather_bytes_per_layer(GPT, Plan(**zero3)) == 4 * layer_params(GPT)
    assert zero3_gather_bytes_per_layer(GPT, Plan(**zero3, stack="megatron-core")) == 2 * layer_params(GPT)
    assert plan_state_bytes(Plan(dtype="fp16")).grad == 4 and plan_state_bytes(Plan(dtype="fp16", stack="fsdp2")).grad == 2


# ----------------------------------------------------------------------------- calibration


def test_the_grid_measures_attention_in_every_dtype_with_a_rate():
    from parsim.calibration.machine_bench import QUICK_GRID, plan_grid, steps_of
    rates = {"fp32": 1e11, "bf16": 4e11, "fp16": 3e10}
    plan = plan_grid("cpu", "fp32", QUICK_GRID, rates, quick=True)
    assert set(plan.attention_other) == {"bf16", "fp16"}
    assert all(len(points) == QUICK_GRID.attention for points in plan.attention_other.values())
    without = plan_grid("cpu", "fp32", QUICK_GRID, {"fp32": 1e11}, quick=True)
    assert without.attention_other == {}
    assert steps_of(plan, 3) - steps_of(without, 3) == 2 * QUICK_GRID.attention + 2 * 3    # + 2 GEMM dtypes


def test_a_16_bit_attention_surface_is_fitted_and_prices_that_dtype():
    """Synthetic attention times from a known surface, fp32 and (as on a CPU) bf16 at the same
    speed: the fitted bf16 surface prices a bf16 attention op within the noise of fp32's, where
    the datasheet path (no surface) would take the bf16 GEMM peak."""
    from parsim.calibration.machine_bench import GridResults
    from parsim.calibration.machine_fit import fit_surfaces
    from parsim.calibration.shapes import AttentionPoint
    from parsim.calibration.fit import Summary
    from parsim.specs.surfaces import RooflineFit

    true = RooflineFit(peak=5e10, half=(64.0, 16.0, 1.0), overhead_s=2e-5)
    rng = np.random.default_rng(0)
    points = [AttentionPoint(1, int(h), int(h), int(s), int(d))
              for h, s, d in zip(rng.integers(1, 32, 24), 2 ** rng.integers(5, 11, 24), rng.choice([32, 64, 128], 24))]

    def timed(p: AttentionPoint, factor: float) -> tuple:
        dims = (p.seq, p.head_dim, p.batch_heads)
        t = lambda w: Summary(*[true.seconds(w, dims) * factor] * 3, 3)      # noqa: E731
        return p, t(p.fwd_flops), t(2.5 * p.fwd_flops)
    grid = GridResults(attention=[timed(p, 1.0) for p in points],
                       attention_other={"bf16": [timed(p, 1.02) for p in points]})
    s = fit_surfaces(grid, "fp32")
    assert set(s.attention) == {"fp32", "bf16"} and {"attention.bf16.fwd", "attention.bf16.bwd"} <= set(s.report)
    p = points[5]
    work, dims = p.fwd_flops, (p.seq, p.head_dim, p.batch_heads)
    assert s.attention["bf16"]["fwd"].seconds(work, dims) == pytest.approx(
        1.02 * s.attention["fp32"]["fwd"].seconds(work, dims), rel=0.02)
