"""The GPU model fitted to the public record, and its evidence (issue 19).

Fits the shipped A100 / H100 / H200 numbers to ../shared/validation/public_runs_train.csv
exactly as `make profiles` does (parsim.study.runs.profiles: the templates + the fit), checks
that the shipped profiles are what the fit writes, and reports:

* error per source (MAPE, signed median; + = predicted faster than published), runs that ran
  but are predicted not to fit, OOM rows, memory error;
* leave-one-source-out: each source predicted by a fit to all the others;
* Spearman rho of the log errors against sequence length, model size, dp and tp x pp;
* parity plot (predicted vs published, log scale, colour = stack, marker = GPU) and the
  residuals against the four variables;
* the demo's headline (Llama-3 8B on 16 H100 with ZeRO-3) re-simulated under the stacks.

    .venv/bin/python studies/public_record/run.py            # ~15 min on 2 shared cores
    .venv/bin/python studies/public_record/run.py --no-loso  # ~3 min
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from plots import parity_plot, residual_plot  # noqa: E402

from parsim.specs import profiles_dir  # noqa: E402
from parsim.study.runs import calibrate_runs  # noqa: E402
from parsim.study.runs.observations import published_from_step, time_like  # noqa: E402
from parsim.study.runs.profiles import SHIPPED, render, template_profiles  # noqa: E402
from parsim.study.validate import spearman_rho  # noqa: E402

# ../shared/validation from the repository root (a worktree one level deeper finds it too)
RUNS = next((p / "shared" / "validation" / "public_runs_train.csv" for p in HERE.parents[1].parents[:2]
             if (p / "shared" / "validation" / "public_runs_train.csv").exists()),
            HERE.parents[1].parent / "shared" / "validation" / "public_runs_train.csv")
TIME_KINDS = ("step_time", "layer_fwd", "layer_bwd", "layer_fwd_bwd")
VARIABLES = (("seq_len", "sequence length"), ("params", "model size (parameters)"), ("dp", "dp"),
             ("tp_pp", "tp x pp"))


def implied_seconds(o, value: float) -> float:
    """A published or predicted number as the step (or layer) time it stands for, seconds. Every
    rate the sources print is C / step, so the step a rate stands for is C / rate:
    ``published_from_step`` read backwards is itself."""
    return value if o.kind in TIME_KINDS else published_from_step(o, value)


def rows_of(cal) -> list[dict]:
    out = []
    for o, p in zip(cal.observations, cal.predictions):
        base = {"row": o.row + 2, "source": o.source, "stack": o.stack, "gpu": o.profile, "metric": o.kind,
                "plan": p.plan, "engine": p.engine, "fits": p.fits, **o.features}
        if time_like(o):
            pub_s, pred_s = implied_seconds(o, o.value), implied_seconds(o, p.value)
            out.append({**base, "published": o.value, "predicted": p.value,
                        "error_pct": 100 * (p.value / o.value - 1), "published_s": pub_s, "predicted_s": pred_s,
                        "log_speed_error": math.log(pub_s / pred_s)})
        elif o.kind == "memory":
            out.append({**base, "published": o.value, "predicted": p.value, "error_pct": 100 * (p.value / o.value - 1)})
        else:
            out.append({**base, "published": o.value, "predicted": p.value, "error_pct": 0.0})
    return out


def write_csv(rows: list[dict], path: Path) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def demo_headline() -> list[str]:
    """Llama-3 8B on 16 H100, ZeRO-3 (the demo's plan family) under each stack."""
    from parsim.sim import simulate
    lines = []
    for stack in ("auto", "megatron-core", "fsdp1", "fsdp2"):
        for rc in ("none", "full"):
            plan = f"dp=16 mbs=1 gbs=128 zero=3 recompute={rc} stack={stack}"
            r = simulate("llama3-8b", "h100-sxm:16", plan, record_events=False)
            lines.append(f"  {plan:55s} MFU {100 * r.mfu:5.1f} %  {r.tokens_per_s / 16:8,.0f} tokens/s/GPU  "
                         f"peak {r.peak_memory_bytes / 2**30:5.1f} GiB fits={r.fits}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=RUNS)
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--no-loso", action="store_true")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cal = calibrate_runs(str(args.runs), profiles=template_profiles(), loso=not args.no_loso, log=print)
    lines = [f"fit {'' if args.no_loso else '+ leave-one-source-out '}in {time.perf_counter() - t0:.0f} s; "
             f"{len(cal.observations)} usable rows, {len(cal.skipped)} skipped"]
    same = all(render(n, cal, args.runs.name) == (profiles_dir() / f"{n}.yaml").read_text() for n in SHIPPED)
    lines.append(f"shipped profiles identical to this fit's output: {same}")
    rows = rows_of(cal)
    write_csv(rows, args.out / "results.csv")
    lines += ["", "source | rows | MAPE % | median % | ran, predicted not to fit", "---|---:|---:|---:|---:"]
    lines += [f"{g.group} | {g.rows} | {g.mape:.1f} | {g.median:+.1f} | {g.not_fitting}" for g in cal.groups]
    if cal.loso:
        lines += ["", "left-out source | rows | MAPE % | median %", "---|---:|---:|---:"]
        lines += [f"{g.group} | {g.rows} | {g.mape:.1f} | {g.median:+.1f}" for g in cal.loso]
    timing = [r for r in rows if "log_speed_error" in r]
    err = [r["log_speed_error"] for r in timing]
    lines += ["", "Spearman rho of log(published time / predicted time) over the timing rows:"]
    for key, label in VARIABLES:
        lines.append(f"  vs {label}: {spearman_rho([float(r[key]) for r in timing], err):+.3f}")
    oom = [r for r in rows if r["metric"] == "oom"]
    lines.append(f"\nOOM rows predicted not to fit: {sum(int(r['predicted']) for r in oom)} of {len(oom)}")
    lines += ["", "fitted numbers (profile, number, value, how):"]
    lines += [f"  {k[0]} {'.'.join(k[2:])} = {v:.4g}  ({cal.sources.get(k, '')})"
              for k, v in sorted(cal.values.items()) if k[0] in ("a100-80g", "h100-sxm")]
    lines += [f"warning: {w}" for w in cal.warnings]
    lines += ["", "demo headline re-checked (parsim simulate, SimPy):"] + demo_headline()
    parity_plot(timing, args.out / "parity.png")
    residual_plot(timing, VARIABLES, args.out / "residuals.png")
    text = "\n".join(lines) + "\n"
    (args.out / "results.txt").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
