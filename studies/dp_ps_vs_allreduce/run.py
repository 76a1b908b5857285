"""Data parallelism through a parameter server (or single-process torch.nn.DataParallel)
versus all-reduce DDP, as the device count grows.

GPT-3 1.3B (fits one A100-80GB), pure data parallelism (tp = pp = 1, ZeRO-0), one sequence of
2048 tokens per device per microbatch and 4 microbatches per step (gbs = 4 x devices: weak
scaling), on 1 to 128 A100 (DGX nodes of 8, 8 x HDR InfiniBand each). Both ways move the
gradients in 25 MiB buckets while the last backward runs:

* ``dp_impl=allreduce``: ring / tree all-reduce, 2 (n - 1)/n S per device (PyTorch DDP, Li et
  al. 2020): the time per device stays flat as n grows;
* ``dp_impl=ps``: every worker's gradients into one server and the parameters back out,
  (n - 1) S through the server's link each way (Li et al. 2014): grows linearly with n.

Each point is one SimPy-simulated step (and the fast path beside it).

    .venv/bin/python studies/dp_ps_vs_allreduce/run.py      # -> results.csv, ps_vs_allreduce.png
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

from matplotlib import rc_context

from parsim.fast import PlanTable, evaluate
from parsim.plots.style import RC, new_figure, save
from parsim.sim import simulate
from parsim.specs import Plan, load_cluster, load_model

HERE = Path(__file__).resolve().parent
DEVICES = (1, 2, 4, 8, 16, 32, 64, 128)
IMPLS = ("allreduce", "ps")
COLORS = {"allreduce": "#0072b2", "ps": "#d55e00"}


def run(out: Path) -> list[dict]:
    model = load_model("gpt3-1.3b")
    rows = []
    for n in DEVICES:
        cluster = load_cluster(f"a100-80g:{n}")
        plans = [Plan(dp=n, mbs=1, gbs=4 * n, dp_impl=impl) for impl in IMPLS]
        fast = evaluate(model, cluster, PlanTable.from_plans(plans))
        for i, p in enumerate(plans):
            sim = simulate(model, cluster, p, record_events=False)
            rows.append({"devices": n, "dp_impl": p.dp_impl, "nodes": cluster.num_nodes,
                         "sim_step_time_s": sim.step_time_s, "sim_tokens_per_s": sim.tokens_per_s,
                         "sim_tokens_per_s_per_device": sim.tokens_per_s / n, "sim_mfu": sim.mfu,
                         "sim_exposed_dp_s": sim.exposed_comm_s["dp"],
                         "fast_step_time_s": float(fast.step_time_s[i]),
                         "fast_tokens_per_s_per_device": float(fast.tokens_per_s[i]) / n})
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot(rows, out / "ps_vs_allreduce.png")
    return rows


def plot(rows: list[dict], path: Path) -> None:
    with rc_context(RC):
        fig = new_figure(10.0, 4.2)
        ax1, ax2 = fig.subplots(1, 2)
        for impl in IMPLS:
            sel = [r for r in rows if r["dp_impl"] == impl]
            x = [r["devices"] for r in sel]
            label = "all-reduce (DDP)" if impl == "allreduce" else "parameter server / DataParallel"
            ax1.plot(x, [r["sim_tokens_per_s_per_device"] for r in sel], marker="o", color=COLORS[impl], label=label)
            ax1.plot(x, [r["fast_tokens_per_s_per_device"] for r in sel], ls=":", color=COLORS[impl], lw=1)
            multi = [r for r in sel if r["devices"] > 1]           # one device has no DP traffic (log axis)
            ax2.plot([r["devices"] for r in multi], [r["sim_exposed_dp_s"] * 1e3 for r in multi], marker="o",
                     color=COLORS[impl], label=label)
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("devices (data-parallel degree)")
            ax.grid(color="#e8e8e8", lw=0.6, which="both")
            ax.axvline(8, color="#999999", lw=0.8, ls="--")
            ax.text(7.6, 0.97, "one node  ", transform=ax.get_xaxis_transform(), ha="right", va="top", fontsize=7,
                    color="#666666")
            ax.text(8.4, 0.97, "  several nodes", transform=ax.get_xaxis_transform(), ha="left", va="top", fontsize=7,
                    color="#666666")
        ax1.set_ylim(0, 1.15 * max(r["sim_tokens_per_s_per_device"] for r in rows))
        ax1.set_ylabel("tokens/s per device (SimPy; dotted: fast path)")
        ax1.set_title("throughput per device")
        ax2.set_yscale("log")
        ax2.set_ylabel("exposed DP communication per step (ms, log)")
        ax2.set_title("gradient sync left on the critical path")
        ax1.legend(fontsize=8, loc="lower left")
        fig.suptitle("GPT-3 1.3B, pure data parallel, 4 x 2048 tokens per device per step, A100 DGX nodes")
        save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args()
    for r in run(args.out):
        print(f"{r['devices']:4d} devices {r['dp_impl']:9s} step {r['sim_step_time_s']:.3f} s (fast {r['fast_step_time_s']:.3f})"
              f"  {r['sim_tokens_per_s_per_device']:,.0f} tok/s/device  exposed DP {r['sim_exposed_dp_s'] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
