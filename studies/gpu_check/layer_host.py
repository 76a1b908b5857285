"""Where a GPU layer's time goes in the executor's eager PyTorch: the host's issue time against
the device's kernel time, per pass, for the layers of the one-GPU validation models and of the
calibration's synthetic stages.

    python studies/gpu_check/layer_host.py [--out layer_host.json] [--device cuda]

Per (model, micro-batch size), the executor's own ``Block`` (``executor.layer_probe.layer_step``)
and a stage of ``CHAIN`` such layers:

* ``synced_{fwd,bwd}_s``: one layer's pass with the device synchronised before and after
  (what the calibration's layer probe times);
* ``host_{fwd,bwd}_s``: the same pass's host time alone: the call returns once every kernel is
  queued (an empty queue at the start; the backward's call returns when autograd has issued
  its last kernel);
* ``chain_{fwd,bwd}_s``: a pass over ``CHAIN`` layers in a row, synchronised only at its ends,
  per layer (a training pass, where the host runs ahead of the device across layers);
* ``kernels``: the profiler's device time per kernel name over one forward and backward of one
  layer, and ``aten_ops``: the host's op calls in it.

Medians of ``REPEATS`` after ``WARMUP`` passes; seconds. On a CPU (``--device cpu``) host and
device are one, and the numbers only check that the script runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

WARMUP, REPEATS, CHAIN = 3, 10, 6
CASES = [("gpt3-350m", 1), ("gpt3-350m", 4), ("studies/gpu_h100/gpt3-1.3b-flash.yaml", 1),
         ("studies/gpu_h100/gpt3-1.3b-flash.yaml", 4)]


def _kernels(forward, backward, sync) -> dict:
    """The profiler's device seconds per kernel name (the 40 longest) over one forward and
    backward, the kernels launched, and the host's aten op calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        forward()
        backward()
        sync()
    kernels, aten = {}, 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] = kernels.get(e.name, 0.0) + e.device_time_total * 1e-6
        elif e.name.startswith("aten::"):
            aten += 1
    return {"kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:40]), "aten_ops": aten,
            "kernel_count": sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)}


def _chain(spec, mbs: int, held_dtype: str, device, region, sync) -> dict:
    """Per layer, the forward and backward of ``CHAIN`` layers in a row, synchronised only at
    their ends (the host runs ahead of the device across layers)."""
    import torch

    from parsim.executor.layer_probe import TORCH_DTYPES
    from parsim.executor.model import StageModule
    from parsim.executor.weights import init_stage

    stage = StageModule(replace(spec, layers=CHAIN), 0, CHAIN, is_first=False, is_last=False)
    init_stage(stage, seed=0)
    stage.to(device=device, dtype=TORCH_DTYPES[held_dtype])
    x = torch.randn(mbs, spec.seq_len, spec.hidden, dtype=TORCH_DTYPES[held_dtype], device=device).requires_grad_(True)
    dy = torch.randn_like(x)
    chain = {"fwd": [], "bwd": []}
    for i in range(WARMUP + REPEATS // 2):
        sync()
        t0 = time.perf_counter()
        with region():
            y = stage(x)
        sync()
        t1 = time.perf_counter()
        y.backward(dy)
        sync()
        t2 = time.perf_counter()
        if i >= WARMUP:
            chain["fwd"].append((t1 - t0) / CHAIN)
            chain["bwd"].append((t2 - t1) / CHAIN)
        del y
    return {"chain_fwd_s": statistics.median(chain["fwd"]), "chain_bwd_s": statistics.median(chain["bwd"])}


def measure(spec, mbs: int, dtype: str, device, profile: bool, autocast: bool = False) -> dict:
    """One case's row; with ``autocast`` the layer holds fp32 parameters and its forward runs
    under ``torch.autocast(dtype)``, as the executor runs a 16-bit plan (else every tensor is in
    ``dtype``, as the calibration's layer probe builds it)."""
    import contextlib

    import torch

    from parsim.executor.layer_probe import TORCH_DTYPES, layer_step

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    held_dtype = "fp32" if autocast else dtype
    region = ((lambda: torch.autocast(device_type=device.type, dtype=TORCH_DTYPES[dtype])) if autocast
              else contextlib.nullcontext)
    plain_forward, backward, _module = layer_step(spec, mbs, held_dtype, device)

    def forward():
        with region():
            return plain_forward()

    def pass_times(fn) -> tuple[float, float]:
        sync()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        sync()
        return time.perf_counter() - t0, t1 - t0

    synced = {"fwd": [], "bwd": []}
    host = {"fwd": [], "bwd": []}
    for i in range(WARMUP + REPEATS):
        for name, fn in (("fwd", forward), ("bwd", backward)):
            s, h = pass_times(fn)
            if i >= WARMUP:
                synced[name].append(s)
                host[name].append(h)
    out = {"model": spec.name, "mbs": mbs, "dtype": dtype, "autocast": autocast}
    for name in ("fwd", "bwd"):
        out[f"synced_{name}_s"] = statistics.median(synced[name])
        out[f"host_{name}_s"] = statistics.median(host[name])
    if profile:
        out.update(_kernels(forward, backward, sync))
    del forward, plain_forward, backward, _module
    out.update(_chain(spec, mbs, held_dtype, device, region, sync))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    from parsim.calibration.grid import STAGES
    from parsim.specs import load_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="layer_host.json")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    cases = [(load_model(m), mbs) for m, mbs in CASES] + [(s, mbs) for s, mbs in STAGES[device.type]]
    if device.type == "cpu":     # a check that it runs: small shapes only
        cases = [(s, mbs) for s, mbs in STAGES["cpu"]]
    rows = []
    modes = [False, True] if args.dtype != "fp32" else [False]
    for (spec, mbs), autocast in ((case, mode) for case in cases for mode in modes):
        row = measure(spec, mbs, args.dtype, device, profile=True, autocast=autocast)
        rows.append(row)
        print(f"{row['model']:18s} mbs {mbs} {'autocast' if autocast else 'plain':8s}  fwd synced {row['synced_fwd_s'] * 1e3:7.3f} host "
              f"{row['host_fwd_s'] * 1e3:7.3f} chain {row['chain_fwd_s'] * 1e3:7.3f} ms | bwd synced "
              f"{row['synced_bwd_s'] * 1e3:7.3f} host {row['host_bwd_s'] * 1e3:7.3f} chain "
              f"{row['chain_bwd_s'] * 1e3:7.3f} ms | kernels {row['kernel_count']} aten {row['aten_ops']}", flush=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(0) if device.type == "cuda"
                                          else "cpu", "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
