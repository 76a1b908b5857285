"""Per-round step-time error of a validation run: every executor run in ``rounds.csv`` against
the profile's prediction of its plan and against the prediction anchored to that run's own
layer probes (``parsim.calibration.anchor.anchored_profile``). The table in ``validation.csv``
compares medians over rounds; this shows how well each prediction follows single runs.

    .venv/bin/python studies/validation_cpu/per_round.py [--out studies/validation_cpu] [--profile P]
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path


def main() -> int:
    from parsim.sim import simulate
    from parsim.specs import cluster_from_dict, load_model, load_profile_dict, parse_plan
    from parsim.calibration.anchor import anchored_profile
    from parsim.study.validate import load_matrix

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="studies/validation_cpu")
    ap.add_argument("--profile", default="calibration/profiles/cpu-calibrated.yaml")
    args = ap.parse_args()
    out = Path(args.out)
    prof = load_profile_dict(args.profile)
    model = load_matrix(out / "matrix.yaml").model
    with (out / "validation.csv").open() as f:
        predicted = {r["plan"]: float(r["predicted_step_s"]) for r in csv.DictReader(f)}
    errors: dict[int, dict[str, list[float]]] = {}
    with (out / "rounds.csv").open() as f:
        for r in csv.DictReader(f):
            probes = json.loads(r.get("layer_probes") or "[]")
            if not probes or r["plan"] not in predicted:
                continue
            plan = parse_plan(r["plan"])
            cluster = cluster_from_dict(anchored_profile(prof, probes), plan.world_size)
            anchored = simulate(model, cluster, plan, mode="full").step_time_s
            measured = float(r["step_time_s"])
            mine = errors.setdefault(plan.world_size, {"anchored": [], "profile": []})
            mine["anchored"].append(abs(anchored / measured - 1))
            mine["profile"].append(abs(predicted[r["plan"]] / measured - 1))
    for w, e in sorted(errors.items()):
        print(f"{w} ranks, per round ({len(e['anchored'])} runs): anchored |error| median "
              f"{statistics.median(e['anchored']):.1%}, max {max(e['anchored']):.1%}; profile's median "
              f"{statistics.median(e['profile']):.1%}, max {max(e['profile']):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
