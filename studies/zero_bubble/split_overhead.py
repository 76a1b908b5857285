"""What running a stage's backward split into I and W costs over running it whole, on this CPU.

Question: the CPU validation prices the zero-bubble family's I + W at what the fused backward B
costs (``costs.split_backward``: B = I + W, op by op), yet its traces read the split stages'
W 20 % over the price while I and 1F1B's B read 5-10 % under (``validation_intel_final``). Does
torch 2.13's split itself cost more than B, and how does that grow with the layers of a stage?

Method: the executor's own stage (``parsim.executor.model.StageModule``, tp=1, mbs=1, fp32, one
thread) of L = 1, 2, 3, 4, 6 layers of three models; each repeat runs, for every L in turn, a
forward then the fused backward (``Tensor.backward``), and a forward then the split one as the
executor runs the zero-bubble schedules (``executor.split_backward``: torch's
``stage_backward_input`` then ``stage_backward_weight``), each pass timed: the loop ``parsim
calibrate`` runs at 1 and 4 layers (``calibration.compute.split_samples``). Medians over 16
repeats after 4 warm-up ones. ``extra`` = I + W - B; a least-squares fit extra(L) = a L + b L^2
separates a cost per layer from one that grows with the layers below each weight group
(``stage_backward_weight`` calls ``autograd.grad`` once per parameter group, and the engine's
dependency pass walks the retained graph reachable from that group's outputs, i.e. the layers
below it too).

    OMP_NUM_THREADS=1 .venv/bin/python studies/zero_bubble/split_overhead.py > studies/zero_bubble/split_overhead.txt

About a minute on a 2-vCPU VM; nothing else should run meanwhile (it is a timing study).
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from parsim.calibration.compute import split_samples  # noqa: E402
from parsim.calibration.timer import Clock  # noqa: E402
from parsim.specs import load_model  # noqa: E402

MODELS = ("cpu-small", "studies/validation_cpu/heldout/model_deep.yaml",
          "studies/validation_cpu/heldout/model_llama.yaml")
LAYERS = (1, 2, 3, 4, 6)
REPEATS, WARMUP = 16, 4


def measure(spec) -> dict[int, dict[str, float]]:
    """{L: {"B", "I", "W": median seconds}} for stages of L layers of ``spec`` (the calibration's
    own loop, ``calibration.compute.split_samples``: the stages in turn within each repeat)."""
    samples = split_samples(spec, 1, "fp32", Clock(torch.device("cpu")), LAYERS, REPEATS, WARMUP)
    return {n: {k: statistics.median(v) for k, v in per.items()} for n, per in samples.items()}


def main() -> None:
    torch.set_num_threads(1)
    print(f"split backward (I, then W) against the fused backward B, one thread, fp32, mbs=1; medians of {REPEATS}")
    print(f"{'model':14} {'L':>2} {'B ms':>7} {'I ms':>7} {'W ms':>7} {'I+W-B ms':>9} {'(I+W)/B':>8}")
    for name in MODELS:
        spec = load_model(str(ROOT / name) if name.endswith(".yaml") else name)
        res = measure(spec)
        extra = np.array([res[n]["I"] + res[n]["W"] - res[n]["B"] for n in LAYERS])
        for n, e in zip(LAYERS, extra):
            r = res[n]
            print(f"{spec.name:14} {n:2d} {r['B'] * 1e3:7.1f} {r['I'] * 1e3:7.1f} {r['W'] * 1e3:7.1f} {e * 1e3:9.2f} "
                  f"{(r['I'] + r['W']) / r['B']:8.3f}")
        ls = np.array(LAYERS, dtype=float)
        (a, b), *_ = np.linalg.lstsq(np.stack([ls, ls ** 2], axis=1), extra, rcond=None)
        per_layer_b = statistics.median(res[n]["B"] / n for n in LAYERS)
        print(f"{spec.name:14} fit extra(L) = a L + b L^2: a = {a * 1e3:.2f} ms ({a / per_layer_b:.0%} of a "
              f"layer's B), "
              f"b = {b * 1e3:.2f} ms ({b / per_layer_b:.1%})")


if __name__ == "__main__":
    main()
