"""Best plans for GPT-3 175B on 1024 A100-80GB at global batch 1536 (Narayanan et al. 2021's
setting), and how well the fast path agrees with the SimPy engine over the whole space.

1. The sweep, exactly as a user runs it (timed, wall clock, one process + 2 workers):
       parsim sweep --model gpt3-175b --cluster a100-80g:1024 --gbs 1536 \\
                    --resimulate 50 --workers 2 --out plans.parquet --json
2. Agreement: a seeded random sample of the valid plans (every schedule, ZeRO stage, ...)
   plus the 50 re-simulated rows go through both engines; relative differences of step time
   and peak memory, split by whether every pipeline stage holds the same layers; and whether
   any plan the fast path says fits runs out of memory in the SimPy engine.
3. Charts: ``parsim plot sweep`` on plans.parquet, and fast vs SimPy step time; the best 200
   plans also go to top_plans.csv (the full table is plans.parquet, every valid plan).

    .venv/bin/python studies/gpt3_175b_1024/run.py [--sample 200] [--workers 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import rc_context

from parsim.plots.style import RC, new_figure, save
from parsim.specs import load_cluster, load_model

HERE = Path(__file__).resolve().parent
MODEL, CLUSTER, GBS = "gpt3-175b", "a100-80g:1024", 1536


def run_sweep(workers: int) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "parsim", "sweep", "--model", MODEL, "--cluster", CLUSTER, "--gbs", str(GBS),
           "--resimulate", "50", "--workers", str(workers), "--out", str(HERE / "plans.parquet"), "--json", "--top", "20"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    doc = json.loads(out.stdout)
    (HERE / "sweep.json").write_text(json.dumps(doc, indent=1))
    return doc, wall


def _simulate(plan: str) -> dict:
    from parsim.sim import simulate
    r = simulate(MODEL, CLUSTER, plan, record_events=False)
    return {"plan": plan, "sim_step_time_s": r.step_time_s, "sim_peak_memory_bytes": r.peak_memory_bytes,
            "sim_fits": r.fits, "sim_wall_s": r.sim_wall_s}


def agreement(sample: int, workers: int) -> pd.DataFrame:
    df = pd.read_parquet(HERE / "plans.parquet")
    rng = np.random.default_rng(2021)
    picked = set(rng.choice(len(df), size=min(sample, len(df)), replace=False).tolist())
    picked |= set(np.flatnonzero(df["source"] == "sim").tolist())
    rows = df.iloc[sorted(picked)]
    with ProcessPoolExecutor(workers) as pool:
        sims = list(pool.map(_simulate, rows["plan"].tolist(), chunksize=1))
    out = rows[["plan", "pp", "vpp", "schedule", "zero", "microbatches", "fast_step_time_s", "fast_peak_memory_bytes",
                "fits", "source", "memory_limit_bytes"]].reset_index(drop=True)
    out = pd.concat([out, pd.DataFrame(sims).drop(columns="plan")], axis=1)
    model = load_model(MODEL)
    out["uniform_stages"] = model.layers % (out["pp"] * out["vpp"]) == 0
    out["step_rel_diff"] = out["fast_step_time_s"] / out["sim_step_time_s"] - 1.0
    out["memory_rel_diff"] = out["fast_peak_memory_bytes"] / out["sim_peak_memory_bytes"] - 1.0
    out["fast_fits_sim_not"] = out["fits"] & (out["sim_peak_memory_bytes"] > out["memory_limit_bytes"])
    out.to_csv(HERE / "agreement.csv", index=False)
    return out


def summarize(a: pd.DataFrame) -> dict:
    def stats(x: pd.Series) -> dict:
        x = x.abs()
        return {"n": int(len(x)), "median": float(x.median()), "p90": float(x.quantile(0.9)), "max": float(x.max())}
    return {"step_time_all": stats(a["step_rel_diff"]),
            "step_time_uniform": stats(a.loc[a["uniform_stages"], "step_rel_diff"]),
            "step_time_non_uniform": stats(a.loc[~a["uniform_stages"], "step_rel_diff"]),
            "memory_all": stats(a["memory_rel_diff"]),
            "fast_says_fits_sim_does_not": int(a["fast_fits_sim_not"].sum()),
            "sim_wall_s_median": float(a["sim_wall_s"].median())}


def plot_agreement(a: pd.DataFrame, path: Path) -> None:
    with rc_context(RC):
        fig = new_figure(5.6, 5.0)
        ax = fig.add_subplot()
        for uniform, color, label in ((True, "#0072b2", "every stage the same layers"),
                                      (False, "#d55e00", "uneven stages")):
            s = a[a["uniform_stages"] == uniform]
            ax.scatter(s["sim_step_time_s"], s["fast_step_time_s"], s=10, c=color, alpha=0.7, label=f"{label} ({len(s)})")
        lo, hi = a["sim_step_time_s"].min() * 0.9, a["sim_step_time_s"].max() * 1.1
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        ax.fill_between([lo, hi], [lo * 0.98, hi * 0.98], [lo * 1.02, hi * 1.02], color="#bbbbbb", alpha=0.4,
                        label="±2%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("SimPy engine step time (s)")
        ax.set_ylabel("fast path step time (s)")
        ax.set_title("GPT-3 175B on 1024 A100: fast path vs SimPy")
        ax.legend(fontsize=8)
        ax.grid(color="#e8e8e8", lw=0.6, which="both")
        save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sample", type=int, default=200, help="random plans for the agreement check [200]")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    doc, wall = run_sweep(args.workers)
    print(f"sweep: {doc['num_plans']} plans, {doc['num_fit']} fit, {doc['num_resimulated']} re-simulated, "
          f"{wall:.1f} s wall (CLI, {args.workers} workers)")
    for r in doc["rows"][:5]:
        print(f"  #{r['rank']} {r['plan']}: {r['tokens_per_s']:,.0f} tokens/s, MFU {r['mfu']:.3f}, "
              f"{r['peak_memory_bytes'] / 2**30:.1f} GiB ({r['source']})")
    pd.read_parquet(HERE / "plans.parquet").head(200).to_csv(HERE / "top_plans.csv", index=False)
    subprocess.run([sys.executable, "-m", "parsim", "plot", "sweep", "--csv", str(HERE / "plans.parquet"), "--out", str(HERE),
                    "--title", "GPT-3 175B, 1024 A100, gbs 1536"], check=True, capture_output=True)
    a = agreement(args.sample, args.workers)
    plot_agreement(a, HERE / "fast_vs_sim.png")
    summary = {"sweep_wall_s": wall, "num_plans": doc["num_plans"], "num_fit": doc["num_fit"],
               "cpu_count": os.cpu_count(), **summarize(a)}
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
