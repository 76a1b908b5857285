"""Each held-out model as one stage (embedding, every layer, head and loss; tp = pp = 1), its
forward and backward timed alone on one thread (``calibration.stages.bench_stage``, 3 x 5
samples) against what a profile prices it at (``calibration.layer_terms.stage_prices``), in fp32
and bf16: how far a plan's compute is off before any rank shares the host.

    .venv/bin/python studies/validation_cpu/heldout/stage_alone.py PROFILE [MODELS] > stage_alone.txt   # ~2 min

MODELS: comma-separated keys of ``model_*.yaml`` (default all five); ``MBS`` (env) the
microbatch size (1); ``DTYPES`` (env) which (``fp32,bf16``: on a CPU without bf16 units, such as
a Zen 3 EPYC, bf16 runs ~7x slower than fp32 and ``DTYPES=fp32`` saves minutes)."""
from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent


def main(profile: str, models: list[str], mbs: int, dtypes: list[str]) -> None:
    os.environ.setdefault("PARSIM_HOST_MEMORY", "keep")
    import torch

    from parsim.calibration.layer_terms import stage_prices
    from parsim.calibration.stages import bench_stage
    from parsim.calibration.timer import Clock
    from parsim.executor.host_alloc import apply_host_memory_policy
    from parsim.specs import load_cluster, load_model

    apply_host_memory_policy()      # as the executor's ranks
    torch.set_num_threads(1)
    device, clock = load_cluster("cpu:1", profile=profile).device, Clock(torch.device("cpu"))
    print(f"measured / priced ms (priced over measured - 1), mbs {mbs}, profile {profile}")
    for name in models:
        model = load_model(HERE / f"model_{name}.yaml")
        row = []
        for dtype in dtypes:
            fwd, bwd = [], []
            for _ in range(3):
                f, b = bench_stage(model, mbs, dtype, clock, 5)
                fwd.append(f.median)
                bwd.append(b.median)
            price = stage_prices(device, dtype, model, mbs)
            mf, mb = statistics.median(fwd), statistics.median(bwd)
            row.append(f"{dtype}: fwd {mf * 1e3:6.1f} / {price['fwd'][0] * 1e3:6.1f} ({price['fwd'][0] / mf - 1:+5.1%}) "
                       f"bwd {mb * 1e3:6.1f} / {price['bwd'][0] * 1e3:6.1f} ({price['bwd'][0] / mb - 1:+5.1%})")
        print(f"{name:6s} " + " | ".join(row), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    main(args[0], args[1].split(",") if len(args) > 1 else ["gpt", "llama", "deep", "wide", "long"],
         int(os.environ.get("MBS", "1")), os.environ.get("DTYPES", "fp32,bf16").split(","))
