"""``make gpu-check``: is parsim ready for GPUs? On a CUDA machine: a quick calibration of the
machine (its grid of shapes, no model named: what ``parsim calibrate`` does by default) with
``--device cuda``, then ``parsim validate`` on NCCL with that one profile -- dp=2, tp=2, pp=2 and
ZeRO-3 plans with two or more GPUs; with one, the one-GPU plans of two models the calibration
never saw (``studies/gpu_h100/matrix.yaml``, gpt3-350m, plus one that cannot fit on an 80 GB
card, to see it recorded as "did not fit"; ``matrix_1.3b.yaml``, gpt3-1.3b with fused
attention) -- and one report. Without a GPU it says so and exits 0.

    python studies/gpu_check/check.py [--out out/gpu_check] [--timeout 600] [--plans N] [--regimes]

Exit status: 0 when every stage ran (or there is no GPU), 1 when one failed (its output is
printed). The report is also written to ``OUT/report.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ONE_GPU_MATRIX = ROOT / "studies" / "gpu_h100" / "matrix.yaml"
ONE_GPU_MATRICES = [ONE_GPU_MATRIX, ROOT / "studies" / "gpu_h100" / "matrix_1.3b.yaml"]
# gpt3-350m with mbs=8 and no recomputation needs ~88 GiB (parsim memory): more than an 80 GB H100
TOO_BIG_FOR_ONE_GPU = "mbs=8 gbs=8"
MULTI_GPU_PLANS = ["dp=2 mbs=2 gbs=8", "tp=2 mbs=2 gbs=4", "pp=2 mbs=1 gbs=8", "dp=2 zero=3 mbs=2 gbs=8"]


def gpus() -> tuple[int, str]:
    """(CUDA devices torch sees, the first one's name); (0, why) without."""
    try:
        import torch
    except ImportError:
        return 0, "torch is not installed"
    if not torch.cuda.is_available():
        return 0, "torch.cuda.is_available() is False"
    return torch.cuda.device_count(), torch.cuda.get_device_name(0)


def parsim(args: list[str], timeout_s: float) -> tuple[int, str, str, float]:
    """Run ``python -m parsim ARGS``: (exit code, stdout, stderr, seconds)."""
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "parsim", *args], capture_output=True, text=True,
                              timeout=timeout_s, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start
    except subprocess.TimeoutExpired as e:
        text = [x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr)]
        return 124, text[0], text[1] + f"\n(timed out after {timeout_s:.0f} s)", timeout_s


def write_matrices(n: int, memory_gib: float, out: Path, one_gpu: list[Path] | None = None,
                   plans: int | None = None) -> list[Path]:
    """The matrices to validate: NCCL plans with 2+ GPUs; else the one-GPU ones (``one_gpu``,
    in that order; the plan that cannot fit added to gpt3-350m's where the card has under 88 GiB);
    with ``plans``, each matrix's first that many."""
    if n >= 2:
        matrices = [{"description": "gpu-check: NCCL plans on 2 GPUs", "model": "gpt3-125m", "steps": 6,
                     "warmup": 2, "rounds": 1, "plans": MULTI_GPU_PLANS}]
    else:
        matrices = [yaml.safe_load(path.read_text()) for path in (one_gpu or ONE_GPU_MATRICES)]
        for matrix in matrices:
            matrix.update(description="gpu-check: " + matrix["description"], rounds=1, steps=6, warmup=2)
            if memory_gib < 88 and matrix["model"] == "gpt3-350m":
                matrix["plans"].append(TOO_BIG_FOR_ONE_GPU)
    paths = []
    for i, matrix in enumerate(matrices):
        matrix["plans"] = matrix["plans"][:plans]
        paths.append(out / f"matrix{i}.yaml")
        paths[-1].write_text(yaml.safe_dump(matrix, sort_keys=False))
    return paths


def report_lines(device: str, n: int, calibration: dict, validation: dict) -> list[str]:
    dev = calibration.get("profile", {}).get("device", {})
    lines = [f"gpu-check on {n} x {device}",
             f"calibration: {calibration.get('duration_s', 0):.0f} s; peak "
             + ", ".join(f"{k} {v / 1e12:.0f} TFLOP/s" for k, v in dev.get("peak_flops", {}).items())
             + f"; memory-bound {dev.get('memory_bandwidth', 0) / 1e9:.0f} GB/s"]
    for op, per in calibration.get("collectives", {}).items():
        for ranks, fit in per.items():
            bandwidth = f"{1 / fit['beta'] / 1e9:.1f} GB/s" if fit["beta"] > 0 else "no bandwidth term (beta <= 0)"
            lines.append(f"  {op} on {ranks} GPUs: alpha {fit['alpha'] * 1e6:.1f} us, {bandwidth}")
    lines.append(f"{'plan':52s} {'measured ms':>12s} {'predicted ms':>13s} {'error':>7s} {'meas GiB':>9s} "
                 f"{'pred GiB':>9s}")
    for r in validation.get("rows", []):
        lines.append(f"{r['plan'][:52]:52s} {r['measured_step_s'] * 1e3:12.1f} {r['predicted_step_s'] * 1e3:13.1f} "
                     f"{r['step_error']:+7.1%} {r['measured_peak_bytes'] / 2**30:9.2f} "
                     f"{r['predicted_peak_bytes'] / 2**30:9.2f}")
    for r in validation.get("did_not_fit", []):
        said = {True: "predicted to fit", False: "predicted not to fit"}.get(r.get("predicted_fits"), "")
        lines.append(f"{r['plan'][:52]:52s} did not fit ({said}, {r['predicted_peak_bytes'] / 2**30:.1f} GiB): "
                     f"{r['outcome'].split(': ', 1)[-1][:90]}")
    if validation.get("rows"):
        lines.append(f"MAPE step time {validation['mape_step_time']:.1%}, peak memory "
                     f"{validation['mape_peak_memory']:.1%} over {len(validation['rows'])} plans")
    return lines


def validation_lines(validation: dict) -> list[str]:
    """The per-plan lines of one matrix (``report_lines`` without the calibration's)."""
    return report_lines("", 0, {}, validation)[2:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="out/gpu_check", help="output folder [out/gpu_check]")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds for the calibration (a third at most) and the validations together")
    p.add_argument("--plans", type=int, default=None, help="validate each matrix's first N plans [all]")
    p.add_argument("--regimes", action="store_true",
                   help="then time the stages' regimes (stage_regimes.py, up to 4 minutes more) into "
                        "OUT/stage_regimes.json")
    p.add_argument("--matrices", nargs="+", type=Path, default=None,
                   help="one-GPU matrices to validate, in this order [studies/gpu_h100/matrix.yaml "
                        "studies/gpu_h100/matrix_1.3b.yaml]")
    args = p.parse_args(argv)
    n, device = gpus()
    if n == 0:
        print(f"gpu-check: needs a CUDA GPU ({device}); nothing to check here")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ranks = "2" if n >= 2 else "1"
    deadline = time.monotonic() + args.timeout    # the validations share what the calibration leaves
    import torch
    memory_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    base = "h200" if "H200" in device else "h100-sxm"    # what one GPU cannot measure: links, host
    code, stdout, stderr, secs = parsim(["calibrate", "--device", "cuda", "--quick", "--ranks", ranks, "--base",
                                         base, "--dtype", "bf16", "--name", "gpu-check",
                                         "--out", str(out / "profile.yaml"), "--json"], args.timeout / 3)
    if code != 0:
        print(f"gpu-check: calibration failed (exit {code}, {secs:.0f} s):\n{stderr[-3000:]}")
        return 1
    calibration = json.loads(stdout)
    print(f"calibrated in {secs:.0f} s: {out / 'profile.yaml'}", flush=True)
    lines, validations, failed = report_lines(device, n, calibration, {})[:-1], [], False
    matrices = write_matrices(n, memory_gib, out, args.matrices, args.plans)
    for i, matrix in enumerate(matrices):
        code, stdout, stderr, secs = parsim(["validate", "--matrix", str(matrix), "--profile",
                                             str(out / "profile.yaml"), "--out", str(out / f"validation{i}"),
                                             "--fresh", "--worst", "0", "--json"],
                                            max(1.0, deadline - time.monotonic()))
        if code != 0:
            print(f"gpu-check: validation of {matrix.name} failed (exit {code}, {secs:.0f} s):\n{stderr[-3000:]}")
            failed = True
            continue
        validations.append(json.loads(stdout))
        model = yaml.safe_load(matrix.read_text())["model"]
        lines += [f"model {model}"] + validation_lines(validations[-1]) + [f"validated in {secs:.0f} s"]
        print("\n".join(lines[-len(validation_lines(validations[-1])) - 2:]), flush=True)
    if args.regimes:
        try:        # ~1-2 minutes on an H200; not counted in --timeout
            proc = subprocess.run([sys.executable, str(HERE / "stage_regimes.py"), "--out",
                                   str(out / "stage_regimes.json")], text=True, capture_output=True, timeout=240)
            lines += ["stage regimes (stage_regimes.py):"] + proc.stdout.splitlines() + proc.stderr.splitlines()[-5:]
            failed |= proc.returncode != 0
        except subprocess.TimeoutExpired:
            lines.append("stage regimes: timed out after 240 s")
            failed = True
    print("\n".join(lines))
    (out / "report.json").write_text(json.dumps({"gpus": n, "device": device, "calibration": calibration,
                                                 "validations": validations, "report": lines}, indent=1,
                                                default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
