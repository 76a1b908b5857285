"""Peak memory at short sequences: the memory model against the executor's tracked peak, where the
peak leaves the loss's and layers' activations for the moments that hold weights and gradients
(tied embeddings' gradient sum, FSDP2's post-backward and its gradient shards).

Two 4-layer h = 128 bf16 models (a 4,096-word and a 1,024-word tied vocabulary), s = 16-128,
nine 2-rank plans each: tp=2 SP with full recomputation, ZeRO-2/3 (FSDP2) with one, two and three
microbatches a step; and three dp=2 pp=2 FSDP2 plans at s = 32 and 128. Prints measured and
predicted peak per plan (its worst rank) and the error; writes results.csv beside this file.

    .venv/bin/python studies/memory_moments/run.py          # ~2 minutes on 2 cores
"""
from __future__ import annotations

import csv
import sys
from dataclasses import replace
from pathlib import Path

from parsim.costs import memory_by_stage
from parsim.specs import load_cluster, load_model, parse_plan

HERE = Path(__file__).parent
SEQS = (16, 32, 64, 128)
PLANS = [("wide", "tp=2 mbs=2 gbs=4 sp=true recompute=full"),
         ("wide", "dp=2 mbs=2 gbs=8 zero=3"), ("wide", "dp=2 mbs=2 gbs=4 zero=3"), ("wide", "dp=2 mbs=2 gbs=4 zero=2"),
         ("narrow", "dp=2 mbs=2 gbs=8 zero=3"), ("narrow", "dp=2 mbs=2 gbs=8 zero=2"),
         ("narrow", "dp=2 mbs=2 gbs=4 zero=3"), ("narrow", "dp=2 mbs=2 gbs=4 zero=2"),
         ("narrow", "dp=2 mbs=1 gbs=6 zero=2")]
# 4 ranks, s = 32 and 128: FSDP2 beside a pipeline (each rank's worst rank reported)
PIPELINED = [("narrow", "dp=2 pp=2 mbs=2 gbs=4 zero=3 schedule=1f1b"), ("narrow", "dp=2 pp=2 mbs=2 gbs=4 zero=2 schedule=1f1b"),
             ("narrow", "dp=2 pp=2 mbs=2 gbs=8 zero=3 schedule=1f1b")]
PIPELINED_SEQS = (32, 128)


def model(name: str, seq: int):
    base = replace(load_model("tiny"), flash_attention=True, layers=4, hidden=128, ffn_hidden=512, seq_len=seq)
    return replace(base, vocab=4096 if name == "wide" else 1024)


def main() -> int:
    from parsim.executor import ExecutorConfig, RunSpec, run_plans
    rows = []
    print(f"{'model':6} {'seq':>4}  {'plan':44} {'mb':>2} {'meas MiB':>9} {'pred MiB':>9} {'err':>7}  (worst rank)")
    groups = [(seq, PLANS) for seq in SEQS] + [(seq, PIPELINED) for seq in PIPELINED_SEQS]
    for seq, plans in groups:
        cases = [(model(name, seq), parse_plan(f"{text} dtype=bf16")) for name, text in plans]
        results = run_plans([RunSpec(spec, plan, ExecutorConfig(steps=2, warmup=2, track_memory=True))
                             for spec, plan in cases])
        for (name, text), (spec, plan), result in zip(plans, cases, results):
            stages = memory_by_stage(spec, plan, load_cluster(f"cpu:{plan.world_size}", profile="cpu-calibrated"))
            # the rank whose prediction is furthest off (TP and DP peers of a stage hold the same)
            errors = [(stages[r // (plan.dp * plan.tp)].total / m - 1, m, stages[r // (plan.dp * plan.tp)].total)
                      for r, m in enumerate(result.peak_memory_bytes_by_rank)]
            err, measured, predicted = max(errors, key=lambda e: abs(e[0]))
            rows.append(dict(model=name, seq=seq, plan=text, microbatches=plan.num_microbatches,
                             measured_bytes=measured, predicted_bytes=predicted, error=round(err, 5)))
            print(f"{name:6} {seq:>4}  {text:44} {plan.num_microbatches:>2} {measured / 2**20:9.3f} "
                  f"{predicted / 2**20:9.3f} {100 * err:+6.2f}%", flush=True)
    with open(HERE / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    errors = sorted(abs(r["error"]) for r in rows)
    within = sum(e <= 0.01 for e in errors), sum(e <= 0.03 for e in errors)
    print(f"{len(rows)} plans: |error| median {100 * errors[len(errors) // 2]:.2f}%, max {100 * errors[-1]:.2f}%; "
          f"within 1%: {within[0]}, within 3%: {within[1]}")
    worst = max(rows, key=lambda r: abs(r["error"]))
    print(f"worst: {worst['model']} s={worst['seq']} {worst['plan']}: {100 * worst['error']:+.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
