"""Pipeline bubble fraction vs microbatches per step: naive, GPipe, 1F1B, interleaved 1F1B.

One pipeline of 8 A100 (pp = 8, dp = tp = 1), mbs = 1, m = gbs microbatches per step, for two
models: GPT-3 175B (96 layers, 12 per stage; the output head adds ~0.35 of a layer to the last
stage) and GPT-3 2.7B (32 layers, 4 per stage; the head adds ~1.7 layers, so the last stage is
~40% heavier than the others). For each schedule and m the bubble fraction comes from three
places, side by side:

* textbook: (p - 1)/(m + p - 1) for GPipe / 1F1B, (p - 1)/(v m + p - 1) interleaved,
  (p - 1)/p naive (``parsim.schedules.textbook_bubble_fraction``)
* fast path: the closed form on per-stage times (``parsim.fast``)
* SimPy engine: one simulated step (``parsim.sim.simulate``), when the engine is installed

The textbook assumes equal stages and free sends; the engines see the head's extra work (the
last stage sets the pace, the others idle a little every microbatch) and the sends.

    .venv/bin/python studies/bubble_vs_microbatches/run.py     # -> results.csv, bubble_vs_microbatches.png
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

from matplotlib import rc_context

from parsim.fast import PlanTable, evaluate
from parsim.plots.style import RC, new_figure, save
from parsim.schedules import textbook_bubble_fraction
from parsim.specs import Plan, load_cluster, load_model

HERE = Path(__file__).resolve().parent
PP = 8
MICROBATCHES = (1, 2, 4, 8, 16, 32, 64)
SCHEDULES = [("naive", 1), ("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4)]
MODELS = ("gpt3-175b", "gpt3-2.7b")
COLORS = {"naive": "#7f7f7f", "gpipe": "#e69f00", "1f1b": "#0072b2", "interleaved": "#009e73"}


def plans() -> list[Plan]:
    out = []
    for sched, vpp in SCHEDULES:
        for m in MICROBATCHES:
            if sched == "interleaved" and m % PP:
                continue           # Megatron-LM interleaving needs m divisible by pp
            out.append(Plan(dp=1, tp=1, pp=PP, vpp=vpp, mbs=1, gbs=m, schedule=sched))
    return out


def simulate_bubbles(model, cluster, ps: list[Plan]) -> list[float | None]:
    try:
        from parsim.sim import simulate
    except ImportError:
        return [None] * len(ps)
    return [float(simulate(model, cluster, p).bubble_fraction) for p in ps]


def run(out: Path, with_sim: bool = True) -> list[dict]:
    rows = []
    for name in MODELS:
        model, cluster = load_model(name), load_cluster(f"a100-80g:{PP}")
        ps = plans()
        fast = evaluate(model, cluster, PlanTable.from_plans(ps))
        sim = simulate_bubbles(model, cluster, ps) if with_sim else [None] * len(ps)
        for i, p in enumerate(ps):
            rows.append({"model": name, "schedule": p.schedule, "vpp": p.vpp, "pp": p.pp,
                         "microbatches": p.num_microbatches,
                         "textbook": textbook_bubble_fraction(p.schedule, p.pp, p.num_microbatches, p.vpp),
                         "fast": float(fast.bubble_fraction[i]), "sim": sim[i],
                         "fast_step_time_s": float(fast.step_time_s[i])})
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot(rows, out / "bubble_vs_microbatches.png")
    return rows


def plot(rows: list[dict], path: Path) -> None:
    with rc_context(RC):
        fig = new_figure(11.0, 4.4)
        axes = fig.subplots(1, len(MODELS), sharey=True)
        for ax, name in zip(axes, MODELS):
            for sched, vpp in SCHEDULES:
                sel = [r for r in rows if r["model"] == name and r["schedule"] == sched and r["vpp"] == vpp]
                label = sched if sched != "interleaved" else f"interleaved vpp={vpp}"
                color = COLORS[sched]
                alpha = 0.55 if (sched == "interleaved" and vpp == 4) else 1.0
                x = [r["microbatches"] for r in sel]
                ax.plot(x, [r["textbook"] for r in sel], ls="--", lw=1.0, color=color, alpha=alpha)
                measured = [r["sim"] if r["sim"] is not None else r["fast"] for r in sel]
                ax.plot(x, measured, ls=":" if sched == "gpipe" else "-", lw=2.8 if sched == "gpipe" else 1.6,
                        marker="o", ms=4, color=color, alpha=alpha, label=label)
            ax.plot([], [], ls="--", color="black", lw=1.0, label="textbook formula")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("microbatches per step (m)")
            ax.set_ylim(0, 1)
            ax.grid(color="#e8e8e8", lw=0.6)
            ax.set_title(f"{name}, pp={PP} on 8 A100")
        axes[0].set_ylabel("bubble fraction (idle share of the step)")
        axes[0].legend(fontsize=8)
        engine = "SimPy engine" if rows[0]["sim"] is not None else "fast path"
        fig.suptitle(f"Pipeline bubble: {engine} (solid; GPipe dotted, same as 1F1B) vs textbook (dashed)")
        save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--no-sim", action="store_true", help="fast path and textbook only")
    args = p.parse_args()
    for r in run(args.out, not args.no_sim):
        sim = "   -  " if r["sim"] is None else f"{r['sim']:.3f}"
        print(f"{r['model']:10s} {r['schedule']:12s} vpp={r['vpp']} m={r['microbatches']:3d}  textbook {r['textbook']:.3f}  "
              f"fast {r['fast']:.3f}  sim {sim}")


if __name__ == "__main__":
    main()
