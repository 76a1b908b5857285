"""How fast the SimPy engine simulates one training step of the two largest Megatron plans.

* GPT-3 175B on 1024 A100-80GB: dp 8, tp 8, pp 16, gbs 1536, 1F1B (192 microbatches, 16
  pipeline ranks: 6,144 actions) -- target under 1 s;
* Megatron 1T on 3072 A100-80GB: tp 8, pp 64, dp 6, gbs 3072, 1F1B (512 microbatches, 64
  pipeline ranks: 65,536 actions) -- target under 3 s;

(plans of Narayanan et al. 2021, Table 1), default engine settings (representative ranks,
trace recorded, no per-layer events). Wall-clock and CPU seconds per simulated step and
SimPy events per second, median of 5 runs after one warm-up; the ``Trace`` object is built
on first use of ``result.trace`` and is timed separately. CPU time is given next to wall time
because the machine is shared: on a loaded machine wall time also measures the neighbours.

    .venv/bin/python studies/sim_speed/bench.py        # prints and writes results.txt
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

CASES = [
    ("GPT-3 175B", "gpt3-175b", "a100-80g:1024", "dp=8 tp=8 pp=16 gbs=1536 schedule=1f1b", 1.0),
    ("Megatron 1T", "megatron-1t", "a100-80g:3072", "dp=6 tp=8 pp=64 gbs=3072 schedule=1f1b", 3.0),
]
RUNS = 5
OUT = Path(__file__).resolve().parent / "results.txt"


def measure(model, cluster, plan) -> dict:
    simulate(model, cluster, plan)                       # warm-up (imports, caches)
    walls, cpus, traced = [], [], []
    for _ in range(RUNS):
        w, c = time.perf_counter(), time.process_time()
        r = simulate(model, cluster, plan)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
        r.trace                                          # the Trace is built on first use
        traced.append(time.perf_counter() - w)
    return {"result": r, "wall": statistics.median(walls), "cpu": statistics.median(cpus),
            "traced": statistics.median(traced), "walls": walls, "events": r.num_events}


def main() -> None:
    lines = [f"parsim SimPy engine speed, {time.strftime('%Y-%m-%d %H:%M')}, python {platform.python_version()}, "
             f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start",
             f"median of {RUNS} runs of simulate() per case (representative ranks, trace kept, no per-layer events)",
             ""]
    header = (f"{'case':<12} {'actions':>8} {'events':>8} {'wall s':>7} {'cpu s':>6} {'target':>6} "
              f"{'events/s (wall)':>15} {'events/s (cpu)':>14}  simulated step")
    lines += [header, "-" * len(header)]
    for label, model, cluster, plan, target in CASES:
        m = measure(load_model(model), load_cluster(cluster), parse_plan(plan))
        r = m["result"]
        actions = sum(1 for e in r.trace.events if e.stream == "compute" and e.layer == -1 and e.kind in "FB")
        verdict = "ok" if m["wall"] < target else ("ok (cpu)" if m["cpu"] < target else "MISSED")
        lines.append(f"{label:<12} {actions:>8,} {m['events']:>8,} {m['wall']:>7.2f} {m['cpu']:>6.2f} "
                     f"{'<' + format(target, 'g') + ' s':>6} {m['events'] / m['wall']:>15,.0f} "
                     f"{m['events'] / m['cpu']:>14,.0f}  {r.step_time_s:.2f} s, MFU {r.mfu:.1%}  [{verdict}]")
        lines.append(f"{'':<12} wall times: " + ", ".join(f"{w:.2f}" for w in m["walls"])
                     + f"; with the Trace built ({len(r.trace.events):,} events): {m['traced']:.2f} s")
    lines += ["", f"load average {os.getloadavg()[0]:.1f} at the end"]
    text = "\n".join(lines)
    print(text)
    OUT.write_text(text + "\n")


if __name__ == "__main__":
    main()
