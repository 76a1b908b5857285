"""ZeRO 0-3 (+ offload) memory per device vs data-parallel degree, Megatron 7.5B.

The model of the ZeRO paper's Figure 1 (7.5B parameters, Rajbhandari et al. 2020) on A100
80 GB, pure data parallelism (tp = pp = 1), one sequence per device (mbs = 1, gbs = dp),
bf16 mixed precision, activations with selective recomputation. For each DP degree and each
ZeRO stage (and ZeRO-Offload) the peak memory per device comes from the fast path, which is
``parsim.costs.memory_by_stage`` to the byte; the model-state part is also given in the ZeRO
paper's own convention (2 + 2 + K bytes per parameter, K = 12) to compare with Figure 1.

    .venv/bin/python studies/zero_memory_7b/run.py          # -> results.csv, memory_vs_dp.png
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
from matplotlib import rc_context

from parsim.costs import device_capacity, total_params, zero_model_state_bytes
from parsim.fast import PlanTable, evaluate
from parsim.plots.style import CAPACITY_COLOR, GIB, RC, new_figure, save
from parsim.specs import Plan, load_cluster, load_model

HERE = Path(__file__).resolve().parent
VARIANTS = [(0, "none"), (1, "none"), (2, "none"), (3, "none"), (1, "optimizer"), (3, "optimizer+params")]
COLORS = {0: "#000000", 1: "#0072b2", 2: "#009e73", 3: "#d55e00"}


def label(zero: int, offload: str) -> str:
    return f"ZeRO-{zero}" + ("" if offload == "none" else f" + offload {offload}")


def run(out: Path, max_dp: int = 1024) -> list[dict]:
    model = load_model("megatron-7.5b")
    psi = total_params(model)
    rows = []
    dps = [2 ** k for k in range(int(np.log2(max_dp)) + 1)]
    for dp in dps:
        cluster = load_cluster(f"a100-80g:{dp}")
        plans = [Plan(dp=dp, gbs=dp, mbs=1, zero=z, offload=o, recompute="selective") for z, o in VARIANTS]
        res = evaluate(model, cluster, PlanTable.from_plans(plans))
        for i, (z, o) in enumerate(VARIANTS):
            states = res.peak_params_bytes[i] + res.peak_grads_bytes[i] + res.peak_optimizer_bytes[i]
            rows.append({"dp": dp, "zero": z, "offload": o, "variant": label(z, o),
                         "peak_memory_bytes": float(res.peak_memory_bytes[i]),
                         "model_state_bytes": float(states),
                         "activation_bytes": float(res.peak_activations_bytes[i]),
                         "other_bytes": float(res.peak_other_bytes[i]),
                         "zero_paper_state_bytes": zero_model_state_bytes(psi, dp, z) if o == "none" else float("nan"),
                         "capacity_bytes": device_capacity(cluster),
                         "fits": bool(res.peak_memory_bytes[i] <= device_capacity(cluster))})
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot(rows, out / "memory_vs_dp.png", psi)
    return rows


def plot(rows: list[dict], path: Path, psi: float) -> None:
    with rc_context(RC):
        fig = new_figure(7.2, 4.6)
        ax = fig.add_subplot()
        for z, o in VARIANTS:
            sel = [r for r in rows if r["zero"] == z and r["offload"] == o]
            ax.plot([r["dp"] for r in sel], [r["peak_memory_bytes"] / GIB for r in sel], color=COLORS[z],
                    ls="-" if o == "none" else ("--" if o == "optimizer" else ":"), marker="o", ms=3,
                    lw=1.6, label=label(z, o))
        cap = rows[0]["capacity_bytes"] / GIB
        ax.axhline(cap, color=CAPACITY_COLOR, ls="--", lw=1.2)
        ax.text(1, cap * 1.04, f"usable memory {cap:.0f} GiB", color=CAPACITY_COLOR, fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("data-parallel degree (devices)")
        ax.set_ylabel("peak memory per device (GiB, log scale)")
        ax.set_title(f"Megatron 7.5B ({psi / 1e9:.2f}B params), A100 80 GB, mbs=1, selective recompute, bf16")
        ax.grid(color="#e8e8e8", lw=0.6, which="both")
        ax.legend(fontsize=8, loc="upper right")
        save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--max-dp", type=int, default=1024)
    args = p.parse_args()
    rows = run(args.out, args.max_dp)
    for r in rows:
        if r["dp"] in (1, 8, 64, 1024):
            print(f"dp={r['dp']:5d} {r['variant']:32s} peak {r['peak_memory_bytes'] / GIB:8.1f} GiB  states "
                  f"{r['model_state_bytes'] / GIB:7.1f} GiB  (ZeRO paper convention {r['zero_paper_state_bytes'] / 1e9:6.1f} GB)"
                  f"  {'fits' if r['fits'] else 'does not fit'}")


if __name__ == "__main__":
    main()
