"""Which form of the composition terms predicts stages the calibration never ran?

``parsim calibrate`` prices a stage op by op, then composes: measured = c x priced + tau x ops
per pass (``calibration.surface_fit.fit_composition``), fitted over its synthetic stages
(``calibration.grid.STAGES``). Those stages all run 16-24 ops in 12-20 ms, so a factor c and a
per-op term tau are hard to tell apart on them. This script times, alone in this process
(``calibration.stages.bench_stage``, as the calibration times its stages), one wider synthetic
stage and the held-out models' whole stages, and prints what each form -- factor only, per-op
only, both -- fitted with and without the wide stage predicts for the held-out ones.

    .venv/bin/python studies/validation_cpu/composition_check.py --profile P.yaml [--rounds 3]

P: a profile of this machine from ``parsim calibrate`` (no ``--model``). A timing script: run
it on an idle machine (about 2 minutes).
"""
from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from parsim.calibration.grid import _stage
from parsim.calibration.layer_terms import stage_prices
from parsim.calibration.stages import bench_stage
from parsim.calibration.timer import Clock
from parsim.specs import load_cluster, load_model, model_from_dict

HELDOUT = Path(__file__).parent / "heldout"
WIDE = (_stage("stage-wide", 1, 1024, 16, 4096, 256, 2048, flash_attention=True), 2)
TESTS = [(load_model(str(HELDOUT / "model_gpt.yaml")), 2), (load_model(str(HELDOUT / "model_llama.yaml")), 1),
         (load_model(str(HELDOUT / "model_deep.yaml")), 1), (load_model("cpu-small"), 1)]


def fit(form: str, priced: np.ndarray, ops: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    """(c, tau) of one form by least squares (tau >= 0)."""
    if form == "factor":
        return float(priced @ measured / (priced @ priced)), 0.0
    if form == "per-op":
        return 1.0, max(float((measured - priced) @ ops / (ops @ ops)), 0.0)
    c, tau = np.linalg.lstsq(np.stack([priced, ops], 1), measured, rcond=None)[0]
    return float(c), max(float(tau), 0.0)


def stage_setup():
    """(arguments --profile and --rounds, the profile's device, the same without its composition
    terms), with the executor's host-memory policy and one thread, as the calibration times stages."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("PARSIM_HOST_MEMORY", "keep")
    from parsim.executor.host_alloc import apply_host_memory_policy
    apply_host_memory_policy()
    torch.set_num_threads(1)
    device = load_cluster("cpu:1", profile=args.profile).device
    return args, device, replace(device, tables=device.tables.replace(layer_composition=None))


def main() -> None:
    args, device, raw = stage_setup()
    rows = []       # name, role, {pass: (priced s, ops, measured s)}
    for s in device.tables.stage_probes.stages:
        spec = model_from_dict(s.spec)
        p = stage_prices(raw, "fp32", spec, int(s.mbs))
        rows.append((spec.name, "fit", {k: (p[k][0], p[k][1], float(getattr(s, f"{k}_s"))) for k in ("fwd", "bwd")}))
    clock = Clock(torch.device("cpu"))
    timed = [(WIDE[0], WIDE[1], "wide")] + [(spec, mbs, "test") for spec, mbs in TESTS]
    samples = {spec.name: ([], []) for spec, _, _ in timed}
    for _ in range(args.rounds):             # rounds alternate the models: a slow minute hits all of them
        for spec, mbs, _ in timed:
            f, b = bench_stage(spec, mbs, "fp32", clock, repeats=5)
            samples[spec.name][0].append(f.median)
            samples[spec.name][1].append(b.median)
    print(f"{'stage':16s} {'ops':>4s} {'priced F ms':>11s} {'alone F ms':>10s} {'priced B ms':>11s} {'alone B ms':>10s}")
    for spec, mbs, role in timed:
        p = stage_prices(raw, "fp32", spec, mbs)
        f, b = (statistics.median(x) for x in samples[spec.name])
        rows.append((spec.name, role, {"fwd": (p["fwd"][0], p["fwd"][1], f), "bwd": (p["bwd"][0], p["bwd"][1], b)}))
        print(f"{spec.name:16s} {p['fwd'][1]:4d} {p['fwd'][0] * 1e3:11.1f} {f * 1e3:10.1f} {p['bwd'][0] * 1e3:11.1f} "
              f"{b * 1e3:10.1f}")
    print(f"\nprediction errors of the held-out stages ({', '.join(s.name for s, _ in TESTS)}) "
          f"and the profile's own composition {device.tables.layer_composition}")
    for k in ("fwd", "bwd"):
        for with_wide in (False, True):
            used = [r[2][k] for r in rows if r[1] == "fit" or (with_wide and r[1] == "wide")]
            priced, ops, measured = (np.array([u[i] for u in used], float) for i in range(3))
            for form in ("factor", "per-op", "both"):
                c, tau = fit(form, priced, ops, measured)
                errors = [(c * r[2][k][0] + tau * r[2][k][1]) / r[2][k][2] - 1 for r in rows if r[1] == "test"]
                print(f"{k} {'with' if with_wide else 'without':7s} the wide stage  {form:6s} c {c:5.3f} tau "
                      f"{tau * 1e6:6.1f} us  errors {' '.join(f'{e:+6.1%}' for e in errors)}  "
                      f"mean |error| {np.mean(np.abs(errors)):.1%}")


if __name__ == "__main__":
    main()
