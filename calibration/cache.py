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

The operands are views into one buffer of random numbers per dtype and device
(``OperandPool``), each set at its own offset: filling fresh tensors with ``torch.randn`` for
every rotation cost more than half of a quick calibration here (21 of 38 s: 0.7 GB/s of
normal draws into newly faulted pages, for ~16 GB of copies), while what a GEMM's time depends
on is that its operands are distinct memory spanning twice the cache, not that their values
differ. Offsets are aligned to 64 bytes, torch's CPU allocator alignment.

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


def cache_levels(device: torch.device) -> tuple[int, ...]:
    """Bytes of each data (or unified) cache level >= 2 serving one core of a CPU, smallest
    first, from sysfs (one instance each: a per-core L2, the shared L3); () for CUDA devices and
    where sysfs says nothing."""
    if device.type == "cuda":
        return ()
    sizes: dict[int, int] = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip() if (index / "type").exists() else "Unified"
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if level < 2 or kind == "Instruction":
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        sizes[level] = max(sizes.get(level, 0), int(size[:-1] if size[-1:] in "KMG" else size) * scale)
    return tuple(sizes[k] for k in sorted(sizes))


def llc_bytes(device: torch.device) -> int:
    """Bytes of the last-level cache serving ``device``."""
    if device.type == "cuda":
        size = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        return size or DEFAULT_LLC_BYTES
    return max(cache_levels(device), default=0) or DEFAULT_LLC_BYTES


def copies_for(set_bytes: float, device: torch.device) -> int:
    """Operand sets to rotate over so that they span twice the last-level cache (1 when one
    set alone does), at most ``MAX_COPIES``."""
    return max(1, min(MAX_COPIES, math.ceil(2 * llc_bytes(device) / max(set_bytes, 1.0))))


ALIGN_BYTES = 64
NORMAL_BLOCK = 2**22      # elements drawn; the pool repeats them (a copy runs ~3x faster than drawing)


def _normal(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``numel`` standard-normal numbers: one block of ``NORMAL_BLOCK`` draws, repeated."""
    block = torch.randn(min(numel, NORMAL_BLOCK), dtype=dtype, device=device)
    return block.repeat(-(-numel // block.numel()))[:numel]


class OperandPool:
    """Random operands carved from one normal-distributed buffer per dtype on ``device``.

    ``take`` hands out consecutive, non-overlapping views, each aligned to ``ALIGN_BYTES``;
    ``reserve`` makes the next ``numel`` elements one contiguous stretch (back to the start, or
    a larger buffer), so the sets of one rotation never alias one another. Operands are read,
    never written, by the ops timed on them; the buffer holds at least twice the last-level
    cache, so a rotation that spans that much is cold."""

    def __init__(self, device: torch.device):
        self.device = device
        # a rotation spans less than twice the cache plus one set: room for sets up to half the cache
        self.floor_bytes = int(2.5 * llc_bytes(device))
        self._buffers: dict[torch.dtype, torch.Tensor] = {}
        self._cursor: dict[torch.dtype, int] = {}

    @staticmethod
    def aligned(numel: int, dtype: torch.dtype) -> int:
        """Elements ``numel`` occupies in the pool, rounded up to the alignment."""
        align = max(1, ALIGN_BYTES // dtype.itemsize)
        return -(-numel // align) * align

    def reserve(self, dtype: torch.dtype, numel: int) -> bool:
        """Make the next ``numel`` elements contiguous; True when views taken before may now alias
        the next ones (the cursor went back to the start or the buffer was replaced)."""
        buf = self._buffers.get(dtype)
        if buf is None or buf.numel() < numel:     # grown by doubling: a grid's sets grow in steps
            floor = -(-self.floor_bytes // dtype.itemsize)
            size = max(numel, floor, 2 * buf.numel() if buf is not None else 0)
            self._buffers[dtype] = _normal(size, dtype, self.device)
            self._cursor[dtype] = 0
            return False            # views taken before stay in the old buffer: no alias
        if self._cursor[dtype] + numel > buf.numel():
            self._cursor[dtype] = 0
            return True
        return False

    def take(self, shape: Sequence[int], dtype: torch.dtype, grad: bool = False) -> torch.Tensor:
        """A view of ``shape`` at the next free offset; ``grad``: a leaf that requires grad."""
        numel = math.prod(shape)
        room = self.aligned(numel, dtype)
        self.reserve(dtype, room)
        start = self._cursor[dtype]
        self._cursor[dtype] = start + room
        return self._buffers[dtype][start:start + numel].view(*shape).detach().requires_grad_(grad)

    def rotation(self, shapes: Sequence[Sequence[int]], dtype: torch.dtype) -> Callable[[], list[torch.Tensor]]:
        """A function returning the next of enough operand sets of ``shapes`` to span twice the
        last-level cache (``copies_for``): what a model pass finds, weights not in cache."""
        set_numel = sum(self.aligned(math.prod(s), dtype) for s in shapes)
        count = copies_for(set_numel * dtype.itemsize, self.device)
        self.reserve(dtype, count * set_numel)
        sets = cycle([[self.take(s, dtype) for s in shapes] for _ in range(count)])
        return lambda: next(sets)


class Evictor:
    """Sweeps a buffer of twice the last-level cache, so what a pass reads next comes from memory."""

    def __init__(self, device: torch.device):
        self.buffer = torch.zeros(2 * llc_bytes(device) // 4, dtype=torch.float32, device=device)

    def __call__(self) -> None:
        self.buffer.add_(1.0)
