"""Why is the deep interleaved pp=4 plan on 4 ranks over 2 cores predicted 8-14 % fast in every
held-out run on the AMD VM (issue 20)? Executor traces against the simulator's, and a what-if.

1. Runs ``parsim validate`` on heldout-deep's two 4-rank pipeline plans (interleaved pp=4 vpp=3
   and 1F1B pp=4) with a kept profile (default: held-out run g's, which measured ``p2p_hold``), 2
   rounds, traces kept
   (``--traces DIR`` reads an earlier output instead).
2. Per plan, measured and predicted: the mean number of ranks computing at once, each rank's
   busy time, and the mean *start gap* of an action: its start less the moment it could start,
   max(the rank's previous action's end, its input's send) [ms]: what a rank loses at an action
   boundary beyond its compute and its wait for the sender (cross-rank times: every rank's
   ``time.perf_counter``, CLOCK_MONOTONIC, one clock per host).
3. What-if: the held-out runs' measured plans re-priced (``heldout/reprice.py``'s way) with the
   profile's ``p2p_hold`` (``costs.host.message_hold``: an action whose input is a remote pipeline
   message starts that much later, on hosts with more ranks than cores) set to H = 0, 1, 1.54 (run
   g's calibration) and 2 ms at 4 ranks.

    .venv/bin/python studies/validation_cpu/oversubscribed_pipeline.py > studies/validation_cpu/oversubscribed_pipeline.txt

About 60 s (35 s of executor runs). A timing study: run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
HELDOUT = HERE / "heldout"
PLANS = ("pp=4 vpp=3 mbs=1 gbs=8 schedule=interleaved dtype=fp32", "pp=4 mbs=1 gbs=8 schedule=1f1b dtype=fp32")
RUNS = ("run_20261129c_amd", "run_20261129d_amd", "run_20261129e_amd", "run_20261129f_amd", "run_20261129g_amd")


def events(path: Path) -> list[dict]:
    trace = json.loads(path.read_text())
    return [dict(zip(trace["columns"], e)) for e in trace["events"]]


def concurrency(ev: list[dict]) -> float:
    """Mean number of ranks inside a compute action over the step."""
    comp = [e for e in ev if e["stream"] == "compute"]
    span = max(e["end"] for e in comp) - min(e["start"] for e in comp)
    return sum(e["end"] - e["start"] for e in comp) / span


def start_gaps(ev: list[dict]) -> dict[int, float]:
    """Per rank, the mean start gap of its F and B actions [ms] (the module docstring)."""
    sends = {e["name"].removeprefix("send "): e["start"] for e in ev if e["kind"] == "send"}
    out = {}
    for rank in sorted({e["rank"] for e in ev}):
        mine = sorted((e for e in ev if e["rank"] == rank and (e["stream"] == "compute" or e["kind"] == "recv")),
                      key=lambda e: e["start"])
        prev_end, recv, gaps = None, None, []
        for e in mine:
            if e["kind"] == "recv":
                recv = e
                continue
            if e["kind"] in ("F", "B") and prev_end is not None:
                ready = prev_end
                if recv is not None and recv["name"].removeprefix("recv ") in sends:
                    ready = max(ready, sends[recv["name"].removeprefix("recv ")])
                gaps.append(max(e["start"] - ready, 0.0) * 1e3)
            prev_end, recv = e["end"], None
        out[rank] = float(np.mean(gaps)) if gaps else 0.0
    return out


def describe(traces: Path) -> None:
    print("measured (round medians' traces) against predicted, heldout-deep on 4 ranks:")
    print(f"{'plan':58} {'trace':9} {'step ms':>8} {'computing':>9}  busy ms per rank      start gap ms per rank")
    for i, plan in enumerate(PLANS):
        for kind in ("round1.measured", "round2.measured", "predicted"):
            path = traces / f"plan{i:02d}.{kind}.json"
            if not path.exists():
                continue
            ev = events(path)
            comp = [e for e in ev if e["stream"] == "compute"]
            step = (max(e["end"] for e in comp) - min(e["start"] for e in comp)) * 1e3
            busy = [sum(e["end"] - e["start"] for e in comp if e["rank"] == r) * 1e3 for r in range(4)]
            gaps = start_gaps(ev)
            print(f"{plan[:58]:58} {kind.split('.')[0]:9} {step:8.0f} {concurrency(ev):9.2f}  "
                  + " ".join(f"{b:4.0f}" for b in busy) + "   " + " ".join(f"{gaps[r]:4.2f}" for r in range(4)))


def reprice(runs: list[str], holds: list[float]) -> None:
    """The runs' plans priced with the profile's ``p2p_hold`` set to H ms at 4 ranks (0 at 2), as
    ``costs.host.message_hold`` prices it: on hosts with more ranks than cores only."""
    import dataclasses

    from parsim.sim import simulate
    from parsim.specs import load_cluster, load_model, parse_plan
    from parsim.specs.tables import RankCurve

    print("\nwhat-if: each held-out run's plans re-priced with p2p_hold = H ms at 4 ranks, on every action whose "
          "input is a remote pipeline message where the plan's ranks outnumber the host's cores (step error, + = slow):")
    for run in runs:
        rows = [(t.parent.name, r) for t in sorted((HELDOUT / run).glob("*/validation.csv"))
                for r in csv.DictReader(t.open()) if r.get("measured_step_s")]
        profile = HELDOUT / run / "profile.yaml"
        for h in holds:
            errors = []
            for model_name, row in rows:
                plan = parse_plan(row["plan"])
                cluster = load_cluster(f"cpu:{plan.world_size}", profile=profile)
                tables = cluster.device.tables.replace(p2p_hold=RankCurve(((2, 0.0), (4, h * 1e-3))))
                cluster = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))
                res = simulate(load_model(HELDOUT / f"model_{model_name}.yaml"), cluster, plan, record_events=False)
                errors.append(res.step_time_s / float(row["measured_step_s"]) - 1)
            a = [abs(e) for e in errors]
            print(f"  {run:18} H={h:4.2f}  median {statistics.median(a):5.1%} max {max(a):5.1%}  "
                  + " ".join(f"{e:+.1%}" for e in errors))
    print("  plans, in order: " + " | ".join(f"{m}, {parse_plan(r['plan']).world_size} ranks: {r['plan'][:44]}"
                                             for m, r in rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=Path, help="an earlier output's traces/ folder (skips the executor runs)")
    ap.add_argument("--profile", type=Path, default=HELDOUT / RUNS[-1] / "profile.yaml")
    args = ap.parse_args()
    traces = args.traces
    if traces is None:
        out = Path(tempfile.mkdtemp(prefix="oversubscribed-"))
        (out / "matrix.yaml").write_text("model: " + str(HELDOUT / "model_deep.yaml") + "\nsteps: 6\nwarmup: 2\n"
                                         "rounds: 2\nplans:\n" + "".join(f'  - "{p}"\n' for p in PLANS))
        res = subprocess.run([sys.executable, "-m", "parsim", "validate", "--matrix", str(out / "matrix.yaml"),
                              "--profile", str(args.profile), "--out", str(out / "run"), "--worst", "2"],
                             capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(res.stderr)
        print(f"parsim validate, profile {args.profile}:")
        print("\n".join(line for line in res.stdout.splitlines() if " meas ms " in line or "dtype=fp32 " in line))
        print()
        traces = out / "run" / "traces"
    describe(traces)
    reprice(list(RUNS), [0.0, 1.0, 1.54, 2.0])


if __name__ == "__main__":
    main()
