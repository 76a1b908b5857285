"""The single-process reference: a plain PyTorch training loop of the same model on the same
data (dp = tp = pp = 1, no pipeline runtime, no process group).

It is what the parallel plans must reproduce (loss-parity tests) and the baseline of the
executor-overhead study. The global batch is cut into microbatches of ``mbs`` and the
gradient accumulated with each microbatch loss divided by their number, as the executor does.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from parsim.specs import ModelSpec, Plan, load_model, parse_plan

from .data import make_source
from .model import canonical_name
from .optimizer import LossScaler, autocast_factory, make_adamw
from .weights import build_full_model


@dataclass
class ReferenceResult:
    losses: list[float]
    step_times: list[float]
    params: dict[str, torch.Tensor] = field(default_factory=dict)   # after the last step
    grads: dict[str, torch.Tensor] = field(default_factory=dict)    # of the first step


def run_reference(model: ModelSpec | str, plan: Plan | str, steps: int = 5, seed: int = 1234,
                  data_file: str | None = None) -> ReferenceResult:
    """Train the full model for ``steps`` steps with the plan's gbs, mbs and dtype."""
    spec, plan = load_model(model), parse_plan(plan)
    net = build_full_model(spec, seed)
    optimizer = make_adamw(list(net.parameters()))
    scaler = LossScaler(enabled=plan.dtype == "fp16")
    autocast = autocast_factory(plan.dtype, torch.device("cpu"))
    source = make_source(spec, seed, data_file)
    m = plan.gbs // plan.mbs
    losses, times = [], []
    for step in range(steps):
        batch = source.global_batch(step, plan.gbs)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        mb_losses = []
        for mb in batch.split(plan.mbs):
            with autocast():
                loss = net(mb[:, :-1], mb[:, 1:])
            (loss * (scaler.multiplier() / m)).backward()
            mb_losses.append(loss.detach())
        finite = scaler.unscale_and_check(list(net.parameters()), None)
        if step == 0:
            grads = {canonical_name(n, spec): p.grad.detach().clone() for n, p in net.named_parameters()}
        if finite:
            optimizer.step()
        scaler.update(finite)
        times.append(time.perf_counter() - start)
        losses.append(float(torch.stack(mb_losses).double().mean()))
    params = {canonical_name(n, spec): p.detach().clone() for n, p in net.named_parameters()}
    return ReferenceResult(losses=losses, step_times=times, params=params, grads=grads)


