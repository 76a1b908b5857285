"""Merak's techniques (b)-(d) measured on the torch executor here, next to the simulator.

Model cpu-small (8 layers, hidden 512, seq 128) in fp32 on 2 gloo ranks. Baseline: 1F1B with
full recomputation. For each technique, the same plan with it switched on:

* (b) shifted critical path: pp=2, the last stage does not recompute;
* (c) stage-aware recomputation: pp=2, the fewest recomputed layers per stage that fit a
  per-rank memory budget (``parsim.costs.stage_aware_recompute_layers``; the budget is set
  between the no-recompute and the full-recompute footprints, as a GPU would impose);
* (d) sub-pipelined TP: tp=2, mbs=2, each microbatch split in two halves inside every layer.

Every plan runs ``ROUNDS`` times, the plans of a round one after another in one set of
processes (baseline and variant measured minutes apart at most); the median over rounds of
each plan's timed step counts. Speedup = baseline / variant, measured and simulated
(``parsim.sim.simulate`` with ``calibration/profiles/cpu-calibrated.yaml``).

    .venv/bin/python studies/merak/executor_check.py | tee studies/merak/executor_check.txt
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PROFILE = str(ROOT / "calibration/profiles/cpu-calibrated.yaml")
MODEL = "cpu-small"
STEPS, WARMUP, ROUNDS = 3, 2, 3


def plans() -> list[tuple[str, str, str]]:
    """(technique, baseline plan, variant plan)."""
    from parsim.costs import memory_by_stage, stage_aware_recompute_layers
    from parsim.specs import load_cluster, load_model, parse_plan

    model = load_model(MODEL)
    pp_base = "pp=2 mbs=1 gbs=8 schedule=1f1b recompute=full dtype=fp32"
    cluster = load_cluster("cpu:2", profile=PROFILE)
    # a budget halfway between rank 0's footprint with every layer recomputed and with none
    full = memory_by_stage(model, parse_plan(pp_base), cluster)[0].total
    none = memory_by_stage(model, parse_plan(pp_base.replace("recompute=full", "recompute=none")), cluster)[0].total
    budget = (full + none) / 2
    layers = stage_aware_recompute_layers(model, parse_plan(pp_base), cluster, memory_budget=budget)
    aware = pp_base.replace("recompute=full", "recompute=stage-aware recompute_layers=" + ",".join(map(str, layers)))
    print(f"(c) memory budget per rank {budget / 2**20:.1f} MiB (full recompute {full / 2**20:.1f}, "
          f"none {none / 2**20:.1f}): recompute_layers={','.join(map(str, layers))}")
    tp_base = "tp=2 mbs=2 gbs=8 recompute=full dtype=fp32"
    return [
        ("(b) shifted critical path", pp_base, pp_base + " shifted_critical_path=true"),
        ("(c) stage-aware recompute", pp_base, aware),
        ("(d) sub-pipelined TP", tp_base, tp_base + " tp_overlap=subpipe"),
    ]


def main() -> int:
    from parsim.executor import ExecutorConfig, RunSpec, run_plans
    from parsim.sim import simulate
    from parsim.specs import load_cluster, load_model, parse_plan

    model = load_model(MODEL)
    cases = plans()
    texts = list(dict.fromkeys(t for _, base, variant in cases for t in (base, variant)))
    config = ExecutorConfig(steps=STEPS, warmup=WARMUP, track_memory=False)
    times: dict[str, list[float]] = {t: [] for t in texts}
    for r in range(ROUNDS):
        order = texts if r % 2 == 0 else texts[::-1]     # alternate the order between rounds
        results = run_plans([RunSpec(model, parse_plan(t), config) for t in order])
        for t, res in zip(order, results):
            times[t].append(res.step_time_s)
        print(f"round {r + 1}/{ROUNDS}: " + ", ".join(f"{times[t][-1]:.2f}" for t in texts), file=sys.stderr)
    cluster = load_cluster("cpu:2", profile=PROFILE)
    pred = {t: simulate(model, cluster, parse_plan(t)).step_time_s for t in texts}
    meas = {t: statistics.median(v) for t, v in times.items()}
    print(f"model {MODEL}, 2 gloo ranks, fp32; executor: {ROUNDS} rounds x {STEPS} steps ({WARMUP} warm-up), "
          "median of rounds; simulator: cpu-calibrated profile")
    print(f"{'plan':76s} {'measured s':>10s} {'rounds':>22s} {'simulated s':>11s}")
    for t in texts:
        print(f"{t:76s} {meas[t]:10.2f} {' '.join(f'{x:.2f}' for x in times[t]):>22s} {pred[t]:11.2f}")
    print()
    print(f"{'technique':28s} {'measured speedup':>16s} {'simulated speedup':>17s}")
    for name, base, variant in cases:
        print(f"{name:28s} {meas[base] / meas[variant]:15.3f}x {pred[base] / pred[variant]:16.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
