"""The optimizer (AdamW, fixed hyper-parameters) and mixed precision (autocast, fp16 loss scale).

AdamW (Loshchilov & Hutter 2019) with Llama-2's settings (Touvron et al. 2023, Sec. 2.2:
beta1 0.9, beta2 0.95, eps 1e-5, weight decay 0.1, peak learning rate 3e-4), held constant
(no warm-up or decay: the executor measures steps, it does not train to convergence).
Weight decay applies to matrices and embeddings only (ndim >= 2), not to norms and biases
(Megatron-LM convention). No gradient clipping.

``AdamW`` below is the update of ``torch.optim.AdamW(foreach=False)`` written out: the same
arithmetic per parameter whichever subset of parameters an instance holds (ZeRO partitions),
and no ``torch.optim`` import -- its first construction imports TorchDynamo, which costs each
rank seconds of start-up.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

LEARNING_RATE = 3e-4
BETAS = (0.9, 0.95)
EPS = 1e-5
WEIGHT_DECAY = 0.1

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class AdamW:
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019, Algorithm 2), with bias
    correction (Kingma & Ba 2015). State per parameter: ``step`` (a float tensor, as torch's),
    ``exp_avg`` and ``exp_avg_sq``."""

    def __init__(self, param_groups: list[dict], lr: float, betas: tuple[float, float], eps: float):
        self.param_groups = param_groups
        self.lr, self.betas, self.eps = lr, betas, eps
        self.state: dict[torch.nn.Parameter, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state.get(p)
                if state is None:
                    state = self.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                             "exp_avg_sq": torch.zeros_like(p)}
                state["step"] += 1
                step = state["step"].item()
                grad, exp_avg, exp_avg_sq = p.grad, state["exp_avg"], state["exp_avg_sq"]
                if group["weight_decay"]:
                    p.mul_(1 - self.lr * group["weight_decay"])
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step_size = self.lr / (1 - beta1 ** step)
                denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** step)).add_(self.eps)
                p.addcdiv_(exp_avg, denom, value=-step_size)


def make_adamw(params: list[torch.nn.Parameter]) -> AdamW:
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    return AdamW([g for g in groups if g["params"]], lr=LEARNING_RATE, betas=BETAS, eps=EPS)


def autocast_factory(dtype: str, device: torch.device):
    """A zero-argument function returning the forward's autocast context (a no-op for fp32).
    Parameters and gradients stay fp32; matmuls run in ``dtype``."""
    if dtype == "fp32":
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[dtype])


@dataclass
class LossScaler:
    """Dynamic loss scaling for fp16 (Micikevicius et al. 2018): scale the loss, unscale the
    gradients, skip the step and halve the scale on inf/nan (agreed by all ranks), double it
    after ``growth_interval`` clean steps. Constants are torch.amp.GradScaler's defaults."""

    enabled: bool
    scale: float = 2.0 ** 16
    growth_interval: int = 2000
    good_steps: int = 0

    def multiplier(self) -> float:
        return self.scale if self.enabled else 1.0

    def unscale_and_check(self, params: list[torch.nn.Parameter], group) -> bool:
        """Divide gradients by the scale; True if every rank's gradients are finite."""
        if not self.enabled:
            return True
        found_inf = torch.zeros(1, device=params[0].device if params else "cpu")
        for p in params:
            if p.grad is not None:
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                g.mul_(1.0 / self.scale)
                if not torch.isfinite(g).all():
                    found_inf.fill_(1.0)
        if group is not None:   # every rank must agree to skip
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=group)
        return found_inf.item() == 0

    def update(self, finite: bool) -> None:
        if not self.enabled:
            return
        if not finite:
            self.scale /= 2.0
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps % self.growth_interval == 0:
            self.scale *= 2.0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])
