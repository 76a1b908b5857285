"""Cold operands: what an op costs when its inputs are not already in the last-level cache.

A micro-benchmark that calls one op on the same tensors over and over finds them in cache
after the first call; inside a training pass each layer's weights were last touched a whole
pass ago (and AdamW has streamed every parameter and state since), so they come from memory.
On this project's 2-core VM a 128 x 768 x 256 ``F.linear`` ran 20% slower rotating over 157 MB
of weights than on one hot weight, and the machine grid's times would price small models'
GEMMs too fast by that much. So the grid's ops rotate over copies of their operands whose
footprint is at least twice the last-level cache (``rotation``), and the synthetic stages
sweep a buffer of that size before each timed pass (``Evictor``): what is measured is the
cold op, as a model pass runs it.

Last-level cache: sysfs on Linux CPUs (``/sys/devices/system/cpu/cpu0/cache/index*/``), the
L2 of a CUDA device (``torch.cuda.get_device_properties``); 32 MiB where unknown.
"""
from __future__ import annotations

import math
from itertools import cycle
from pathlib import Path
from typing import Callable, Sequence

import torch

DEFAULT_LLC_BYTES = 32 * 2**20
MAX_COPIES = 64


def llc_bytes(device: torch.device) -> int:
    """Bytes of the last-level cache serving ``device``."""
    if device.type == "cuda":
        size = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        return size or DEFAULT_LLC_BYTES
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        value = int(size[:-1] if size[-1:] in "KMG" else size) * scale
        if level >= 2:
            best = max(best, value)
    return best or DEFAULT_LLC_BYTES


def copies_for(set_bytes: float, device: torch.device) -> int:
    """Operand sets to rotate over so that they span twice the last-level cache (1 when one
    set alone does), at most ``MAX_COPIES``."""
    return max(1, min(MAX_COPIES, math.ceil(2 * llc_bytes(device) / max(set_bytes, 1.0))))


def rotation(make: Callable[[], Sequence[torch.Tensor]], device: torch.device) -> Callable[[], Sequence[torch.Tensor]]:
    """A function returning the next of enough operand sets (``make()`` each) to be cold."""
    first = make()
    count = copies_for(sum(t.numel() * t.element_size() for t in first), device)
    sets = cycle([first] + [make() for _ in range(count - 1)])
    return lambda: next(sets)


class Evictor:
    """Sweeps a buffer of twice the last-level cache, so what a pass reads next comes from memory."""

    def __init__(self, device: torch.device):
        self.buffer = torch.zeros(2 * llc_bytes(device) // 4, dtype=torch.float32, device=device)

    def __call__(self) -> None:
        self.buffer.add_(1.0)
