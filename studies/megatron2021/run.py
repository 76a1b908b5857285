"""Megatron-LM weak scaling (Narayanan et al. 2021, Table 1) predicted with parsim.

For each of the ten GPT rows: tp / pp / dp and the global batch come from the table;
fp16, full recomputation, no sequence parallelism, the DP gradient all-reduce after the
pipeline flush (Megatron-LM 2021 did not overlap it: Narayanan et al. 2021, Sec. 4.2 /
the ``--DDP-impl local`` path). The table leaves the microbatch size and the schedule
open, so the study searches them as Megatron users did: mbs in {1, 2, 4, 8} and 1F1B or
the interleaved schedule with vpp dividing the layers per stage (Megatron-LM needs the
microbatch count divisible by pp for interleaving), among plans that fit in 80 GB. The
closed-form estimate (estimate.py) ranks the candidates; the SimPy engine plays the best
``--top`` of them and the fastest is reported.

Throughput is counted the paper's way, Eq. 3 with the recompute forward:
    TFLOP/s per GPU = 96 B s L h^2 (1 + s/(6h) + V/(16 L h)) / (step time x GPUs)

    .venv/bin/python studies/megatron2021/run.py            # all ten rows -> this folder
    .venv/bin/python studies/megatron2021/run.py --rows 2 --out /tmp/m   # first two rows
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from estimate import step_time as estimate_step_time  # noqa: E402

from parsim.costs import eq3_flops, fits, memory_by_stage  # noqa: E402
from parsim.specs import ClusterSpec, ModelSpec, Plan, load_cluster  # noqa: E402

REPO = HERE.parents[1]
TABLE = REPO.parent / "shared" / "validation" / "megatron2021_table1.csv"
MBS_CHOICES = (1, 2, 4, 8)


@dataclass
class Outcome:
    """The plan chosen for one row and what it predicts."""
    plan: Plan
    step_time_s: float
    peak_memory_bytes: float
    fits: bool
    engine: str
    candidates: int


def read_table(path: Path) -> list[dict]:
    if not path.exists():
        sys.exit(f"megatron2021: the published table is not at {path}\n"
                 f"(expected ../shared/validation/megatron2021_table1.csv from the repo root; pass --table PATH)")
    with path.open() as f:
        return list(csv.DictReader(f))


def model_of(row: dict) -> ModelSpec:
    """The row's GPT (the megatron-* presets have the same numbers)."""
    return ModelSpec(name=row["model"], layers=int(row["layers"]), hidden=int(row["hidden"]),
                     heads=int(row["heads"]), seq_len=int(row["seq_len"]), vocab=int(row["vocab"]))


def candidate_plans(model: ModelSpec, row: dict) -> list[Plan]:
    """Every (mbs, schedule, vpp) Megatron-LM accepts for this row's tp / pp / dp / gbs."""
    tp, pp, dp, gbs = int(row["tp"]), int(row["pp"]), int(row["dp"]), int(row["global_batch"])
    plans = []
    for mbs in MBS_CHOICES:
        if gbs % (dp * mbs):
            continue
        micro = gbs // (dp * mbs)
        vpps = [1] if pp == 1 else [v for v in range(1, model.layers // pp + 1) if model.layers % (pp * v) == 0]
        for vpp in vpps:
            if vpp > 1 and micro % pp:
                continue
            plans.append(Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, mbs=mbs, gbs=gbs,
                              schedule="interleaved" if vpp > 1 else "1f1b", recompute="full",
                              dtype="fp16", sp=False, dp_overlap=False, stack="megatron-lm-2021"))
    return plans


def engine_step(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> tuple[float, float, bool] | None:
    """(step time, peak memory, fits) from the SimPy engine; None if it is not installed."""
    try:
        from parsim.sim import simulate
    except ImportError:
        return None
    result = simulate(model, cluster, plan)
    return result.step_time_s, result.peak_memory_bytes, result.fits


def choose_plan(model: ModelSpec, cluster: ClusterSpec, plans: list[Plan], engine: str = "sim",
                top: int = 3, require_fit: bool = True) -> Outcome:
    """The fastest of ``plans`` that fit: the closed form ranks them, the engine plays the
    ``top`` best (all candidates are kept if none fits, or if ``require_fit`` is off, so
    the row still reports one, with ``fits`` saying so)."""
    fitting = [p for p in plans if fits(model, p, cluster)] if require_fit else plans
    fitting = fitting or plans
    ranked = sorted(fitting, key=lambda p: estimate_step_time(model, p, cluster))
    best: Outcome | None = None
    for plan in ranked[: max(top, 1)]:
        peak = max(s.total for s in memory_by_stage(model, plan, cluster))
        measured = engine_step(model, cluster, plan) if engine == "sim" else None
        if measured is None:
            out = Outcome(plan, estimate_step_time(model, plan, cluster), peak, fits(model, plan, cluster),
                          "closed-form", len(plans))
        else:
            out = Outcome(plan, measured[0], measured[1], measured[2], "sim", len(plans))
        if best is None or out.step_time_s < best.step_time_s:
            best = out
    return best


def predict(rows: list[dict], engine: str = "sim", top: int = 3, profile: str = "a100-80g",
            log=print) -> list[dict]:
    results = []
    for row in rows:
        model = model_of(row)
        gpus = int(row["gpus"])
        cluster = load_cluster(f"{profile}:{gpus}")
        t0 = time.perf_counter()
        out = choose_plan(model, cluster, candidate_plans(model, row), engine, top)
        predicted = eq3_flops(model, out.plan.gbs, full_recompute=True) / (out.step_time_s * gpus) / 1e12
        published = float(row["achieved_tflops_per_gpu"])
        results.append({
            "model": row["model"], "gpus": gpus, "tp": out.plan.tp, "pp": out.plan.pp, "dp": out.plan.dp,
            "global_batch": out.plan.gbs, "mbs": out.plan.mbs, "schedule": out.plan.schedule,
            "vpp": out.plan.vpp, "microbatches": out.plan.num_microbatches,
            "step_time_s": round(out.step_time_s, 4),
            "published_tflops": published, "predicted_tflops": round(predicted, 2),
            "error_pct": round(100 * (predicted - published) / published, 2),
            "peak_memory_gib": round(out.peak_memory_bytes / 2**30, 2), "fits": out.fits,
            "engine": out.engine, "candidates": out.candidates,
        })
        r = results[-1]
        log(f"{r['model']:>11} {gpus:5d} GPUs  tp={r['tp']} pp={r['pp']:<2} dp={r['dp']:<2} mbs={r['mbs']} "
            f"{r['schedule']:>11} vpp={r['vpp']}  published {published:5.0f}  predicted {predicted:6.1f} "
            f"TFLOP/s  error {r['error_pct']:+6.2f}%  peak {r['peak_memory_gib']:5.1f} GiB  "
            f"[{r['engine']}, {time.perf_counter() - t0:.1f} s]")
    return results


def mape(results: list[dict]) -> float:
    return sum(abs(r["error_pct"]) for r in results) / len(results)


def write_csv(results: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(results[0]))
        w.writeheader()
        w.writerows(results)


def plot(results: list[dict], path: Path, title: str,
         published_label: str = "published (Narayanan et al. 2021, Table 1)",
         ylabel: str = "TFLOP/s per GPU (Eq. 3, with recompute)") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(results))
    pub = [r["published_tflops"] for r in results]
    pred = [r["predicted_tflops"] for r in results]
    fig, ax = plt.subplots(figsize=(11, 4.8))
    ax.bar(x - 0.2, pub, 0.4, label=published_label, color="#7f7f7f")
    ax.bar(x + 0.2, pred, 0.4, label="parsim", color="#1f77b4")
    for i, r in enumerate(results):
        ax.annotate(f"{r['error_pct']:+.1f}%", (x[i] + 0.2, pred[i]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [f"{r['model']}\n{r['gpus']} GPUs\nt{r['tp']} p{r['pp']} v{r['vpp']} b{r['mbs']}"
                      for r in results], fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, max(pub + pred) * 1.18)
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, default=TABLE, help="Narayanan 2021 Table 1 CSV")
    ap.add_argument("--out", type=Path, default=HERE, help="folder for results.csv / .png / .txt")
    ap.add_argument("--rows", type=int, default=None, help="only the first N rows")
    ap.add_argument("--engine", choices=("sim", "closed-form"), default="sim")
    ap.add_argument("--top", type=int, default=3, help="candidates per row the engine plays")
    ap.add_argument("--profile", default="a100-80g")
    args = ap.parse_args(argv)
    rows = read_table(args.table)[: args.rows]
    args.out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    log(f"Narayanan et al. 2021 Table 1 on {args.profile} (fp16, full recompute); engine={args.engine}")
    results = predict(rows, args.engine, args.top, args.profile, log)
    worst = max(results, key=lambda r: abs(r["error_pct"]))
    log(f"MAPE {mape(results):.2f}% over {len(results)} rows; worst {worst['model']} {worst['error_pct']:+.2f}%")
    write_csv(results, args.out / "results.csv")
    plot(results, args.out / "results.png",
         f"Megatron-LM Table 1 on {args.profile}: MAPE {mape(results):.1f}% ({results[0]['engine']})")
    (args.out / "results.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
