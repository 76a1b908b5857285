"""Best plans for Llama-3 70B (8K sequences, GQA, SwiGLU, 128K vocabulary) on 64 H100-SXM
(8 DGX H100 nodes), global batch 256 sequences (2M tokens).

    parsim sweep --model llama3-70b --cluster h100-sxm:64 --gbs 256 --resimulate 20 --workers 2 \\
                 --out plans.parquet --json
    parsim recommend --model llama3-70b --cluster h100-sxm:64 --gbs 256 --json
    parsim plot sweep --csv plans.parquet --out .

This script runs the three and writes sweep.json, recommend.json, plans.parquet (every valid
plan), top_plans.csv (the best 200) and the charts.

    .venv/bin/python studies/llama3_70b_64h100/run.py
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ARGS = ["--model", "llama3-70b", "--cluster", "h100-sxm:64", "--gbs", "256", "--workers", "2", "--no-progress"]


def parsim(*argv: str) -> str:
    return subprocess.run([sys.executable, "-m", "parsim", *argv], check=True, capture_output=True, text=True).stdout


def main() -> None:
    t0 = time.perf_counter()
    sweep = json.loads(parsim("sweep", *ARGS, "--resimulate", "20", "--top", "20", "--out",
                              str(HERE / "plans.parquet"), "--json"))
    wall = time.perf_counter() - t0
    (HERE / "sweep.json").write_text(json.dumps(sweep, indent=1))
    rec = json.loads(parsim("recommend", *ARGS, "--top", "3", "--json"))
    (HERE / "recommend.json").write_text(json.dumps(rec, indent=1))
    pd.read_parquet(HERE / "plans.parquet").head(200).to_csv(HERE / "top_plans.csv", index=False)
    parsim("plot", "sweep", "--csv", str(HERE / "plans.parquet"), "--out", str(HERE), "--title", "Llama-3 70B, 64 H100")
    print(f"{sweep['num_plans']} plans, {sweep['num_fit']} fit, sweep {wall:.1f} s")
    for r in sweep["rows"][:10]:
        print(f"#{r['rank']:2d} {r['plan']:100s} {r['tokens_per_s']:9,.0f} tok/s MFU {r['mfu']:.3f} "
              f"bubble {r['bubble_fraction']:.3f} peak {r['peak_memory_bytes'] / 2**30:5.1f} GiB ({r['source']})")
    print(rec["rule_check"])
    for a in rec["plans"]:
        print(f"- {a['plan']}")
        for reason in a["reasons"]:
            print(f"    {reason}")


if __name__ == "__main__":
    main()
