"""Llama 3 405B on 16,384 H100 (TP8 PP16 DP128): variability, stragglers, failures, time-to-train.

    .venv/bin/python studies/at_scale/run.py [--steps 100] [--workers N] [--cluster-address ADDR]

Writes results.json, results.txt (what it prints), steps.png, critical.png, goodput.png here.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL, CLUSTER = "llama3-405b", "h100-sxm:16384"
# Dubey et al. 2024 Sec. 3.3.2 / Table 4, as studies/public_runs runs it
PLAN = "dp=128 tp=8 pp=16 vpp=4 mbs=1 gbs=2048 schedule=interleaved sp=true zero=2 dtype=bf16 recompute=none"
TOKENS = 15.6e12                  # Llama 3 405B pre-training tokens (Dubey et al. 2024, Sec. 3.1)
SLOW = 1.2                        # a device or node computing 20% slower (e.g. power / thermal throttled)
NIC = 4.0                         # a NIC at a quarter of its bandwidth (e.g. a link trained down to 100G of 400G)


def what_ifs(dp: int, tp: int) -> dict[str, dict]:
    """Persistent faults, one at a time. rank = (pp_rank * dp + dp_rank) * tp + tp_rank; a node
    holds 8 consecutive ranks = one TP group (tp = 8)."""
    last_stage_node = (15 * dp + 5) * tp // 8
    return {
        "one slow GPU (TP rank 3 of stage 7, replica 5)": {"slow_ranks": {(7 * dp + 5) * tp + 3: SLOW}},
        "slow node at pipeline stage 0 (replica 5)": {"slow_nodes": {(0 * dp + 5) * tp // 8: SLOW}},
        "slow node at pipeline stage 7 (replica 5)": {"slow_nodes": {(7 * dp + 5) * tp // 8: SLOW}},
        "slow node at pipeline stage 15 (replica 5)": {"slow_nodes": {last_stage_node: SLOW}},
        "degraded NIC, stage 7 node (replica 5)": {"degraded_nics": {(7 * dp + 5) * tp // 8: NIC}},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--sigma", type=float, default=0.02, help="lognormal sigma of per-step compute noise [0.02]")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--cluster-address", default=None)
    ap.add_argument("--out", default=str(HERE))
    args = ap.parse_args()
    import parsim.api.run as planning
    from parsim.cli.plan_run import plot as plot_goodput
    from parsim.cli.plan_run import report as run_report
    from parsim.plots.at_scale import plot_critical_share, plot_step_distribution
    out, wall, lines = Path(args.out), time.perf_counter(), []
    say = lambda s="": (lines.append(s), print(s))   # noqa: E731
    where = dict(workers=args.workers, address=args.cluster_address)

    mc = planning.monte_carlo(MODEL, CLUSTER, PLAN, steps=args.steps, variability=f"lognormal:{args.sigma}",
                              seed=0, **where)
    q, clean = mc.quantiles(), mc.clean_step_time_s
    say(f"{MODEL} on {CLUSTER}  plan: {PLAN}")
    say(f"clean step {clean:.3f} s; {args.steps} steps with lognormal:{args.sigma} per-device compute noise "
        f"(representative refinement, {sum(s.simulated for s in mc.samples)} SimPy runs, {mc.wall_s:.0f} s):")
    say("  " + "  ".join(f"{k} {q[k]:.3f} s ({q[k] / clean - 1:+.1%})" for k in ("mean", "p50", "p90", "p99")))
    share = mc.critical_rank_share()
    stages = {}
    for s in mc.samples:
        stages[s.critical_stage] = stages.get(s.critical_stage, 0) + 1 / len(mc.samples)
    say("  critical pipeline stage (share of steps): "
        + ", ".join(f"{p}: {v:.0%}" for p, v in sorted(stages.items(), key=lambda kv: -kv[1])[:6]))
    say(f"  {len(share)} distinct critical ranks in {len(mc.samples)} steps; links the step waits on: "
        + ", ".join(f"{k} {v:.1%}" for k, v in mc.critical_link_share().items()))
    plot_step_distribution(mc.step_times, clean, out / "steps.png",
                           f"Llama 3 405B, 16,384 H100: {args.steps} steps, lognormal:{args.sigma}")
    plot_critical_share(stages, mc.critical_link_share(), out / "critical.png",
                        "where the critical rank of a step sits", xlabel="pipeline stage of the critical rank")

    say("")
    say(f"what one slow part costs (persistent, no noise; x{SLOW} compute, NIC x{NIC} transfer time):")
    costs = {}
    for name, faults in what_ifs(128, 8).items():
        r = planning.monte_carlo(MODEL, CLUSTER, PLAN, steps=1, workers=1, **faults)
        costs[name] = r.step_times[0]
        say(f"  {name:45s} {r.step_times[0]:.3f} s  {r.step_times[0] / clean - 1:+.1%}")

    say("")
    run = planning.plan_run(MODEL, CLUSTER, PLAN, tokens=TOKENS, variability=f"lognormal:{args.sigma}",
                            steps=min(args.steps, 30), **where)
    say(run_report(run))
    plot_goodput(run, str(out / "goodput.png"))
    say(f"\n(total {time.perf_counter() - wall:.0f} s)")
    (out / "results.txt").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps({"montecarlo": mc.to_dict(), "what_if_step_s": costs,
                                                  "run": run.to_dict()}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
