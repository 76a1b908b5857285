"""Why the wide model's dp=4 ZeRO-2 plan misses by the most (-22.8 % in run_20261203b_zen4, the
held-out max): the plan launched again and again with ``parsim execute``, as ``parsim validate``
launches it, under each host memory policy (``executor.host_alloc``). Per launch: the step times,
their median (what validate scores), the traced step's FSDP2 all-gathers per rank (the first is
the root unit: both 16000 x 768 vocabulary tables, 94 MiB gathered, 23.4 MiB a rank), and the
minor page faults and kernel seconds of the busiest rank (read from ``/proc`` every 0.5 s while it
runs: the ranks are the launcher's forkserver's children).

    .venv/bin/python studies/validation_cpu/heldout/root_gather.py [LAUNCHES] > studies/validation_cpu/heldout/root_gather.txt

About 35 s a launch (LAUNCHES under ``keep``, 2 under ``system``; default 6: ~4.5 min); times
the machine, so run it alone.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLAN = "dp=4 mbs=1 gbs=8 zero=2 dtype=fp32"
STEPS, WARMUP = 5, 1
TICK = os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (``/proc/PID/task/TID/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def sample(pid: int, stop: threading.Event, last: dict) -> None:
    """{pid: (minor faults, user s, system s)} of ``pid``'s descendants, the last reading of each."""
    while not stop.is_set():
        for p in descendants(pid):
            try:
                fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            last[p] = (int(fields[7]), int(fields[11]) / TICK, int(fields[12]) / TICK)
        stop.wait(0.5)


def launch(policy: str, trace_dir: Path) -> dict:
    env = {**os.environ, "PARSIM_HOST_MEMORY": policy, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "parsim", "execute", "--model", str(HERE / "model_wide.yaml"), "--plan", PLAN,
           "--steps", str(STEPS), "--warmup", str(WARMUP), "--trace-dir", str(trace_dir), "--no-memory", "--json"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    stop, last = threading.Event(), {}
    watcher = threading.Thread(target=sample, args=(proc.pid, stop, last), daemon=True)
    watcher.start()
    out, _ = proc.communicate(timeout=600)
    stop.set()
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"parsim execute failed ({proc.returncode}) under {policy}")
    result = json.loads(out)
    gathers = []
    for rank in range(4):
        events = json.loads((trace_dir / f"rank{rank}.json").read_text())["traceEvents"]
        gathers.append([e["dur"] / 1e3 for e in events if e.get("name") == "zero_allgather"])
    busiest = max(last.values(), key=lambda v: v[1] + v[2]) if last else (0, 0.0, 0.0)
    return dict(steps=result["step_times_s"][WARMUP:], median=result["step_time_s"], traced=result["trace_step"],
                gathers=gathers, faults=busiest[0], user=busiest[1], system=busiest[2])


def main(launches: int) -> None:
    print(f"heldout-wide {PLAN}, {STEPS} steps ({WARMUP} warm-up) a launch; the traced step's FSDP2 all-gathers"
          f" (ms, per rank: root unit, layer 0, layer 1); the busiest rank's minor faults and CPU seconds", flush=True)
    roots: dict[str, list[float]] = {}
    medians: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k, policy in enumerate(["keep"] * launches + ["system"] * 2):
            r = launch(policy, Path(tmp) / f"launch{k}")
            root = statistics.median(g[0] for g in r["gathers"])
            roots.setdefault(policy, []).append(root)
            medians.setdefault(policy, []).append(r["median"])
            steps = " ".join(f"{s:.2f}" for s in r["steps"])
            layers = " ".join(f"{statistics.median(g[i] for g in r['gathers']):.0f}" for i in (1, 2))
            print(f"{policy:6s} launch {k + 1}: steps {steps} s (median {r['median']:.2f}); traced step {r['traced']}"
                  f" root gather {root:6.0f} ms (ranks {min(g[0] for g in r['gathers']):.0f}-"
                  f"{max(g[0] for g in r['gathers']):.0f}), layers {layers} ms; {r['faults']:,} minor faults,"
                  f" user {r['user']:.1f} s, system {r['system']:.1f} s", flush=True)
    for policy in roots:
        print(f"{policy}: root gather median {statistics.median(roots[policy]):.0f} ms over {len(roots[policy])} launches"
              f" (min {min(roots[policy]):.0f}, max {max(roots[policy]):.0f}); step median of launches"
              f" {statistics.median(medians[policy]):.2f} s (min {min(medians[policy]):.2f},"
              f" max {max(medians[policy]):.2f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
