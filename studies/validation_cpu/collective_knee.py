"""Do a collective's bytes cost more past a message size on this kind of host, and does the
calibration's knee (``calibration.fit.fit_alpha_beta_knee``) predict the sizes it did not see
better than one line?

Reads the back-to-back points every kept profile under ``studies/`` recorded
(``network.collectives.<op>.<ranks>.points``: bytes, time -- the median of its samples up to
profile format 10, their mean from 11 --, p10, p90) and, per profile and collective, prints
the leave-one-size-out median |error| of one line (alpha + beta x) and of the knee fit, and
the knee it finds on all sizes. With ``--reprice RUN_DIR`` it also prices the run's measured
plans with its profile as written and with its collectives refitted so (the in-situ latencies
moved by the bytes time's change at their size), side by side.

    .venv/bin/python studies/validation_cpu/collective_knee.py > collective_knee.txt     # ~2 s
    .venv/bin/python studies/validation_cpu/collective_knee.py --reprice studies/validation_cpu/heldout/run_20261127c
"""
from __future__ import annotations

import argparse
import copy
import csv
import statistics
import tempfile
import warnings
from pathlib import Path

import numpy as np
import yaml

from parsim.calibration.fit import AlphaBeta, fit_alpha_beta, fit_alpha_beta_knee
from parsim.calibration.surface_fit import leave_out

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = Path(__file__).parent / "heldout"


def errors(points: list) -> tuple[float, float, AlphaBeta]:
    p = np.array(points, dtype=float)
    x, t = p[:, 0], p[:, 1]
    line = leave_out(len(x), lambda i: fit_alpha_beta(x[i], t[i]), lambda ab, i: ab.time(x[i]), t, folds=len(x))
    knee = leave_out(len(x), lambda i: fit_alpha_beta_knee(x[i], t[i]), lambda ab, i: ab.time(x[i]), t, folds=len(x))
    return line.median, knee.median, fit_alpha_beta_knee(x, t)


def survey() -> None:
    print(f"{'profile':58} {'line':>6} {'knee':>6}  knees on all sizes (op.ranks@size, slope past it / below)")
    for path in sorted(ROOT.glob("studies/**/profile.yaml")):
        entries = (yaml.safe_load(path.read_text()).get("network") or {}).get("collectives") or {}
        rows = [(f"{op}.{n}", *errors(e["points"])) for op, per in entries.items() for n, e in per.items()
                if len(e.get("points") or ()) >= 6]
        if rows:
            knees = " ".join(f"{k}@{f.knee / 2**20:g}M x{f.beta_beyond / f.beta:.1f}" for k, _, _, f in rows if f.knee)
            print(f"{str(path.relative_to(ROOT / 'studies'))[:58]:58} {statistics.median(r[1] for r in rows):6.1%} "
                  f"{statistics.median(r[2] for r in rows):6.1%}  {knees}")


def refitted(profile: dict) -> dict:
    """``profile`` with every collective refitted from its points with the knee."""
    out = copy.deepcopy(profile)
    for per in out["network"]["collectives"].values():
        for e in per.values():
            if len(e.get("points") or ()) < 6:
                continue
            p = np.array(e["points"], dtype=float)
            ab = fit_alpha_beta_knee(p[:, 0], p[:, 1])

            def moved(alpha: float, points: list, e=e, ab=ab) -> float:
                x = points[0][0]      # the in-situ probe's one size
                return float(max(0.0, alpha + e["beta"] * x - (ab.time(x) - ab.alpha)))
            if e.get("alpha_insitu") is not None:
                e["alpha_insitu"] = moved(e["alpha_insitu"], e["insitu_points"])
            for h, a in (e.get("alpha_insitu_shared") or {}).items():
                e["alpha_insitu_shared"][h] = moved(a, e["insitu_shared_points"][str(h)])
            e.update(alpha=float(ab.alpha), beta=float(ab.beta))
            if ab.knee is not None:
                e.update(knee=float(ab.knee), beta_beyond=float(ab.beta_beyond))
    return out


def reprice(run: Path) -> None:
    from parsim.sim import simulate
    from parsim.specs import load_cluster, load_model, parse_plan
    new = Path(tempfile.mkdtemp()) / "profile.yaml"
    new.write_text(yaml.safe_dump(refitted(yaml.safe_load((run / "profile.yaml").read_text()))))
    errs: dict[str, list] = {"as written": [], "refitted": []}
    for table in sorted([*run.glob("*/validation.csv"), *run.glob("validation.csv")]):
        for row in csv.DictReader(table.open()):
            if not row.get("measured_step_s"):
                continue
            plan, own = parse_plan(row["plan"]), HELDOUT / f"model_{table.parent.name}.yaml"
            model = load_model(own if own.exists() else row["model"])
            pair = [simulate(model, load_cluster(f"cpu:{plan.world_size}", profile=p), plan,
                             record_events=False).step_time_s / float(row["measured_step_s"]) - 1
                    for p in (run / "profile.yaml", new)]
            for k, e in zip(errs, pair):
                errs[k].append(e)
            print(f"  {model.name[:14]:14} {row['plan'][:68]:68} {pair[0]:+6.1%} -> {pair[1]:+6.1%}")
    for k, v in errs.items():
        print(f"{k}: {len(v)} plans, step |error| median {statistics.median(map(abs, v)):.1%}, "
              f"max {max(map(abs, v)):.1%}, mean {statistics.mean(v):+.1%}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reprice", type=Path, help="a run folder with profile.yaml and validation.csv files")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    reprice(args.reprice) if args.reprice else survey()
