"""The H200 run of 2026-11-30 (``h200_s71/``), priced with its calibration's composition terms
as they were written (raised to the lone layer probe, ``layer_terms.at_least_the_layer``) and
as the calibration now derives them from the same measurements (``layer_terms.refit_data``:
on CUDA the lone layer is no floor). Prints, per plan of the two models the calibration never
saw, the measured and predicted step time, and the median forward / backward / optimizer of
one microbatch from the executor's trace beside the simulator's. Runs on a CPU in ~10 s.

    .venv/bin/python studies/gpu_check/composition.py [--run studies/gpu_check/h200_s71]
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import pandas as pd
import yaml

from parsim.calibration.layer_terms import refit_data
from parsim.sim import simulate
from parsim.specs import cluster_from_dict, parse_plan

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# (model, rounds file, prefix of its plans' traces)
RUNS = [("studies/gpu_h100/gpt3-1.3b-flash.yaml", "rounds_1.3b_flash.csv", "1.3b"),
        ("gpt3-350m", "rounds_350m.csv", "350m")]
KINDS = ("F", "B", "optimizer")


def medians(events) -> dict[str, float]:
    """Median seconds of each action kind in ``KINDS`` among ``events`` ((kind, seconds) pairs)."""
    by = defaultdict(list)
    for kind, seconds in events:
        by[kind].append(seconds)
    return {k: statistics.median(by[k]) for k in KINDS if by[k]}


def measured_kinds(path: Path) -> dict[str, float]:
    data = json.loads(path.read_text())
    col = {c: i for i, c in enumerate(data["columns"])}
    return medians((e[col["kind"]], e[col["end"]] - e[col["start"]]) for e in data["events"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", type=Path, default=HERE / "h200_s71", help="the run's folder [h200_s71]")
    args = p.parse_args(argv)
    written = yaml.safe_load((args.run / "profile.yaml").read_text())
    forms = {"as written": written, "refitted": refit_data(written)}
    for name, data in forms.items():
        c = data["device"]["extra"]["layer_composition"]
        print(f"{name:10s}: fwd x{c['fwd']:.3f}, at least {c.get('per_op_fwd_s', 0) * 1e6:.0f} us/op; "
              f"bwd x{c['bwd']:.3f}, at least {c.get('per_op_bwd_s', 0) * 1e6:.0f} us/op")
    print(f"\n{'model':5s} {'plan':34s} {'measured':>9s} " + " ".join(f"{n:>16s}" for n in forms)
          + "   per microbatch, measured / " + " / ".join(forms) + " (ms)")
    errors: dict[str, dict[str, list[float]]] = {n: defaultdict(list) for n in forms}
    for model, rounds_csv, prefix in RUNS:
        rounds = pd.read_csv(args.run / rounds_csv)
        for i, (plan, g) in enumerate(rounds.groupby("plan", sort=False)):
            measured = statistics.median(g.step_time_s)
            kinds = [measured_kinds(args.run / "traces" / f"{prefix}_plan{i:02d}.json")]
            cells = []
            for name, data in forms.items():
                res = simulate(str(ROOT / model) if model.endswith(".yaml") else model,
                               cluster_from_dict(data, num_devices=1), parse_plan(plan))
                errors[name][prefix].append(res.step_time_s / measured - 1)
                cells.append(f"{res.step_time_s * 1e3:7.1f} {errors[name][prefix][-1]:+7.1%}")
                kinds.append(medians((e.kind, e.duration) for e in res.trace.events))
            parts = " ".join(f"{k} " + "/".join(f"{x[k] * 1e3:.1f}" for x in kinds) for k in KINDS)
            short = plan.replace("dp=1 tp=1 pp=1 ", "").replace(" schedule=1f1b", "")
            print(f"{prefix:5s} {short:34s} {measured * 1e3:7.1f}ms " + " ".join(cells) + "   " + parts)
    print()
    for name, per in errors.items():
        print(f"{name:10s}: MAPE " + ", ".join(f"{m} {statistics.mean(map(abs, e)):.1%} ({len(e)} plans)"
                                               for m, e in per.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
