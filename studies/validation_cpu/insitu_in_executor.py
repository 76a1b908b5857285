"""Does the in-situ TP probe read differently inside the executor's own rank processes?

    .venv/bin/python studies/validation_cpu/insitu_in_executor.py [--reps 3] [--samples 30] \
        | tee studies/validation_cpu/insitu_in_executor.txt            # about 3 minutes

The demo's tp=2 SP plan reads 4-18 % slow because the calibration's in-situ probe
(``calibration.insitu.measure_insitu``) prices gloo's all-gather and reduce-scatter 25-40 % above
what the executor's SP layers pay (``wakeup.txt``, stop 44's note). The probe runs in the
calibration's processes; the executor's ranks also run a watchdog, a heartbeat, a completion
thread, its allocator policy and its process groups. Here the same probe (cpu-small's tp=2
buffer after two of its MLP-up GEMMs, as ``wakeup.py``) runs three ways, alternated so a slow
minute hits all:

1. alone, in ranks of its own (``wakeup.probe_rank``), ``--samples`` samples;
2. inside the executor's ranks, after each layer probe ``parsim validate`` takes around its
   timed steps (``hooks/sitecustomize.py``, ``PARSIM_STUDY_INSITU``; 10 samples each, 5 probes
   a plan), in the same minute as
3. the executor's own calls: cpu-small tp=2 and tp=2 SP, one round, 4 timed steps; the mean ms
   per TP call from the round's trace.

Nothing in parsim runs the hook; this measures where the probe's premium comes from.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from wakeup import PLANS, ROOT, executor_run, probe_rank, study_args

OPS = ("all_reduce", "all_gather", "reduce_scatter")
KINDS = {"all_reduce": "tp_allreduce", "all_gather": "tp_allgather", "reduce_scatter": "tp_reducescatter"}


def in_executor(out: Path) -> tuple[dict, dict[str, float]]:
    """(``executor_run``'s result, {op: mean ms per call of the probes taken inside its ranks})."""
    probes = out / "probe"
    probes.mkdir(parents=True, exist_ok=True)
    runs = executor_run(False, out, {"PARSIM_STUDY_INSITU": str(probes)})
    records = [json.loads(line) for line in (probes / "rank0.jsonl").read_text().splitlines()]
    return runs, {op: statistics.fmean(v for r in records for v in r["ms"][op]) for op in OPS}


def main() -> int:
    args = study_args(__doc__, 3, "alternations of the three measurements", "samples of the probe alone per repetition")
    from parsim.executor.processes import free_port, run_ranks

    print(f"in-situ probe alone / inside the executor / the executor's calls, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores; mean ms per call")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            alone = run_ranks(probe_rank, (free_port(), 1, args.samples, ("alone",)), 2)[0]
            runs, inside = in_executor(Path(tmp) / str(rep))
            rows.append(({op: alone[("alone", op)][0] for op in OPS}, inside, runs))
    print(f"    {'':22s}" + "".join(f"{'rep ' + str(i + 1):>8s}" for i in range(args.reps)))
    lines = [("probe alone (median)", lambda r, op: r[0][op]), ("probe in executor", lambda r, op: r[1][op])]
    lines += [(f"executor {'SP' if 'sp=true' in plan else 'tp=2'}",
               lambda r, op, plan=plan: r[2][plan][1].get(KINDS[op])) for plan in PLANS]
    for op in OPS:
        print(f"  {op}")
        for label, get in lines:
            values = [get(r, op) for r in rows]
            if any(v is None for v in values):
                continue
            print(f"    {label:22s}" + "".join(f"{v:8.2f}" for v in values) + f"   mean {statistics.fmean(values):.2f}")
    steps = {plan: [r[2][plan][0] for r in rows] for plan in PLANS}
    print("executor steps (s): " + "; ".join(f"{p}: {[round(s, 3) for s in v]}" for p, v in steps.items()))
    print(f"load average (1, 5, 15 min) {tuple(round(x, 2) for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
