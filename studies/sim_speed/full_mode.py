"""How fast full mode (every device, stragglers possible) is: by classes of identical ranks
(``parsim.sim.symmetry``, the default) against rank by rank (``symmetric=False``, the engine
before issue 22), side by side in one run, with and without a straggler.

* GPT-3 175B on 1024 A100-80GB: dp 8, tp 8, pp 16, gbs 1536, 1F1B (Narayanan et al. 2021,
  Table 1) -- target: full mode <= 4 s per simulated step;
* Llama 3 405B on 16384 H100: tp 8, pp 16, dp 128, gbs 2048, seq 8192, SP, ZeRO-2-like
  sharding, interleaved v4 (Dubey et al. 2024, Table 4 and Sec. 3.3.2) -- target <= 60 s.
  Rank by rank it is ~4 x 10^7 SimPy events (hours here), so it runs only with --old-405b.

Median wall and CPU seconds of ``--runs`` runs by classes and ``--old-runs`` rank by rank
(trace kept, as ``parsim simulate``),
SimPy events, and whether the two engines report the same numbers (every ``--json`` field but
wall clock and event count, and every rank's busy / exposed / finish time and peak memory,
within 1e-9 relative).

    .venv/bin/python studies/sim_speed/full_mode.py [--runs N] [--old-runs N] [--old-405b]   # full_mode.txt
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from pathlib import Path

from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

GPT3 = ("GPT-3 175B / 1024", "gpt3-175b", "a100-80g:1024", "dp=8 tp=8 pp=16 gbs=1536 schedule=1f1b", 4.0)
LLAMA = ("Llama-3 405B / 16384", "llama3-405b", "h100-sxm:16384",
         "dp=128 tp=8 pp=16 mbs=1 gbs=2048 sp=true zero=2 recompute=none schedule=interleaved vpp=4", 60.0)
STRAGGLER = {5: 1.5}             # global rank 5 (pipeline rank 0, DP 0, TP 5) computes 1.5x slower
OUT = Path(__file__).resolve().parent / "full_mode.txt"


def measure(specs, slowdown, symmetric: bool, runs: int) -> dict:
    walls, cpus, r = [], [], None
    for _ in range(runs):
        r = None                                # let the last run's memory go first
        w, c = time.perf_counter(), time.process_time()
        r = simulate(*specs, mode="full", slowdown=slowdown, symmetric=symmetric)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return {"result": r, "wall": statistics.median(walls), "cpu": statistics.median(cpus), "walls": walls}


def numbers(r) -> dict:
    """Everything the result reports but wall clock and engine work, per rank included."""
    out = {k: v for k, v in r.to_dict().items() if k not in ("num_events", "sim_wall_s")}
    rec = r.recorder
    out["per_rank"] = [(rec.busy[k], rec.exposed[k], rec.finish[k], r.timelines[k].peak) for k in sorted(rec.busy)]
    return out


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def case_lines(label, specs, target, slowdown, runs: tuple[int, int], old: bool) -> list[str]:
    new = measure(specs, slowdown, True, runs[0])
    rn = new["result"]
    what = "straggler 5=1.5" if slowdown else "no straggler"
    lines = [f"{label}, {what}: {len(rn.simulated_ranks):,} ranks, step {rn.step_time_s:.3f} s"]
    lines.append(f"  by classes   {rn.num_events:>11,} events  wall {new['wall']:7.2f} s  cpu {new['cpu']:7.2f} s"
                 f"  (target <= {target:g} s: {'ok' if new['wall'] <= target else 'MISSED'}; runs "
                 + ", ".join(f"{w:.2f}" for w in new["walls"]) + ")")
    if not old:
        lines.append("  rank by rank not run (--old-405b)")
        return lines
    numbers_new, events_new = numbers(rn), rn.num_events
    del rn, new["result"]                       # the rank-by-rank run needs the memory
    ref = measure(specs, slowdown, False, runs[1])
    ro = ref["result"]
    lines.append(f"  rank by rank {ro.num_events:>11,} events  wall {ref['wall']:7.2f} s  cpu {ref['cpu']:7.2f} s"
                 "  (runs " + ", ".join(f"{w:.2f}" for w in ref["walls"]) + ")")
    lines.append(f"  speed-up {ref['wall'] / new['wall']:.1f}x wall, {ref['cpu'] / new['cpu']:.1f}x cpu; "
                 f"{ro.num_events / events_new:.0f}x fewer events; same numbers: "
                 f"{'yes' if same(numbers(ro), numbers_new) else 'NO'}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs by classes per case [5]")
    ap.add_argument("--old-runs", type=int, default=1, help="runs rank by rank per case [1]: minutes each")
    ap.add_argument("--old-405b", action="store_true", help="also run the 405B case rank by rank (hours)")
    args = ap.parse_args()
    lines = [f"parsim full-mode speed, {time.strftime('%Y-%m-%d %H:%M')}, python {platform.python_version()}, "
             f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start",
             f"median of {args.runs} runs by classes and {args.old_runs} rank by rank per case "
             "(trace kept, no per-layer events)", ""]
    for label, model, cluster, plan, target in (GPT3, LLAMA):
        specs = (load_model(model), load_cluster(cluster), parse_plan(plan))
        old = label.startswith("GPT") or args.old_405b
        for slowdown in (None, STRAGGLER):
            lines += case_lines(label, specs, target, slowdown, (args.runs, args.old_runs), old)
            print("\n".join(lines[-4:]), flush=True)
        lines.append("")
    lines.append(f"load average {os.getloadavg()[0]:.1f} at the end")
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
