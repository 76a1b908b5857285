"""Do the calibration's synthetic stages run their ops at the pace the executor's microbatches
do? On the H200 runs of 2026-11-30 (README, "Deeper stages do not fix it") the stages' host
cost per priced op exceeded what gpt3-1.3b's and gpt3-350m's microbatches ran at. A stage is
timed pass by pass (``calibration.stages.bench_stage``: an L2 sweep, a synchronise, the pass, a
synchronise); the executor runs its passes back to back and reads CUDA events. This times each
CUDA stage (``grid.stages("cuda", quick=True)``) and the two models' whole microbatch at mbs 1
three ways on one machine:

* ``calibrated``: as ``bench_stage`` does;
* ``no sweep``: the same without the L2 sweep;
* ``back to back``: ``STEPS`` forward-backward steps with no synchronise between, each pass
  between CUDA events, as the executor's timeline reads them.

Medians, milliseconds. ~1-2 minutes on an H200; on a CPU (``--device cpu``) it runs the tiny
smoke case only, to check the script.

    python3 studies/gpu_check/stage_regimes.py [--device cuda] [--out stage_regimes.json]
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

WARMUP, REPEATS, STEPS = 2, 7, 7
MODELS = [("gpt3-350m", 1), ("studies/gpu_h100/gpt3-1.3b-flash.yaml", 1)]


def back_to_back(forward, backward, device) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of ``STEPS`` steps queued with no synchronise between them,
    each pass between two events recorded on the stream (host timestamps on a CPU)."""
    import torch

    cuda = device.type == "cuda"
    marks = []

    def mark():
        if not cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(WARMUP):
        forward()
        backward()
    sync()
    for _ in range(STEPS):
        start = mark()
        forward()
        middle = mark()
        backward()
        marks.append((start, middle, mark()))
    sync()
    span = (lambda x, y: x.elapsed_time(y) / 1e3) if cuda else (lambda x, y: y - x)
    return [span(a, b) for a, b, _ in marks], [span(b, c) for _, b, c in marks]


def one_case(spec, mbs: int, dtype: str, device) -> dict:
    from parsim.calibration.cache import Evictor
    from parsim.calibration.compute import pass_samples
    from parsim.calibration.stages import stage_step
    from parsim.calibration.timer import Clock

    clock = Clock(device)
    forward, backward, _ = stage_step(spec, mbs, dtype, device)
    row = {"stage": spec.name, "layers": spec.layers, "mbs": mbs}
    for name, before in (("calibrated", Evictor(device)), ("no_sweep", None)):
        f, b = pass_samples(forward, backward, clock, REPEATS, WARMUP, before_pass=before)
        row[name] = [statistics.median(f), statistics.median(b)]
    f, b = back_to_back(forward, backward, device)
    row["back_to_back"] = [statistics.median(f), statistics.median(b)]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--out", type=Path, default=Path("stage_regimes.json"))
    args = p.parse_args(argv)
    import torch

    from parsim.calibration.grid import stages
    from parsim.specs import load_model

    if args.device == "cuda" and not torch.cuda.is_available():
        print("stage_regimes: needs a CUDA GPU (or --device cpu for the smoke case)")
        return 0
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
        cases = [(replace(load_model("tiny"), name="tiny", flash_attention=True), 1)]
    else:
        cases = [(s, m) for s, m in stages("cuda", quick=True)]
        cases += [(load_model(str(ROOT / m) if m.endswith(".yaml") else m), b) for m, b in MODELS]
    rows = []
    print(f"{'stage':18s} {'L':>3s} {'mbs':>3s}  {'calibrated fwd/bwd':>20s} {'no sweep':>16s} {'back to back':>16s}  ms")
    for spec, mbs in cases:
        row = one_case(spec, mbs, args.dtype, device)
        rows.append(row)
        cells = "  ".join(f"{row[k][0] * 1e3:7.2f} /{row[k][1] * 1e3:7.2f}" for k in ("calibrated", "no_sweep", "back_to_back"))
        print(f"{row['stage'][:18]:18s} {row['layers']:3d} {mbs:3d}  {cells}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    args.out.write_text(json.dumps({"device": str(torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"),
                                    "torch": torch.__version__, "dtype": args.dtype, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
