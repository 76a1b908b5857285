"""Does drawing cold operands from one pool (``calibration.cache.OperandPool``) change what the
grid measures? The same GEMM shapes timed with fresh ``torch.randn`` operand copies per rotation
(how calibration drew them before) and with pool views, alternating in rounds, one thread.

    .venv/bin/python studies/calibration_pool/compare.py [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
import time
from itertools import cycle

import torch
import torch.nn.functional as F

from parsim.calibration.cache import OperandPool, copies_for
from parsim.calibration.timer import Clock, measure

SHAPES = [(128, 768, 256), (256, 2048, 512), (512, 512, 512), (1024, 3072, 768), (2048, 1024, 4096)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def fresh_rotation(shapes, dt, device):
    """The former ``cache.rotation``: every operand set a new ``torch.randn`` tensor."""
    first = [torch.randn(*s, dtype=dt, device=device) for s in shapes]
    count = copies_for(sum(t.numel() * t.element_size() for t in first), device)
    sets = cycle([first] + [[torch.randn(*s, dtype=dt, device=device) for s in shapes] for _ in range(count - 1)])
    return lambda: next(sets)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cpu")
    clock = Clock(device)
    print(f"{'dtype':5} {'m x n x k':>18} {'fresh ms':>9} {'pool ms':>9} {'pool/fresh':>10}   setup fresh / pool s")
    ratios = []
    for name, dt in DTYPES.items():
        for m, n, k in SHAPES:
            shapes = ((m, k), (n, k))
            t0 = time.perf_counter()
            fresh = fresh_rotation(shapes, dt, device)
            t1 = time.perf_counter()
            pooled = clock.pool.rotation(shapes, dt)
            t2 = time.perf_counter()
            a, b = [], []
            with torch.no_grad():
                for _ in range(args.rounds):
                    a.append(measure(lambda: F.linear(*fresh()), clock, 5, 0.3).median)
                    b.append(measure(lambda: F.linear(*pooled()), clock, 5, 0.3).median)
            fa, fb = statistics.median(a), statistics.median(b)
            ratios.append(fb / fa)
            print(f"{name:5} {f'{m} x {n} x {k}':>18} {fa * 1e3:9.3f} {fb * 1e3:9.3f} {fb / fa:10.3f}   "
                  f"{t1 - t0:.2f} / {t2 - t1:.2f}")
            del fresh
    print(f"median pool/fresh {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
