"""``parsim validate``: a matrix of plans on the torch executor and the simulator, compared."""
from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_json_argument, emit_json, table

HELP = "run a matrix of plans on the executor and the simulator; write the error table and plots"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matrix", default="studies/validation_cpu/matrix.yaml", help="matrix YAML (model, plans, steps)")
    p.add_argument("--profile", default="cpu-calibrated", help="calibration profile (name or YAML) [cpu-calibrated]")
    p.add_argument("--out", default="studies/validation_cpu", help="output folder (CSV, plots, traces); resumable")
    p.add_argument("--fresh", action="store_true", help="discard finished rows and rounds in --out and start over")
    p.add_argument("--rounds", type=int, default=None,
                   help="executor runs per plan, interleaved over the matrix; the median counts; "
                        "on an --out whose plans have fewer, the missing rounds run [matrix's rounds, 1]")
    p.add_argument("--worst", type=int, default=3, help="side-by-side timelines for the N worst plans [3]")
    add_json_argument(p)


def run(args: argparse.Namespace) -> int:
    from parsim.api import validate
    from parsim.study.validate import CSV_NAME

    report = validate(args.matrix, args.profile, args.out, rounds=args.rounds, fresh=args.fresh, worst=args.worst,
                      progress=True)
    rows, s, out = report.rows, report.summary, Path(args.out)
    if args.json:
        emit_json(report.to_dict())
        return 0
    for r in report.did_not_fit:
        predicted = {True: "the simulator predicted it fits", False: "the simulator predicted it does not fit",
                     None: "no prediction"}[r["predicted_fits"]]
        print(f"{r['plan']}: {r['outcome']} ({predicted}: {r['predicted_peak_bytes'] / 2**30:.1f} GiB)")
    if not rows:
        print(f"no plan ran: {len(report.did_not_fit)} did not fit the device; wrote {out / CSV_NAME}")
        return 0
    anchored = "mape_step_time_anchored" in s

    def anchor_cells(r) -> list[str]:
        if not anchored:
            return []
        return [f"{r['probe_drift']:.2f}", f"{r['anchored_step_s'] * 1e3:.1f}", f"{r['anchored_error']:+.1%}"]
    print(table([[r["plan"], r["world_size"], f"{r['measured_step_s'] * 1e3:.1f}", f"{r['predicted_step_s'] * 1e3:.1f}",
                  f"{r['step_error']:+.1%}", *anchor_cells(r), f"{r['measured_peak_bytes'] / 2**20:.1f}",
                  f"{r['predicted_peak_bytes'] / 2**20:.1f}", f"{r['max_rank_memory_error']:.1%}"] for r in rows],
                ["plan", "ranks", "meas ms", "pred ms", "step err",
                 *(["drift", "anch ms", "anch err"] if anchored else []), "meas MiB", "pred MiB", "mem err"]))
    for w, d in s["by_world_size"].items():
        st, mem = d["step_time"], d["peak_memory"]
        print(f"{w} ranks: step-time error median {st['median']:.1%}, max {st['max']:.1%} over {st['n']} plans; "
              f"memory error max {mem['max']:.1%}")
        if "step_time_anchored" in d:
            a, dr = d["step_time_anchored"], d["probe_drift"]
            print(f"{w} ranks, anchored to the layer probe around each plan: step-time error median {a['median']:.1%}, "
                  f"max {a['max']:.1%}; layer drift vs the profile median {dr['median']:.2f}x, max {dr['max']:.2f}x")
    print(f"MAPE step time {s['mape_step_time']:.1%}, peak memory {s['mape_peak_memory']:.1%}; "
          f"Spearman rho {s['spearman_step_time']:.3f}"
          + (f" (anchored: MAPE {s['mape_step_time_anchored']:.1%}, rho {s['spearman_step_time_anchored']:.3f})"
             if anchored else ""))
    print(f"wrote {out / CSV_NAME}, {report.plots[0]} and {len(report.plots) - 1} worst-plan timelines")
    return 0
