"""How long does the executor's rank stay inside gloo's ``isend`` for a pipeline send (issue 20)?

The simulator treats a pipeline send of the torch stack as non-blocking: the sender's compute
goes on at once (``costs.p2p_holds_sender`` is false), and only where the ranks outnumber the
host's cores does a send take CPU from the ranks (``costs.host.message_cpu``, measured by
``calibration.p2p_cpu`` as process CPU seconds). The call itself can hold the rank's one thread:
gloo's TCP pair writes the message in the calling thread when it can and waits on the pair's
lock while its I/O thread holds it. That wait is wall time without CPU, which the calibration's
CPU measure does not see.

This runs heldout-deep's pipeline plans on the executor (``parsim execute``, 4 steps, the
first a warm-up) with every rank's ``torch.distributed.isend`` wrapped to log how long each call
took (a ``sitecustomize`` on the ranks' path; ``PARSIM_RANK_START=exec`` so each rank is a fresh
interpreter that imports it), and prints per plan: the calls' median, p90, mean and maximum
[ms], the seconds per rank and step in the calls against the measured step, the calling
thread's mean CPU in a call (``time.thread_time``: the rest is waiting), and what the
profile prices a send at on the sender's side (``message_cpu``: 0 where the ranks fit on the
cores).

    .venv/bin/python studies/validation_cpu/send_call.py [--profile P] > studies/validation_cpu/send_call.txt

About 60 s. A timing study: run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL = HERE / "heldout" / "model_deep.yaml"
PLANS = ("pp=2 vpp=3 mbs=1 gbs=8 schedule=interleaved dtype=fp32", "pp=4 mbs=1 gbs=8 schedule=1f1b dtype=fp32",
         "pp=4 vpp=3 mbs=1 gbs=8 schedule=interleaved dtype=fp32")
STEPS = 4

# imported by every rank at start-up: wraps isend to append each call's seconds to a file of its own
SITE = '''
import os, time
import torch.distributed as _dist
_isend, _log = _dist.isend, os.environ["SEND_CALL_LOG"]
def _timed_isend(*args, **kwargs):
    t0, c0 = time.perf_counter(), time.thread_time()
    try:
        return _isend(*args, **kwargs)
    finally:
        t1, c1 = time.perf_counter(), time.thread_time()
        with open(os.path.join(_log, f"{os.getpid()}.txt"), "a") as f:
            f.write(f"{t1 - t0:.7f} {c1 - c0:.7f}\\n")
_dist.isend = _timed_isend
'''


def run_plan(plan: str, site: Path, log: Path) -> tuple[list[tuple[float, float]], float]:
    """Every isend call's (wall, the calling thread's CPU) seconds over the run, and the measured
    step time (s)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
               PARSIM_RANK_START="exec", SEND_CALL_LOG=str(log), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "parsim", "execute", "--model", str(MODEL), "--plan", plan,
                           "--steps", str(STEPS), "--json"], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(proc.stderr[-2000:])
    calls = [tuple(map(float, line.split())) for f in log.glob("*.txt") for line in f.read_text().splitlines()]
    return calls, json.loads(proc.stdout)["step_time_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu-calibrated", help="the profile whose message_cpu is shown")
    args = ap.parse_args()
    from parsim.costs.host import message_cpu
    from parsim.costs.comm import p2p_bytes
    from parsim.specs import load_cluster, load_model, parse_plan

    model = load_model(MODEL)
    print(f"gloo isend calls inside the executor's pipeline sends, {MODEL.stem}, {STEPS} steps (all counted), "
          f"profile {args.profile}")
    print(f"{'plan':56} {'calls':>5} {'median':>7} {'p90':>6} {'mean':>6} {'max':>6}  {'per rank-step':>13} "
          f"{'of step':>7}  {'thread CPU':>10}  priced per send")
    for plan_text in PLANS:
        plan = parse_plan(plan_text)
        with tempfile.TemporaryDirectory() as tmp:
            site, log = Path(tmp, "site"), Path(tmp, "log")
            site.mkdir()
            log.mkdir()
            (site / "sitecustomize.py").write_text(SITE)
            calls, step = run_plan(plan_text, site, log)
        ms = sorted(wall * 1e3 for wall, _ in calls)
        per_rank_step = sum(wall for wall, _ in calls) / (plan.world_size * STEPS)
        cpu = statistics.fmean(c for _, c in calls) * 1e3
        cluster = load_cluster(f"cpu:{plan.world_size}", profile=args.profile)
        priced = message_cpu(cluster, plan.world_size, p2p_bytes(model, plan))[0] * 1e3
        print(f"{plan_text:56} {len(ms):5d} {statistics.median(ms):7.3f} {ms[int(0.9 * len(ms))]:6.2f} "
              f"{statistics.fmean(ms):6.3f} {ms[-1]:6.2f}  {per_rank_step * 1e3:10.1f} ms {per_rank_step / step:7.1%}  "
              f"{cpu:7.3f} ms  {priced:.3f} ms of CPU")


if __name__ == "__main__":
    main()
