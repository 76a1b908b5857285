"""The in-situ TP price, old reading against new, on the same measured steps.

A run of record's profile (calibrated with the in-situ probe read beyond the block at the host's
fair share, ``calibration.insitu``) prices every measured plan; then the same profile with its
in-situ keys (``alpha_insitu``, ``alpha_insitu_shared`` and their points) taken from OTHER, a
calibration of the same machine minutes apart with the probe read as before (each rank's wall
less its own compute). Only the TP plans move. Every ``*/validation.csv`` under RUN_DIR is
priced: a held-out model's (``model_<folder>.yaml``) or the preset its rows name.

    .venv/bin/python studies/validation_cpu/heldout/insitu_ab.py RUN_DIR OTHER_PROFILE.yaml   # ~3 s
"""
from __future__ import annotations

import copy
import csv
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

HERE = Path(__file__).parent
KEYS = ("alpha_insitu", "insitu_call", "insitu_points", "alpha_insitu_shared", "insitu_shared_points")


def with_insitu_of(profile: dict, other: dict) -> dict:
    """``profile`` with every collective entry's in-situ keys replaced by ``other``'s."""
    out = copy.deepcopy(profile)
    for op, per in out["network"]["collectives"].items():
        for ranks, entry in per.items():
            theirs = other["network"]["collectives"].get(op, {}).get(ranks, {})
            for key in KEYS:
                entry.pop(key, None)
                if key in theirs:
                    entry[key] = theirs[key]
    return out


def main(run: Path, other_path: Path) -> None:
    profile = yaml.safe_load((run / "profile.yaml").read_text())
    other = with_insitu_of(profile, yaml.safe_load(other_path.read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        old_path = Path(tmp) / "old.yaml"
        old_path.write_text(yaml.safe_dump(other))
        print(f"{'plan':58s} {'measured':>9s} {'new':>8s} {'old':>8s}")
        moved = {"new": [], "old": []}
        for table in sorted(run.glob("*/validation.csv")):
            own = HERE / f"model_{table.parent.name}.yaml"     # a held-out model, else the row's preset
            for row in csv.DictReader(table.open()):
                if not row.get("measured_step_s"):
                    continue
                model = load_model(own if own.exists() else row["model"])
                plan = parse_plan(row["plan"])
                measured = float(row["measured_step_s"])
                errors = {}
                for name, path in (("new", run / "profile.yaml"), ("old", old_path)):
                    cluster = load_cluster(f"cpu:{plan.world_size}", profile=path)
                    errors[name] = simulate(model, cluster, plan, record_events=False).step_time_s / measured - 1
                tag = f"{model.name.removeprefix('heldout-')} {row['plan'].replace(' dtype=fp32', '')}"
                print(f"{tag[:58]:58s} {measured * 1e3:7.0f}ms {errors['new']:+7.1%} {errors['old']:+7.1%}")
                if plan.tp > 1:
                    for name in moved:
                        moved[name].append(errors[name])
        for name, errs in moved.items():
            print(f"TP plans ({len(errs)}), {name} in-situ reading: mean {statistics.mean(errs):+.1%}, median |e| "
                  f"{statistics.median(map(abs, errs)):.1%}, max |e| {max(map(abs, errs)):.1%}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
