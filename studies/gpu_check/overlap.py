"""The H200 run of 2026-11-29 (``h200_overlap/``) priced with the layer composition in its two
forms: the one its quick calibration fitted (a factor on every op: the host's time and the
kernels' add) and the overlapped one (``LayerComposition.overlap``: an op takes the longer of
its kernels and its host's issue time), refitted from the same stages. The quick calibration's
CUDA stages all ran at their host's pace, which cannot tell the two forms apart; the device-bound
stage now in ``calibration.grid.STAGES`` was not yet in it. Here one measured executor
microbatch (``microbatches.csv``: gpt3-1.3b at mbs 2, forward and backward of the whole model:
one stage) stands in for it; that plan is marked and left out of the errors. Runs on a CPU.

    .venv/bin/python studies/gpu_check/overlap.py [--stage-plan "mbs=2 gbs=16"]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
from pathlib import Path

import pandas as pd
import yaml

from parsim.calibration.layer_terms import refit_data
from parsim.sim import simulate
from parsim.specs import cluster_from_dict, load_model, parse_plan

HERE = Path(__file__).resolve().parent / "h200_overlap"
ROOT = HERE.parents[2]
RUNS = [("studies/gpu_h100/gpt3-1.3b-flash.yaml", "rounds_1.3b_flash.csv"), ("gpt3-350m", "rounds_350m.csv")]


def overlapped(profile: dict, stage: pd.Series) -> dict:
    """``profile`` with its stages marked overlapped, one executor microbatch added as a stage,
    and its layer terms refitted (``layer_terms.refit_data``)."""
    data = copy.deepcopy(profile)
    probes = data["device"]["extra"]["stage_probes"]
    probes["overlap"] = True
    spec = dataclasses.asdict(load_model(str(ROOT / stage.model) if stage.model.endswith(".yaml") else stage.model))
    probes["stages"].append({"spec": spec, "mbs": parse_plan(stage.plan).mbs, "fwd_s": float(stage.fwd_s),
                             "bwd_s": float(stage.bwd_s)})
    return refit_data(data)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage-plan", default="mbs=2 gbs=16", help="the gpt3-1.3b plan whose microbatch is the stage")
    args = p.parse_args(argv)
    profile = yaml.safe_load((HERE / "profile.yaml").read_text())
    profile["device"]["default_stack"] = "torch-cuda"      # what a CUDA calibration now writes
    micro = pd.read_csv(HERE / "microbatches.csv")
    pick = micro[micro.model.str.contains("1.3b") & micro.plan.str.contains(args.stage_plan, regex=False)].iloc[0]
    forms = {"factor (as fitted)": profile, "overlapped": overlapped(profile, pick)}
    for name, data in forms.items():
        comp = data["device"]["extra"]["layer_composition"]
        report = data["device"]["extra"]["fit_report"]
        print(f"{name}: fwd x{comp['fwd']:.3f} + {comp.get('per_op_fwd_s', 0) * 1e6:.0f} us/op, bwd x{comp['bwd']:.3f} + "
              f"{comp.get('per_op_bwd_s', 0) * 1e6:.0f} us/op; leave-one-stage-out median "
              f"{report['composition.fwd']['median']:.1%} fwd, {report['composition.bwd']['median']:.1%} bwd")
    print(f"\n{'model':10s} {'plan':44s} {'measured':>9s} " + " ".join(f"{n:>18s}" for n in forms))
    errors: dict[str, dict[str, list[float]]] = {n: {} for n in forms}
    for model, rounds_csv in RUNS:
        rounds = pd.read_csv(HERE / rounds_csv)
        short = Path(model).stem.replace("-flash", "")
        for plan, g in rounds.groupby("plan", sort=False):
            measured = statistics.median(g.step_time_s)
            p_ = parse_plan(plan)
            cells = []
            stage = short.startswith("gpt3-1.3b") and plan == pick.plan
            for name, data in forms.items():
                pred = simulate(str(ROOT / model) if model.endswith(".yaml") else model,
                                cluster_from_dict(data, num_devices=p_.world_size), p_).step_time_s
                cells.append(f"{pred * 1e3:8.1f} {pred / measured - 1:+7.1%}")
                if not stage:
                    errors[name].setdefault(short, []).append(abs(pred / measured - 1))
            plan_short = plan.replace("dp=1 tp=1 pp=1 ", "").replace(" schedule=1f1b", "")
            print(f"{short:10s} {plan_short + (' (the stage)' if stage else ''):44s} {measured * 1e3:7.1f}ms "
                  + " ".join(f"{c:>18s}" for c in cells))
    print()
    for name, per in errors.items():
        print(f"{name}: MAPE " + ", ".join(f"{m} {statistics.mean(e):.1%} ({len(e)})" for m, e in per.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
