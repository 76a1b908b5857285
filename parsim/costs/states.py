"""Bytes per parameter of the model states (params, grads, optimizer) on one device.

Model states per parameter (bytes), Megatron-LM conventions (docs, "distributed optimizer"):
    fp32 training:        param 4, grad 4, optimizer 8 (Adam m, v)
    bf16 mixed:           param 2, grad 4, optimizer 12 (fp32 master, m, v): Megatron-LM forces
                          gradient accumulation and all-reduce in fp32 for bf16
                          (arguments.py: "bfloat16 requires gradient accumulation and
                          all-reduce to be done in fp32")
    fp16 mixed:           param 2, grad 2, optimizer 12: fp16 gradients reduced in fp16, the
                          ZeRO paper's 16-byte convention (Rajbhandari et al. 2020, Sec. 3.1)
    16-bit by autocast:   param 4, grad 4, optimizer 8, as fp32: ``torch.autocast`` over fp32
                          parameters (the executor; ``Stack.autocast``, ``plan_state_bytes``)
ZeRO (Rajbhandari et al. 2020, Sec. 5): stage 1 shards the optimizer over the dp ranks,
stage 2 also the gradients, stage 3 also the parameters. ZeRO-Offload (Ren et al. 2021)
keeps optimizer states (and with "optimizer+params", parameters) in host memory.
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.specs import Plan, plan_stack

from . import footprint


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model-state category."""
    param: float
    grad: float
    optimizer: float


def state_bytes(dtype: str, autocast: bool = False) -> StateBytes:
    """Bytes per parameter under ``dtype`` (the module docstring); ``autocast``: a 16-bit run by
    ``torch.autocast`` over fp32 parameters (``Stack.autocast``, the executor), which hold the
    fp32 states of an fp32 run -- the parameters are the master weights."""
    if dtype == "fp32" or autocast:
        return StateBytes(4.0, 4.0, 8.0)
    if dtype == "fp16":
        return StateBytes(2.0, 2.0, 12.0)
    return StateBytes(2.0, 4.0, 12.0)


def zero_model_state_bytes(num_params: float, dp: int, zero: int, k: float = 12.0,
                           param_bytes: float = 2.0, grad_bytes: float = 2.0) -> float:
    """Per-device model-state bytes in the ZeRO paper's convention (Rajbhandari et al. 2020,
    Sec. 5 / Fig. 1): (2 + 2 + K) Psi for DP; (2 + 2 + K/Nd) Psi for P_os;
    (2 + (2 + K)/Nd) Psi for P_os+g; (2 + 2 + K) Psi / Nd for P_os+g+p (``footprint.model_states``
    of one parameter, times Psi)."""
    p, g, o = footprint.model_states(1.0, param_bytes, grad_bytes, k, dp, zero, False, False)
    return num_params * (p + g + o)


def plan_state_bytes(plan: Plan) -> StateBytes:
    """``state_bytes`` of the plan's dtype under its stack."""
    return state_bytes(plan.dtype, plan_stack(plan).autocast)


def model_state_bytes(n_params: float, plan: Plan, zero1_owned: float = -1.0) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes of ``n_params`` parameters on one device under the plan's
    dtype, ZeRO stage, offload and stack (``footprint.stack_state_bytes``, ``footprint.model_states``;
    ``zero1_owned``: the parameters the most-loaded replica owns where the stack's ZeRO-1 gives
    tensors whole, ``params.zero1_owned_params``)."""
    sb = plan_state_bytes(plan)
    stack = plan_stack(plan)
    param, grad, optimizer = footprint.stack_state_bytes(sb.param, sb.grad, sb.optimizer, plan.zero, stack.fp32_shards,
                                                         stack.grad_copy_bytes(plan.dtype))
    return footprint.model_states(n_params, param, grad, optimizer, plan.dp, plan.zero,
                                  plan.offload != "none", plan.offload == "optimizer+params",
                                  zero1_owned if stack.zero1_whole_tensors else -1.0)
