"""The held-out validation against issue 20's targets: every plan of the three models'
``validation.csv`` under a folder, pooled.

    .venv/bin/python studies/validation_cpu/heldout/summary.py [FOLDER]

Targets: step-time |error| median <= 5% and max <= 12%, Spearman rho >= 0.9 over the plans'
step times, peak memory within 3% on every plan, no systematic sign (at most 2/3 of the plans
on one side); the calibration's own leave-out report (``fit_report``) median <= 5%.
"""
from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

MODELS = ("gpt", "llama", "deep")


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(x):
            j = i
            while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / ((sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5 or 1.0)


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
    lines = [f"{'model':14s} {'ranks':>5s} {'plan':62s} {'measured s':>10s} {'error':>7s} {'anchored':>8s} {'memory':>7s}"]
    for r in rows:
        anchored = f"{float(r['anchored_error']):+8.1%}" if r.get("anchored_error") else f"{'-':>8s}"
        lines.append(f"{r['model']:14s} {r['world_size']:>5s} {r['plan'].replace(' dtype=fp32', '')[:62]:62s} "
                     f"{float(r['measured_step_s']):10.3f} {float(r['step_error']):+7.1%} {anchored} "
                     f"{float(r['max_rank_memory_error']):7.1%}")
    for label, key in (("profile", "step_error"), ("anchored", "anchored_error")):
        errs = [float(r[key]) for r in rows if r.get(key)]
        if len(errs) != len(rows):
            continue
        pred_col = "predicted_step_s" if key == "step_error" else "anchored_step_s"
        rho = spearman([float(r["measured_step_s"]) for r in rows], [float(r[pred_col]) for r in rows])
        under = sum(e < 0 for e in errs)
        lines += ["", f"{label}: {len(rows)} plans over {len({r['model'] for r in rows})} models; "
                      f"|step error| median {statistics.median(map(abs, errs)):.1%} (target <= 5%), "
                      f"max {max(map(abs, errs)):.1%} (<= 12%); Spearman rho {rho:.3f} (>= 0.9); "
                      f"{under} under / {len(errs) - under} over (at most 2/3 on one side)"]
    mem = [float(r["max_rank_memory_error"]) for r in rows]
    lines.append(f"peak memory: max |error| over ranks and plans {max(mem):.1%}; "
                 f"{sum(m <= 0.03 for m in mem)}/{len(mem)} plans within 3%")
    prof = folder / "profile.yaml"
    if prof.exists():
        report = yaml.safe_load(prof.read_text())["device"]["extra"].get("fit_report", {})
        if report:
            meds = [v["median"] for v in report.values()]
            lines.append(f"calibration fit report: {len(report)} tables, median of their leave-out medians "
                         f"{statistics.median(meds):.1%} (target <= 5%); worst "
                         + ", ".join(f"{k} {v['median']:.1%}" for k, v in
                                     sorted(report.items(), key=lambda kv: -kv[1]["median"])[:3]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(summarise(Path(args[0]) if args else Path(__file__).parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
