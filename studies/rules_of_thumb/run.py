"""The classic rules of thumb for choosing a parallel plan, checked against the sweep.

Rules (Hugging Face Transformers docs, "Efficient training on multiple GPUs"; Narayanan et al.
2021 Sec. 3.3; Rajbhandari et al. 2020, Ren et al. 2021):

* fits one GPU -> plain training; does not fit one GPU -> ZeRO-Offload
* one node, model fits one GPU -> DDP; does not -> ZeRO (or TP/PP inside the node)
* a layer too big for one GPU -> TP (or ZeRO-3)
* several nodes, fast links -> ZeRO, or PP + TP + DP
* several nodes, slow links -> TP inside a node, PP across nodes, DP with ZeRO-1

Each scenario is swept on the A100-80GB DGX profile (8 x 200 Gb/s InfiniBand per node) and,
for the multi-node ones, on the same nodes with one 100 Gb/s NIC each
(``a100-80g-slow-links.yaml`` in this folder). The fast path ranks every valid plan; the best
``--resimulate`` plans overall and the best that follow the rule are re-run in the SimPy engine.
A rule "holds" when the best plan follows it; otherwise the table gives what the sweep found
and how much faster it is than the best plan the rule allows.

    .venv/bin/python studies/rules_of_thumb/run.py      # -> results.csv, rules_vs_sweep.png
"""
from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib import rc_context

from parsim.costs import device_capacity, layer_params, state_bytes
from parsim.plots.style import RC, new_figure, save
from parsim.specs import load_cluster, load_model
from parsim.study.resimulate import resimulate
from parsim.study.space import build_space
from parsim.study.sweep import run_sweep

HERE = Path(__file__).resolve().parent
SLOW = HERE / "a100-80g-slow-links.yaml"
HEADROOM = 0.1


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str
    devices: int
    gbs: int
    slow_links: bool
    rule: str


SCENARIOS = [
    Scenario("fits one GPU", "gpt3-1.3b", 1, 16, False, "plain training (no offload)"),
    Scenario("does not fit one GPU", "gpt3-13b", 1, 16, False, "ZeRO-Offload"),
    Scenario("one node, fits one GPU", "gpt3-1.3b", 8, 64, False, "DDP (pure data parallel)"),
    Scenario("one node, does not fit one GPU", "gpt3-13b", 8, 64, False, "ZeRO, or TP/PP inside the node"),
    Scenario("layer too big for one GPU", "megatron-1t", 512, 512, False, "TP (or ZeRO-3)"),
    Scenario("multi-node, fast links", "gpt3-13b", 64, 512, False, "ZeRO, or PP + TP + DP"),
    Scenario("multi-node, slow links", "gpt3-13b", 64, 512, True, "TP in node, PP across, ZeRO-1"),
    Scenario("multi-node, fast links", "gpt3-175b", 256, 1024, False, "ZeRO, or PP + TP + DP"),
    Scenario("multi-node, slow links", "gpt3-175b", 256, 1024, True, "TP in node, PP across, ZeRO-1"),
]


def follows(s: Scenario, row: dict, dpn: int) -> bool:
    dp, tp, pp, zero, offload = row["dp"], row["tp"], row["pp"], row["zero"], row["offload"]
    if s.name == "fits one GPU":
        return offload == "none"
    if s.name == "does not fit one GPU":
        return offload != "none"
    if s.name == "one node, fits one GPU":
        return tp == 1 and pp == 1 and zero == 0 and offload == "none"
    if s.name == "one node, does not fit one GPU":
        return zero >= 1 or tp > 1 or pp > 1
    if s.name == "layer too big for one GPU":
        return tp > 1 or zero == 3
    if "fast links" in s.name:
        # ZeRO data parallelism (TP inside a node allowed), or the 3-D PP + TP + DP
        return (pp == 1 and zero >= 1 and tp <= dpn) or (tp > 1 and pp > 1 and dp > 1)
    return 1 < tp <= dpn and pp > 1 and zero <= 1 and offload == "none"


def run_scenario(s: Scenario, resim: int, workers: int) -> dict:
    model = load_model(s.model)
    cluster = load_cluster(f"a100-80g:{s.devices}", profile=str(SLOW) if s.slow_links else None)
    result = run_sweep(model, cluster, build_space(gbs=s.gbs), headroom=HEADROOM, resimulate_top=resim,
                       workers=workers)
    df = result.frame
    fit = df[df["fits"]]
    dpn = cluster.devices_per_node
    rule_rows = fit[[follows(s, r, dpn) for r in fit.to_dict(orient="records")]]
    best = fit.iloc[0].to_dict() if len(fit) else None
    best_rule = None
    if len(rule_rows):
        top = rule_rows.head(max(resim, 1))
        sims = resimulate(model, cluster, top["plan"].tolist(), workers=workers) if resim else []
        cand = [(x["tokens_per_s"], x["plan"]) for x in sims if x["peak_memory_bytes"] <= device_capacity(cluster) *
                (1 - HEADROOM)] or [(r["tokens_per_s"], r["plan"]) for r in top.to_dict(orient="records")]
        best_rule = max(cand)
    sb = state_bytes("bf16")
    layer_gib = layer_params(model, 1) * (sb.param + sb.grad + sb.optimizer) / 2**30
    row = {"scenario": s.name, "model": s.model, "devices": s.devices, "gbs": s.gbs,
           "links": "slow (1 x 100 GbE per node)" if s.slow_links else ("fast (8 x HDR IB per node)" if s.devices > 8 else "-"),
           "rule": s.rule, "layer_states_gib": round(layer_gib, 1), "num_plans": result.num_plans,
           "num_fit": result.num_fit}
    if best is None:
        row.update(best_plan="nothing fits", best_tokens_per_s=0.0, best_follows_rule=False,
                   best_rule_plan="", best_rule_tokens_per_s=0.0, sweep_gain_pct=0.0)
        return row
    row.update(best_plan=best["plan"], best_tokens_per_s=float(best["tokens_per_s"]), best_source=best["source"],
               best_follows_rule=follows(s, best, dpn))
    if best_rule is None:
        row.update(best_rule_plan="no fitting plan follows the rule", best_rule_tokens_per_s=0.0, sweep_gain_pct=np.nan)
    else:
        row.update(best_rule_plan=best_rule[1], best_rule_tokens_per_s=float(best_rule[0]),
                   sweep_gain_pct=100.0 * (float(best["tokens_per_s"]) / float(best_rule[0]) - 1.0))
    return row


def _short(plan: str) -> str:
    """The degrees and the ZeRO stage of a plan string."""
    keep = ("dp=", "tp=", "pp=", "zero=", "mbs=")
    return " ".join(t for t in plan.split() if t.startswith(keep)) + ("" if "zero=" in plan else " zero=0")


def plot(rows: list[dict], path: Path) -> None:
    with rc_context(RC):
        fig = new_figure(8.0, 0.45 * len(rows) + 1.6)
        ax = fig.add_subplot()
        labels = [f"{r['scenario']}: {r['model']} on {r['devices']}" for r in rows]
        gains = [0.0 if not np.isfinite(r.get("sweep_gain_pct", np.nan)) else max(r["sweep_gain_pct"], 0.0)
                 for r in rows]
        colors = ["#009e73" if r.get("best_follows_rule") else "#d55e00" for r in rows]
        y = np.arange(len(rows))[::-1]
        ax.barh(y, gains, color=colors, height=0.6)
        for yi, g, r in zip(y, gains, rows):
            text = "rule holds" if r.get("best_follows_rule") else f"sweep +{g:.1f}%: {_short(r['best_plan'])}"
            if not np.isfinite(r.get("sweep_gain_pct", 0.0)):
                text = "no plan of the rule fits"
            ax.text(g + 0.3, yi, text, va="center", fontsize=8)
        ax.set_yticks(y, labels, fontsize=8)
        ax.set_xlabel("throughput of the sweep's best plan over the best plan the rule allows (%)")
        ax.set_xlim(0, max(gains + [5.0]) * 2.2)
        ax.set_title("Rules of thumb vs the sweep (green: the best plan follows the rule)")
        ax.grid(axis="x", color="#e8e8e8", lw=0.6)
        save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resimulate", type=int, default=5, help="SimPy re-runs per scenario and side [5]")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    rows = []
    for s in SCENARIOS:
        row = run_scenario(s, args.resimulate, args.workers)
        rows.append(row)
        print(f"{s.name:34s} {s.model:12s} x{s.devices:4d} {'slow' if s.slow_links else 'fast'}: "
              f"{'HOLDS' if row.get('best_follows_rule') else 'sweep finds better'}  best {row['best_plan']} "
              f"({row['best_tokens_per_s']:,.0f} tok/s); rule's best {row['best_rule_plan']} "
              f"({row['best_rule_tokens_per_s']:,.0f} tok/s, gain {row['sweep_gain_pct']:.1f}%)")
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(HERE / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    plot(rows, HERE / "rules_vs_sweep.png")


if __name__ == "__main__":
    main()
