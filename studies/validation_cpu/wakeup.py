"""What a synchronous gloo collective costs when nothing else on the host wakes up: A/B with a
thread that wakes every millisecond.

    .venv/bin/python studies/validation_cpu/wakeup.py [--reps 4] [--samples 30] \
        | tee studies/validation_cpu/wakeup.txt                       # about 4 minutes

The calibration's in-situ TP probe (``calibration.insitu.measure_insitu``) and the executor's
TP collectives both pay for waking the ranks' gloo threads after compute (a slow mode of 2-5 ms
per call beside a fast one near 0.4 ms, ``insitu_drift.txt``). On a KVM guest an idle vCPU is
halted and woken by the host; a thread of the rank's own that wakes every millisecond (and so
keeps its vCPU from idling long) is a direct test of whether that wake-up is what the calls
pay. Two parts, each alternating the two settings so a slow minute hits both:

1. the probe itself, on 2 gloo ranks: the three TP collectives of cpu-small's tp=2 buffer (b*s*h,
   mbs 1: 256 KiB) after its block of two MLP-up GEMMs (128 x 1024 x 512), ``--samples`` samples
   of 8 calls per point, the median per setting and repetition;
2. the executor: ``parsim validate`` of cpu-small tp=2 and tp=2 SP (one round, 4 timed steps),
   ranks started as fresh interpreters with ``hooks/sitecustomize.py`` on their path, which
   starts the same thread when ``PARSIM_STUDY_TICK_S`` is set; the measured step and the mean
   per-call time of each TP collective from the traces.

Nothing in parsim runs such a thread; this measures the host, it changes no price.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TICK_S = 0.001
BLOCK = (128, 1024, 512)            # cpu-small's MLP-up at tp=2, mbs 1: tokens, ffn / 2, hidden
BYTES = 128 * 512 * 4               # its TP buffer b*s*h in fp32
PLANS = ("tp=2 gbs=8 dtype=fp32", "tp=2 gbs=8 dtype=fp32 sp=true")
SETTINGS = ("alone", "tick 1 ms")


def _ticking(stop: threading.Event) -> None:
    while not stop.wait(TICK_S):
        pass


def probe_rank(rank: int, port: int, reps: int, samples: int, settings=SETTINGS) -> dict | None:
    """{(setting, op): [median ms per repetition]} on rank 0."""
    import datetime

    import torch
    import torch.distributed as dist

    from parsim.calibration.insitu import group_call, measure_insitu
    from parsim.calibration.timer import Clock
    from parsim.executor.host_alloc import apply_host_memory_policy

    torch.set_num_threads(1)
    apply_host_memory_policy()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    dev = torch.device("cpu")
    x, w = torch.randn(BLOCK[0], BLOCK[2]), torch.randn(BLOCK[1], BLOCK[2])
    out: dict = {}
    try:
        for _ in range(reps):
            for setting in settings:
                stop = threading.Event()
                if setting != "alone":
                    threading.Thread(target=_ticking, args=(stop,), daemon=True).start()
                with torch.no_grad():
                    res = measure_insitu(lambda: torch.nn.functional.linear(x, w),
                                         lambda op, nb: group_call(op, nb, None, 2, dev, dist, torch), (BYTES,),
                                         samples, Clock(dev), dist, torch, dev)
                stop.set()
                for op, by_size in res.items():
                    for values in by_size.values():
                        out.setdefault((setting, op), []).append(1e3 * statistics.median(values))
    finally:
        dist.destroy_process_group()
    return out if rank == 0 else None


def executor_run(tick: bool, out: Path, study_env: dict | None = None) -> dict[str, tuple[float, dict[str, float]]]:
    """{plan: (measured step s, the median of the round's timed steps; {TP event kind: mean ms per
    call})} of one validate round; ``study_env`` adds variables for ``hooks/sitecustomize.py``."""
    from parsim.trace.io import load_trace

    out.mkdir(parents=True, exist_ok=True)
    matrix = out / "matrix.yaml"
    matrix.write_text("model: cpu-small\nsteps: 6\nwarmup: 2\nrounds: 1\nplans:\n"
                      + "".join(f'  - "{p}"\n' for p in PLANS))
    env = {**os.environ, "PARSIM_RANK_START": "exec",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "hooks"), str(ROOT)]), **(study_env or {})}
    env.pop("PARSIM_STUDY_TICK_S", None)
    if tick:
        env["PARSIM_STUDY_TICK_S"] = str(TICK_S)
    subprocess.run([sys.executable, "-m", "parsim", "validate", "--matrix", str(matrix), "--profile",
                    str(ROOT / "calibration/profiles/cpu-calibrated.yaml"), "--out", str(out / "v"), "--fresh"],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    import csv
    with open(out / "v" / "validation.csv", newline="") as f:
        steps = [float(row["measured_step_s"]) for row in csv.DictReader(f)]
    result = {}
    for i, plan in enumerate(PLANS):
        trace = load_trace(str(out / "v" / "traces" / f"plan{i:02d}.round1.measured.json"))
        calls: dict[str, list[float]] = {}
        for e in trace.events:
            if e.stream == "tp" and e.end > e.start:
                calls.setdefault(e.kind, []).append(e.end - e.start)
        result[plan] = (steps[i], {k: 1e3 * statistics.fmean(v) for k, v in sorted(calls.items())})
    return result


def study_args(doc: str, reps: int, reps_help: str, samples_help: str) -> argparse.Namespace:
    """The probe studies' command line (``--reps``, ``--samples``), with the ranks' environment
    set as the executor's (one thread, the host memory kept)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--reps", type=int, default=reps, help=f"{reps_help} [{reps}]")
    ap.add_argument("--samples", type=int, default=30, help=f"{samples_help} [30]")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("PARSIM_HOST_MEMORY", "keep")
    return args


def main() -> int:
    args = study_args(__doc__, 4, "alternations of the two settings per part", "probe samples per point and setting")
    from parsim.executor.processes import free_port, run_ranks

    print(f"wake-up A/B, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores; "
          f"tick: a thread per rank waking every {TICK_S * 1e3:g} ms")
    print(f"\n1. in-situ probe, 2 ranks, {BYTES // 1024} KiB after two {BLOCK} GEMMs, median ms per call "
          f"({args.samples} samples x 8 calls), per repetition")
    probe = run_ranks(probe_rank, (free_port(), args.reps, args.samples), 2)[0]
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        a, t = probe[("alone", op)], probe[("tick 1 ms", op)]
        print(f"  {op:15s} alone {statistics.fmean(a):5.2f} {[round(v, 2) for v in a]}   "
              f"tick {statistics.fmean(t):5.2f} {[round(v, 2) for v in t]}   tick/alone "
              f"{statistics.fmean(t) / statistics.fmean(a):.2f}")
    print("\n2. executor (parsim validate, 1 round, 4 timed steps): step s; mean ms per TP call")
    runs: dict[str, list] = {s: [] for s in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for setting in SETTINGS:
                runs[setting].append(executor_run(setting != "alone", Path(tmp) / f"{rep}{setting[0]}"))
    for plan in PLANS:
        print(f"  {plan}")
        for setting in SETTINGS:
            steps = [r[plan][0] for r in runs[setting]]
            kinds = sorted({k for r in runs[setting] for k in r[plan][1]})
            per = ", ".join(f"{k} {statistics.fmean(r[plan][1][k] for r in runs[setting]):.2f}" for k in kinds)
            print(f"    {setting:10s} step {statistics.fmean(steps):.3f} s {[round(s, 3) for s in steps]}; {per}")
        a = statistics.fmean(r[plan][0] for r in runs["alone"])
        t = statistics.fmean(r[plan][0] for r in runs["tick 1 ms"])
        print(f"    step tick/alone {t / a:.3f}")
    print(f"load average (1, 5, 15 min) {tuple(round(x, 2) for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
