"""The held-out validation against issue 20's targets: every plan of the six models'
``validation.csv`` under a folder, pooled (runs before 2026-11-29 17:00 hold the first three,
before 2026-12-03 20:00 the first five).

    .venv/bin/python studies/validation_cpu/heldout/summary.py [FOLDER]

Targets: step-time |error| median <= 5% and max <= 12%, Spearman rho >= 0.9 over the plans'
step times, peak memory within 3% on every plan, no systematic sign (at most 2/3 of the plans
on one side); the calibration's own leave-out report (``fit_report``) median <= 5%. A folder
whose plans train in more than one dtype (bf16 and fp32 side by side) gets the step-time
targets per dtype.
"""
from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from parsim.study.validate import spearman_rho

MODELS = ("gpt", "llama", "deep", "wide", "long", "drop")


def summarise(folder: Path) -> str:
    import yaml

    rows = []
    for m in MODELS:
        path = folder / m / "validation.csv"
        if path.exists():
            with path.open(newline="") as f:
                rows += [dict(r, model_key=m) for r in csv.DictReader(f)]
    if not rows:
        return f"no validation.csv under {folder}/{{{','.join(MODELS)}}}"
    dtypes = sorted({dtype_of(r["plan"]) for r in rows})
    lines = [f"{'model':14s} {'ranks':>5s} {'plan':62s} {'measured s':>10s} {'error':>7s} {'anchored':>8s} {'memory':>7s}"]
    for r in rows:
        anchored = f"{float(r['anchored_error']):+8.1%}" if r.get("anchored_error") else f"{'-':>8s}"
        plan = (f"{dtype_of(r['plan'])} " if len(dtypes) > 1 else "") + r["plan"].replace(" dtype=fp32", "")
        lines.append(f"{r['model']:14s} {r['world_size']:>5s} {plan[:62]:62s} "
                     f"{float(r['measured_step_s']):10.3f} {float(r['step_error']):+7.1%} {anchored} "
                     f"{float(r['max_rank_memory_error']):7.1%}")
    for dtype in dtypes:
        group = [r for r in rows if dtype_of(r["plan"]) == dtype]
        lines += step_targets(group, f" ({dtype})" if len(dtypes) > 1 else "")
    mem = [float(r["max_rank_memory_error"]) for r in rows]
    lines += ["", f"peak memory: {sum(m <= 0.03 for m in mem)}/{len(mem)} plans within 3%"]
    lines += target_lines([("|peak memory error| max over plans and ranks", max(mem), 0.03, "%")])
    prof = folder / "profile.yaml"
    if prof.exists():
        report = yaml.safe_load(prof.read_text())["device"]["extra"].get("fit_report", {})
        if report:
            meds = [v["median"] for v in report.values()]
            lines += ["", f"calibration fit report: {len(report)} fits; worst "
                          + ", ".join(f"{k} {v['median']:.1%}" for k, v in
                                      sorted(report.items(), key=lambda kv: -kv[1]["median"])[:3])]
            lines += target_lines([("leave-out median (median over fits)", statistics.median(meds), 0.05, "%")])
    return "\n".join(lines)


def dtype_of(plan: str) -> str:
    """The plan's training dtype: its ``dtype=`` key, else the default (``specs.Plan``)."""
    from parsim.specs import parse_plan
    return parse_plan(plan).dtype


def step_targets(rows: list[dict], suffix: str = "") -> list[str]:
    """The step-time targets over ``rows``, as predicted by the profile and drift-anchored."""
    lines = []
    for label, key in (("profile", "step_error"), ("anchored", "anchored_error")):
        errs = [float(r[key]) for r in rows if r.get(key)]
        if len(errs) != len(rows):
            continue
        pred_col = "predicted_step_s" if key == "step_error" else "anchored_step_s"
        rho = spearman_rho([float(r["measured_step_s"]) for r in rows], [float(r[pred_col]) for r in rows])
        under = sum(e < 0 for e in errs)
        lines += ["", f"{label}{suffix}: {len(rows)} plans over {len({r['model'] for r in rows})} models, "
                      f"{'/'.join(sorted({r['world_size'] for r in rows}))} ranks"]
        lines += target_lines([("|step error| median", statistics.median(map(abs, errs)), 0.05, "%"),
                               ("|step error| max", max(map(abs, errs)), 0.12, "%"),
                               ("Spearman rho", rho, 0.9, "rho"),
                               ("plans on one side", max(under, len(errs) - under) / len(errs), 2 / 3, "%")])
    return lines


def target_lines(checks: list[tuple[str, float, float, str]]) -> list[str]:
    """One line per target: the value, the target and whether it is met (rho: at least the
    target; the others: at most)."""
    out = []
    for name, value, target, unit in checks:
        met = value >= target if unit == "rho" else value <= target
        shown = f"{value:.3f} (target >= {target})" if unit == "rho" else f"{value:.1%} (target <= {target:.0%})"
        out.append(f"  {name:46s} {shown:28s} {'met' if met else 'NOT MET'}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(summarise(Path(args[0]) if args else Path(__file__).parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
