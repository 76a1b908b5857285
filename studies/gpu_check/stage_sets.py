"""Which synthetic stages should a CUDA calibration fit its composition on? The H200 run
``h200_s71c/`` timed, beside the quick calibration's four CUDA stages, two deeper host-bound
ones (``stage-deep``: 8 flash layers of hidden 1024; ``stage-deep-explicit``: 6 explicit-attention
layers), then ran three plans of gpt3-1.3b (flash) and gpt3-350m (explicit) on the same machine.
This refits the composition (``layer_terms.refit_data``) on subsets of those stages and prices
the plans with each: step time, and the median forward / backward of a microbatch against the
executor's trace. Runs on a CPU in ~5 s.

    .venv/bin/python studies/gpu_check/stage_sets.py [--run studies/gpu_check/h200_s71c]
"""
from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path

import pandas as pd
import yaml

from composition import RUNS, ROOT, measured_kinds, medians
from parsim.calibration.layer_terms import refit_data
from parsim.sim import simulate
from parsim.specs import cluster_from_dict, parse_plan

HERE = Path(__file__).resolve().parent
QUICK = ["stage-gelu", "stage-llama", "stage-wide", "stage-reference"]      # grid.STAGES["cuda"], quick
DEEP = ["stage-deep", "stage-deep-explicit"]
SETS = {"quick four": QUICK, "all six": QUICK + DEEP, "quick + deep": QUICK + DEEP[:1],
        "wide, deep, ref": ["stage-wide", *DEEP, "stage-reference"]}


def refit_on(profile: dict, names: list[str]) -> dict:
    """``profile`` with its composition refitted on the stages named ``names`` alone."""
    data = copy.deepcopy(profile)
    probes = data["device"]["extra"]["stage_probes"]
    probes["stages"] = [s for s in probes["stages"] if s["spec"]["name"] in names]
    return refit_data(data)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", type=Path, default=HERE / "h200_s71c", help="the run's folder [h200_s71c]")
    args = p.parse_args(argv)
    profile = yaml.safe_load((args.run / "profile.yaml").read_text())
    forms = {name: refit_on(profile, names) for name, names in SETS.items()}
    for name, data in forms.items():
        c, r = data["device"]["extra"]["layer_composition"], data["device"]["extra"]["fit_report"]
        print(f"{name:16s} fwd x{c['fwd']:.3f} >= {c.get('per_op_fwd_s', 0) * 1e6:3.0f} us/op, bwd x{c['bwd']:.3f} >= "
              f"{c.get('per_op_bwd_s', 0) * 1e6:3.0f} us/op; leave-one-stage-out median "
              f"{r['composition.fwd']['median']:.1%} fwd, {r['composition.bwd']['median']:.1%} bwd")
    print("\nstep error (microbatch forward, backward) per stage set")
    for model, rounds_csv, prefix in RUNS:
        for i, (plan, g) in enumerate(pd.read_csv(args.run / rounds_csv).groupby("plan", sort=False)):
            measured = statistics.median(g.step_time_s)
            kinds = measured_kinds(args.run / "traces" / f"{prefix}_plan{i:02d}.json")
            short = plan.replace("dp=1 tp=1 pp=1 ", "").replace(" schedule=1f1b", "")
            cells = []
            for name, data in forms.items():
                res = simulate(str(ROOT / model) if model.endswith(".yaml") else model,
                               cluster_from_dict(data, num_devices=1), parse_plan(plan))
                sim = medians((e.kind, e.duration) for e in res.trace.events)
                cells.append(f"{name}: {res.step_time_s / measured - 1:+.0%} "
                             f"({sim['F'] / kinds['F'] - 1:+.0%}, {sim['B'] / kinds['B'] - 1:+.0%})")
            print(f"{prefix:5s} {short:12s} {measured * 1e3:6.1f} ms | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
