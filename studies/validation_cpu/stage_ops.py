"""What does a stage cost beyond its ops, and does it follow the ops torch runs? Per stage (the
profile's synthetic stages, a wide one and the held-out models' whole stages, as
``composition_check.py`` times them): the aten ops its forward and backward dispatch (counted
by a ``TorchDispatchMode``), the simulator's price of the pass without the composition terms,
the time measured alone (median of 3 alternating rounds of ``calibration.stages.bench_stage``),
and the difference per aten op.

    .venv/bin/python studies/validation_cpu/stage_ops.py --profile P.yaml > stage_ops.txt     # ~1 min

P: a profile of this machine from ``parsim calibrate``. A timing script: run it on an idle machine.
"""
from __future__ import annotations

import statistics

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from composition_check import TESTS, WIDE, stage_setup
from parsim.calibration.layer_terms import stage_prices
from parsim.calibration.stages import bench_stage, stage_step
from parsim.calibration.timer import Clock
from parsim.specs import model_from_dict


class CountOps(TorchDispatchMode):
    """Counts the aten ops dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def counted(fn) -> int:
    with CountOps() as mode:
        fn()
    return mode.ops


def main() -> None:
    args, device, raw = stage_setup()
    stages = [(model_from_dict(s.spec), int(s.mbs)) for s in device.tables.stage_probes.stages] + [WIDE, *TESTS]
    clock = Clock(torch.device("cpu"))
    ops = {}
    for spec, mbs in stages:
        fwd, bwd, _ = stage_step(spec, mbs, "fp32", clock.device)
        for _ in range(2):
            fwd()
            bwd()
        ops[spec.name] = (counted(fwd), counted(bwd))
    samples = {spec.name: ([], []) for spec, _ in stages}
    for _ in range(args.rounds):            # rounds alternate the stages: a slow minute hits all of them
        for spec, mbs in stages:
            f, b = bench_stage(spec, mbs, "fp32", clock, repeats=5)
            samples[spec.name][0].append(f.median)
            samples[spec.name][1].append(b.median)
    print(f"{'stage':16} {'L':>2} {'h':>5} {'s':>4} {'mbs':>3} | pass {'aten':>5} {'priced ms':>9} {'alone ms':>8} "
          f"{'extra ms':>8} {'us/aten':>7}")
    for spec, mbs in stages:
        prices = stage_prices(raw, "fp32", spec, mbs)
        for i, pass_ in enumerate(("fwd", "bwd")):
            alone, priced, n = statistics.median(samples[spec.name][i]), prices[pass_][0], ops[spec.name][i]
            extra = alone - priced
            print(f"{spec.name:16} {spec.layers:2d} {spec.hidden:5d} {spec.seq_len:4d} {mbs:3d} | {pass_}  {n:5d} "
                  f"{priced * 1e3:9.1f} {alone * 1e3:8.1f} {extra * 1e3:8.1f} {extra / n * 1e6:7.1f}")


if __name__ == "__main__":
    main()
