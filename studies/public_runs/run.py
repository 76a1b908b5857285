"""Public large-scale training runs predicted with the shipped profiles, untouched.

The A100 profile was tuned on Narayanan et al. 2021 Table 1 (studies/megatron2021); the
H100 profile was not tuned at all. Nothing here is fitted: each run is simulated with the
plan its authors published, and only what they left open (schedule / vpp, and for Llama 3
the recomputation policy) is searched as in the megatron2021 study, subject to fitting.

Runs (published numbers as reported by the cited papers):
* Narayanan et al. 2021 (SC'21, arXiv:2104.04473), Table 2, "PTD Parallelism" rows:
  GPT-3 175B, tp 8 x pp 12, mbs 1, batch 1536 on 384 / 768 / 1536 A100-80GB:
  153 / 149 / 141 TFLOP/s per GPU; 530B, tp 8 x pp 35, mbs 1, batch 2240 on
  560 / 1120 / 2240 GPUs: 171 / 167 / 159 TFLOP/s (Eq. 3 with recompute).
* Smith et al. 2022 (MT-NLG, arXiv:2201.11990), Sec. 3: 530B (105 layers, h 20480, 128
  heads), tp 8 x pp 35, batch 1920, mbs 1, DeepSpeed's 1F1B pipeline, on 280 / 350 / 420
  DGX A100 nodes: 60.1 / 50.2 / 44.4 s per iteration = 126 / 121 / 113 TFLOP/s per GPU.
* Le Scao et al. 2022 (BLOOM, arXiv:2211.05100), Sec. 3.4: 176B (70 layers, h 14336, 112
  heads, vocab 250880), 384 A100-80GB, tp 4 x pp 12 x dp 8, mbs 2, batch 2048, bf16,
  ZeRO-1, full recompute: 156 TFLOP/s per GPU in the fastest configuration (the training
  chronicles report ~150 sustained).
* Dubey et al. 2024 (Llama 3, arXiv:2407.21783), Table 4: 405B, seq 8192, 16M tokens per
  batch, bf16, tp 8 x pp 16, on 8192 H100 (dp 64): 430 TFLOP/s per GPU (43% MFU); on
  16384 H100 (dp 128): 400 TFLOP/s (41% MFU). Model FLOPs (no recompute counted).

    .venv/bin/python studies/public_runs/run.py      # -> results.csv / .png / .txt here
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from parsim.costs import eq3_flops, model_flops_per_step
from parsim.specs import MODEL_PRESETS, ModelSpec, Plan, load_profile_dict
from parsim.study.runs.predict import cluster_on_network
from parsim.study.runs.sources import JEAN_ZAY

HERE = Path(__file__).resolve().parent


def _megatron_study():
    """studies/megatron2021/run.py, for its plan search and its CSV / plot writers."""
    spec = importlib.util.spec_from_file_location("megatron2021_run", HERE.parent / "megatron2021" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up while executing it
    spec.loader.exec_module(mod)
    return mod


STUDY = _megatron_study()


@dataclass(frozen=True)
class Run:
    label: str
    source: str
    model: ModelSpec
    profile: str
    gpus: int
    plan: dict                      # the published plan keys
    published_tflops: float
    metric: str = "eq3"             # "eq3": Eq. 3 with recompute; "model": model FLOPs (MFU)
    search: dict = field(default_factory=dict)   # keys left open -> values tried
    require_fit: bool = True        # off where the authors fit memory by means parsim does not model
    network: dict = field(default_factory=dict)  # the run's nodes where not the profile's (its network keys)


# BLOOM (Le Scao et al. 2022, Table 3 / Sec. 3.2): ALiBi, so no position table ("rope" is
# parsim's no-table position); dropout 0 in pre-training; tied embeddings; GeLU MLP.
BLOOM = ModelSpec(name="bloom-176b", layers=70, hidden=14336, heads=112, vocab=250880, seq_len=2048,
                  position="rope", dropout=False)
MT530 = MODEL_PRESETS["megatron-529.6b"]
GPT175 = MODEL_PRESETS["gpt3-175b"]
LLAMA405 = MODEL_PRESETS["llama3-405b"]
MEGATRON = dict(recompute="full", dtype="fp16", dp_overlap=False, stack="megatron-lm-2021")
INTERLEAVE = {"vpp": "divisors"}

RUNS = [
    *[Run(f"GPT-3 175B, {g} A100", "Narayanan 2021 Table 2", GPT175, "a100-80g", g,
          dict(tp=8, pp=12, dp=g // 96, mbs=1, gbs=1536, **MEGATRON), t, search=INTERLEAVE)
      for g, t in ((384, 153), (768, 149), (1536, 141))],
    *[Run(f"GPT 530B, {g} A100", "Narayanan 2021 Table 2", MT530, "a100-80g", g,
          dict(tp=8, pp=35, dp=g // 280, mbs=1, gbs=2240, **MEGATRON), t, search=INTERLEAVE)
      for g, t in ((560, 171), (1120, 167), (2240, 159))],
    # bf16 in late 2021, before DeepSpeed's BF16 optimizer (2022, for BLOOM): 16-bit gradients
    # that autograd accumulates, parsim's fp16 state convention (same tensor-core rate), as
    # public_record runs BLOOM's chronicle rows from before 02-28 (``SIXTEEN_BIT_GRADS``)
    *[Run(f"MT-NLG 530B, {g} A100", "Smith et al. 2022 Sec. 3", MT530, "a100-80g", g,
          dict(tp=8, pp=35, dp=g // 280, mbs=1, gbs=1920, schedule="1f1b", recompute="full", dtype="fp16",
               dp_overlap=False, stack="megatron-deepspeed"), t)
      for g, t in ((2240, 126), (2800, 121), (3360, 113))],
    # on Jean Zay's nodes: 4 Omni-Path links each, not a DGX's 8 HDR NICs (``JEAN_ZAY``)
    Run("BLOOM 176B, 384 A100", "Le Scao et al. 2022 Sec. 3.4", BLOOM, "a100-80g", 384,
        dict(tp=4, pp=12, dp=8, mbs=2, gbs=2048, schedule="1f1b", recompute="full", dtype="bf16", zero=1,
             dp_overlap=False, stack="megatron-deepspeed"), 156, network=JEAN_ZAY),
    # Dubey et al. 2024 Sec. 3.3.2: FSDP sharding optimizer and gradients, parameters kept
    # after forward (ZeRO-2), interleaved pipeline, first/last stage one layer short (what
    # parsim's balanced partition does with 126 layers), and 8K sequences trained *without
    # activation checkpointing*, thanks to freeing pipeline-stage inputs/outputs early; parsim's
    # memory model does not credit that trick, so the run is not held to parsim's fit.
    *[Run(f"Llama 3 405B, {g} H100", "Dubey et al. 2024 Table 4", LLAMA405, "h100-sxm", g,
          dict(tp=8, pp=16, dp=g // 128, mbs=1, gbs=2048, sp=True, zero=2, dtype="bf16", recompute="none",
               stack="megatron-core"), t,
          metric="model", search={"vpp": (1, 2, 4, 8)}, require_fit=False)
      for g, t in ((8192, 430), (16384, 400))],
]


def candidates(run: Run) -> list[Plan]:
    """The published plan, with the open keys expanded (interleaving as Megatron-LM allows)."""
    base = dict(run.plan)
    vpps = run.search.get("vpp", (1,))
    if vpps == "divisors":     # Megatron-LM: every virtual stage holds the same number of layers
        per_rank = run.model.layers // base["pp"]
        vpps = [v for v in range(1, per_rank + 1) if per_rank % v == 0 and v <= 8]
    vpps = [v for v in vpps if base["pp"] * v <= run.model.layers]
    plans = []
    for recompute in run.search.get("recompute", (base.get("recompute", "none"),)):
        for vpp in vpps:
            micro = base["gbs"] // (base["dp"] * base["mbs"])
            if vpp > 1 and micro % base["pp"]:
                continue
            plans.append(Plan(**{**base, "recompute": recompute, "vpp": vpp,
                                 "schedule": "interleaved" if vpp > 1 else base.get("schedule", "1f1b")}))
    return plans


def predict(run: Run, engine: str, top: int) -> dict:
    cluster = cluster_on_network(load_profile_dict(run.profile), run.gpus, run.network)
    t0 = time.perf_counter()
    out = STUDY.choose_plan(run.model, cluster, candidates(run), engine, top, run.require_fit)
    if run.metric == "model":
        flops = model_flops_per_step(run.model, out.plan.gbs)
    else:
        flops = eq3_flops(run.model, out.plan.gbs, full_recompute=True)
    predicted = flops / (out.step_time_s * run.gpus) / 1e12
    return {
        "model": run.label, "source": run.source, "gpus": run.gpus, "tp": out.plan.tp, "pp": out.plan.pp,
        "dp": out.plan.dp, "global_batch": out.plan.gbs, "mbs": out.plan.mbs, "schedule": out.plan.schedule,
        "vpp": out.plan.vpp, "recompute": out.plan.recompute, "metric": run.metric,
        "step_time_s": round(out.step_time_s, 3), "published_tflops": run.published_tflops,
        "predicted_tflops": round(predicted, 2),
        "error_pct": round(100 * (predicted - run.published_tflops) / run.published_tflops, 2),
        "mfu": round(model_flops_per_step(run.model, out.plan.gbs) / (out.step_time_s * run.gpus)
                     / cluster.device.flops(out.plan.dtype), 4),
        "peak_memory_gib": round(out.peak_memory_bytes / 2**30, 2), "fits": out.fits, "engine": out.engine,
        "sim_wall_s": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--engine", choices=("sim", "closed-form"), default="sim")
    ap.add_argument("--top", type=int, default=2, help="candidates per run the engine plays")
    ap.add_argument("--only", default=None, help="substring of the run labels to keep")
    args = ap.parse_args(argv)
    runs = [r for r in RUNS if args.only is None or args.only in r.label]
    args.out.mkdir(parents=True, exist_ok=True)
    lines, results = [], []
    for run in runs:
        r = predict(run, args.engine, args.top)
        results.append(r)
        line = (f"{r['model']:>24}  [{r['source']}]  t{r['tp']} p{r['pp']} d{r['dp']} b{r['mbs']} {r['schedule']} "
                f"v{r['vpp']} rc={r['recompute']}  published {r['published_tflops']:5.0f}  predicted "
                f"{r['predicted_tflops']:6.1f} TFLOP/s ({r['metric']})  error {r['error_pct']:+6.2f}%  "
                f"MFU {100 * r['mfu']:.1f}%  peak {r['peak_memory_gib']:.1f} GiB fits={r['fits']}  "
                f"[{r['engine']}, {r['sim_wall_s']} s]")
        print(line, flush=True)
        lines.append(line)
    mape = sum(abs(r["error_pct"]) for r in results) / len(results)
    worst = max(results, key=lambda r: abs(r["error_pct"]))
    lines.append(f"MAPE {mape:.2f}% over {len(results)} runs; worst {worst['model']} {worst['error_pct']:+.2f}%")
    print(lines[-1])
    STUDY.write_csv(results, args.out / "results.csv")
    plot(results, args.out / "results.png")
    (args.out / "results.txt").write_text("\n".join(lines) + "\n")
    return 0


def plot(results: list[dict], path: Path) -> None:
    mape = sum(abs(float(r["error_pct"])) for r in results) / len(results)
    short = [{**r, "model": str(r["model"]).split(",")[0]} for r in results]
    STUDY.plot(short, path, f"Public runs, profiles untouched: MAPE {mape:.1f}% ({results[0]['engine']})",
               published_label="published (sources in README)",
               ylabel="TFLOP/s per GPU (each source's count: Eq. 3 or model FLOPs)")


if __name__ == "__main__":
    sys.exit(main())
