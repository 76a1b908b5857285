"""The model's initial weights: a function of (parameter name, seed) only, so every plan and
every rank starts from the same values, built without the module's default initialisation and
drawn in place (``blank_stage``, ``fill_parameters``)."""
from __future__ import annotations

import math

import torch

from parsim.specs import ModelSpec

from .model import StageModule, canonical_name


def init_std(name: str, spec: ModelSpec) -> float:
    """Normal(0, 0.02) weights; residual output projections scaled by 1/sqrt(2 L) (GPT-2,
    Radford et al. 2019, Sec. 2.3)."""
    if name.endswith(("attn.o.weight", "mlp.down.weight")):
        return 0.02 / math.sqrt(2 * spec.layers)
    return 0.02


def fill_canonical(out: torch.Tensor, name: str, spec: ModelSpec, seed: int) -> None:
    """Write the initial value of parameter ``name`` into ``out`` (a contiguous fp32 CPU tensor of
    its shape), in place. A function of (name, seed) only, so every plan starts from the same
    weights and every rank can build just the tensors it holds: Normal(0, 1) draws from the
    parameter's own generator, scaled by ``init_std`` (the same draws and products as
    ``randn(shape) * std``, without a second full-size tensor: one pass, no new pages)."""
    if name.endswith(("norm.weight",)):
        out.fill_(1.0)
    elif name.endswith(".bias"):
        out.zero_()
    else:
        gen = torch.Generator().manual_seed((seed * 1_000_003 + _stable_hash(name)) % 2**63)
        out.normal_(0.0, 1.0, generator=gen).mul_(init_std(name, spec))


def _stable_hash(text: str) -> int:
    import zlib
    return zlib.crc32(text.encode())


def blank_stage(spec: ModelSpec, first_layer: int, num_layers: int, is_first: bool, is_last: bool) -> StageModule:
    """A ``StageModule`` on the CPU whose parameters hold no values yet: built on the meta device
    and given storage, so ``nn.Linear``'s default initialisation -- a pass of the random
    generator over every weight, which every caller then overwrites -- never runs (the module
    holds no buffers). Every parameter must be written before use (``init_stage``)."""
    with torch.device("meta"):
        stage = StageModule(spec, first_layer, num_layers, is_first=is_first, is_last=is_last)
    return stage.to_empty(device="cpu")


# Parameters drawn on threads above this many elements: each has its own generator, so the
# values do not depend on the order (torch's CPU ops release the GIL while they run). A
# 1.3B model's draws take ~17 s of one core (2-vCPU AMD EPYC VM, 2026-11-30).
PARALLEL_INIT_ELEMENTS = 1 << 25


def fill_parameters(params: list[tuple[torch.Tensor, str]], spec: ModelSpec, seed: int) -> None:
    """``fill_canonical`` on each (tensor, canonical name), on up to 8 threads when they hold more
    than ``PARALLEL_INIT_ELEMENTS`` elements together and the host has cores to spare."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    def fill(p: torch.Tensor, name: str) -> None:
        if p.device.type == "cpu" and p.dtype == torch.float32 and p.is_contiguous():
            fill_canonical(p, name, spec, seed)
        else:       # a module moved or cast before its init: draw on the CPU in fp32, then copy
            value = torch.empty(p.shape)
            fill_canonical(value, name, spec, seed)
            p.copy_(value)

    workers = min(8, os.cpu_count() or 1)
    data = [(p.detach(), name) for p, name in params]     # grad mode is per thread: write the storage
    if workers < 2 or sum(p.numel() for p, _ in data) < PARALLEL_INIT_ELEMENTS:
        for p, name in data:
            fill(p, name)
        return
    with ThreadPoolExecutor(workers) as pool:
        # the largest first, so no thread is left with a vocabulary-sized tensor at the end
        for done in [pool.submit(fill, p, name) for p, name in sorted(data, key=lambda x: -x[0].numel())]:
            done.result()


def init_stage(stage: StageModule, seed: int) -> None:
    fill_parameters([(p, canonical_name(name, stage.spec)) for name, p in stage.named_parameters()], stage.spec, seed)


def initialised_stage(spec: ModelSpec, first_layer: int, num_layers: int, is_first: bool, is_last: bool,
                      seed: int) -> StageModule:
    """``blank_stage`` with its canonical initial weights (``init_stage``)."""
    stage = blank_stage(spec, first_layer, num_layers, is_first, is_last)
    init_stage(stage, seed)
    return stage


def build_full_model(spec: ModelSpec, seed: int) -> StageModule:
    """The whole model on one device (the reference)."""
    return initialised_stage(spec, 0, spec.layers, True, True, seed)
