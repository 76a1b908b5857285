"""Merak's techniques in the simulator at GPU scale, over GPU counts (cf. Lai et al. 2023,
TPDS, the speedup-vs-GPUs figures of Sec. 6).

Baseline: plain 1F1B with full recomputation and the equal-layer split. Variants, each alone:
  (a) auto partition   -- ``parsim.partition`` (min-max stage time under memory limits)
  (b) shifted critical path -- ``shifted_critical_path=true`` (the last rank skips recompute)
  (c) stage-aware recompute -- ``recompute=stage-aware recompute_layers=<policy>``
      (``parsim.costs.stage_aware_recompute_layers``: the fewest recomputed layers that fit)
  (d) sub-pipelined TP -- ``tp_overlap=subpipe`` (each microbatch split in two, TP
      all-reduces of one half overlap the other half's compute; needs mbs >= 2)
  all -- (b) + (d) + the partition found jointly with stage-aware recompute.
GPU counts grow by data parallelism at a fixed global batch, so each pipeline gets fewer
microbatches (m = gbs / (dp mbs)), the pipeline bubble (p - 1) / (m + p - 1) grows, and once
m < p every rank holds only m microbatches in flight.

    .venv/bin/python studies/merak/run.py     # writes results.csv, results.txt, results.png here
"""
from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLUSTER = "a100-80g"


@dataclass(frozen=True)
class Setup:
    model: str
    tp: int
    pp: int
    mbs: int
    gbs: int
    dps: tuple[int, ...]


SETUPS = (
    # Llama-3 8B: its 128256-word output layer costs ~2.4 layers, so the equal split is unbalanced
    Setup("llama3-8b", tp=2, pp=4, mbs=2, gbs=256, dps=(1, 2, 4, 8, 16, 32, 64)),
    # GPT-3 13B: tp=8 in a node, 4 stages of 10 layers (Narayanan et al. 2021 use t=8 inside a DGX)
    Setup("gpt3-13b", tp=8, pp=4, mbs=2, gbs=512, dps=(1, 2, 4, 8, 16, 32, 64)),
    # GPT-3 175B: tp=8, 16 stages of 6 layers, gbs 1536 (Narayanan et al. 2021, Table 1 shape)
    Setup("gpt3-175b", tp=8, pp=16, mbs=2, gbs=1536, dps=(1, 2, 4, 8, 16, 32, 64)),
)
VARIANTS = ("baseline", "auto-partition", "shifted-critical-path", "stage-aware-recompute", "subpipe-tp", "all")


def variant_plan(name: str, base, model, cluster):
    """The plan of one variant (a Plan), from the baseline plan ``base``."""
    from parsim.costs import stage_aware_recompute_layers
    from parsim.partition import partition

    if name == "baseline":
        return base
    if name == "auto-partition":
        return base.replace(partition=partition(model, base, cluster, graph="analytic").partition)
    if name == "shifted-critical-path":
        return base.replace(shifted_critical_path=True)
    if name == "stage-aware-recompute":
        return base.replace(recompute="stage-aware",
                            recompute_layers=stage_aware_recompute_layers(model, base, cluster))
    if name == "subpipe-tp":
        return base.replace(tp_overlap="subpipe")
    joint = base.replace(recompute="stage-aware", shifted_critical_path=True, tp_overlap="subpipe")
    found = partition(model, joint, cluster, graph="analytic")
    return joint.replace(partition=found.partition, recompute_layers=found.recompute_layers)


def run_setup(setup: Setup) -> list[dict]:
    from parsim.sim import simulate
    from parsim.specs import Plan, load_cluster, load_model

    model = load_model(setup.model)
    rows = []
    for dp in setup.dps:
        gpus = dp * setup.tp * setup.pp
        cluster = load_cluster(f"{CLUSTER}:{gpus}")
        base = Plan(dp=dp, tp=setup.tp, pp=setup.pp, mbs=setup.mbs, gbs=setup.gbs, recompute="full")
        baseline_time = None
        for name in VARIANTS:
            try:
                plan = variant_plan(name, base, model, cluster)
                res = simulate(model, cluster, plan)
            except ValueError as err:   # SpecError: e.g. nothing fits without recomputation
                rows.append(dict(model=setup.model, gpus=gpus, dp=dp, tp=setup.tp, pp=setup.pp,
                                 microbatches=base.num_microbatches, variant=name, step_time_s="", speedup="",
                                 fits=False, peak_memory_gib="", bubble_fraction="", partition="",
                                 recompute_layers="", note=str(err)))
                continue
            if name == "baseline":
                baseline_time = res.step_time_s
            rows.append(dict(
                model=setup.model, gpus=gpus, dp=dp, tp=setup.tp, pp=setup.pp, microbatches=base.num_microbatches,
                variant=name, step_time_s=res.step_time_s, speedup=baseline_time / res.step_time_s, fits=res.fits,
                peak_memory_gib=res.peak_memory_bytes / 2**30, bubble_fraction=res.bubble_fraction,
                partition=",".join(map(str, plan.partition or ())),
                recompute_layers=",".join(map(str, plan.recompute_layers or ())), note=""))
    return rows


def write_outputs(rows: list[dict]) -> str:
    with open(HERE / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        sub = [r for r in rows if r["model"] == model]
        gpus = list(dict.fromkeys(r["gpus"] for r in sub))
        lines.append(f"{model} on {CLUSTER}: speedup of each technique over 1F1B + full recompute "
                     "(simulated step time)")
        lines.append(f"{'variant':24}" + "".join(f"{g:>9}" for g in gpus))
        lines.append(f"{'microbatches':24}" + "".join(f"{next(r['microbatches'] for r in sub if r['gpus'] == g):>9}"
                                                      for g in gpus))
        for v in VARIANTS:
            cells = []
            for g in gpus:
                r = next(r for r in sub if r["gpus"] == g and r["variant"] == v)
                cells.append(f"{'OOM' if not r['fits'] else ''}{r['speedup']:.3f}" if r["speedup"] != "" else "n/a")
            lines.append(f"{v:24}" + "".join(f"{c:>9}" for c in cells))
        base = [r for r in sub if r["variant"] == "baseline"]
        lines.append(f"{'baseline step s':24}" + "".join(f"{r['step_time_s']:9.2f}" for r in base))
        lines.append(f"{'baseline bubble':24}" + "".join(f"{r['bubble_fraction']:9.3f}" for r in base))
        for v in ("auto-partition", "stage-aware-recompute", "all"):
            for g in (gpus[0], gpus[-1]):
                r = next(r for r in sub if r["variant"] == v and r["gpus"] == g)
                lines.append(f"  {v} at {g} GPUs: partition={r['partition'] or 'balanced'} "
                             f"recompute_layers={r['recompute_layers'] or '-'}")
        lines.append("")
    text = "\n".join(lines)
    (HERE / "results.txt").write_text(text + "\n")
    return text


def plot(rows: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        for v in VARIANTS[1:]:
            pts = [(r["gpus"], r["speedup"]) for r in rows if r["model"] == model and r["variant"] == v
                   and r["speedup"] != ""]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs (a100-80g; dp grows, gbs fixed)")
        ax.set_ylabel("speedup over 1F1B + full recompute")
        ax.set_title(f"{model}: Merak's techniques (simulated)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "results.png", dpi=120)


def main() -> int:
    rows = [r for s in SETUPS for r in run_setup(s)]
    print(write_outputs(rows))
    plot(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
