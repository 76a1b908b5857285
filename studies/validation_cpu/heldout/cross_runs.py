"""How much of a held-out run's error is its calibration, how much its measurements? Every run's
measured plans priced with every run's profile (today's simulator; no executor run).

    .venv/bin/python studies/validation_cpu/heldout/cross_runs.py RUN_DIR RUN_DIR ...   # ~2 s a run

Prints the matrix of step |error| median / max (rows: whose measurements, columns: whose
profile; the diagonal is each run as it was), then per plan the spread over the runs of its
measured step and of its predicted step (sd of log): two calibrations of the same machine
predict a plan that far apart, two runs of its executor measure it that far apart. A run's
level is the median over plans of its log step less the plan's mean over the runs. Last, what
each calibration read where a profile's level comes from (its synthetic stages' rounds, the real
layer alone, its composition factors, the 2-rank contention of the layer, the GEMM, the add and
AdamW), each as log less its mean over the runs, beside the level of the run's predictions, and
the correlation of each with that level over the runs."""
from __future__ import annotations

import csv
import math

import yaml
import statistics
import sys
from pathlib import Path

from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

HERE = Path(__file__).parent


def measured(run: Path) -> dict[tuple[str, str], float]:
    out = {}
    for table in sorted(run.glob("*/validation.csv")):
        for row in csv.DictReader(table.open()):
            if row.get("measured_step_s"):
                out[(table.parent.name, row["plan"])] = float(row["measured_step_s"])
    return out


def predicted(run: Path, keys: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    models = {m: load_model(HERE / f"model_{m}.yaml") for m in {m for m, _ in keys}}
    out = {}
    for m, text in keys:
        plan = parse_plan(text)
        cluster = load_cluster(f"cpu:{plan.world_size}", profile=run / "profile.yaml")
        out[(m, text)] = simulate(models[m], cluster, plan, record_events=False).step_time_s
    return out


def readings(run: Path) -> dict[str, float]:
    """What the run's calibration read that sets its profile's level (``calibrate.txt`` prints
    the same numbers)."""
    dev = yaml.safe_load((run / "profile.yaml").read_text())["device"]["extra"]
    probe, comp = dev["layer_probe"], dev["layer_composition"]
    return {"stages": statistics.median(dev["stage_probes"]["rounds"]),
            "layer": probe["fwd_s"] + probe["bwd_s"], "comp.fwd": comp["fwd"], "comp.bwd": comp["bwd"],
            **{f"c2.{k}": dev[f"contention_{k}" if k != "gemm" else "contention"]["2"]
               for k in ("layer", "gemm", "membound", "optimizer")}}


def print_readings(runs: list[Path], levels: list[float]) -> None:
    read = [readings(r) for r in runs]
    cols = list(read[0])
    print("\nwhat each calibration read (log less its mean over the runs) and its predictions' level:")
    print(" " * 22 + "".join(f"{c:>12s}" for c in cols) + f"{'level':>12s}")
    logs = {c: [math.log(x[c]) for x in read] for c in cols}
    for i, r in enumerate(runs):
        print(f"{r.name.removeprefix('run_'):>22s}" + "".join(f"{logs[c][i] - statistics.mean(logs[c]):+12.3f}" for c in cols)
              + f"{levels[i]:+12.3f}")
    print(f"{'mean (not log)':>22s}" + "".join(f"{statistics.mean(x[c] for x in read):12.4g}" for c in cols))
    print(f"{'corr. with level':>22s}" + "".join(f"{statistics.correlation(logs[c], levels):+12.2f}" for c in cols))


def main(runs: list[Path]) -> None:
    meas = {r.name: measured(r) for r in runs}
    keys = sorted(set.intersection(*(set(d) for d in meas.values())))
    pred = {r.name: predicted(r, keys) for r in runs}
    names = [r.name for r in runs]
    print(f"{len(keys)} plans measured in all {len(runs)} runs; step |error| median / max, "
          "rows: whose measurements, columns: whose profile")
    print(" " * 22 + "".join(f"{n.removeprefix('run_')[:13]:>14s}" for n in names))
    for mr in names:
        cells = []
        for pr in names:
            errs = [abs(pred[pr][k] / meas[mr][k] - 1) for k in keys]
            cells.append(f"{statistics.median(errs):5.1%}/{max(errs):5.1%}")
        print(f"{mr.removeprefix('run_'):>22s}" + "".join(f"{c:>14s}" for c in cells))
    log_m = {k: [math.log(meas[n][k]) for n in names] for k in keys}
    log_p = {k: [math.log(pred[n][k]) for n in names] for k in keys}
    print("\nlevel of each run (median over plans of log step less the plan's mean over runs):")
    levels = []
    for i, n in enumerate(names):
        lm = statistics.median(log_m[k][i] - statistics.mean(log_m[k]) for k in keys)
        lp = statistics.median(log_p[k][i] - statistics.mean(log_p[k]) for k in keys)
        levels.append(lp)
        print(f"  {n}: measured {lm:+.3f}, its profile's predictions {lp:+.3f}")
    print("\nper plan over the runs: signed error of the median prediction against the median measurement;"
          " sd of log measured and of log predicted step")
    sds_m, sds_p = [], []
    for k in keys:
        err = math.exp(statistics.median(log_p[k]) - statistics.median(log_m[k])) - 1
        sd_m, sd_p = statistics.stdev(log_m[k]), statistics.stdev(log_p[k])
        sds_m.append(sd_m)
        sds_p.append(sd_p)
        print(f"  {k[0]:6s} {k[1][:62]:62s} {err:+6.1%}  measured {sd_m:.3f}  predicted {sd_p:.3f}")
    print(f"median over plans: measured {statistics.median(sds_m):.3f}, predicted {statistics.median(sds_p):.3f}")
    if len(runs) > 2:
        print_readings(runs, levels)


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit("usage: cross_runs.py RUN_DIR RUN_DIR [...] (at least two held-out runs)")
    main([Path(a) if Path(a).is_dir() else HERE / a for a in args])
