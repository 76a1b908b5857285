"""Are the TP collectives of the held-out tp plans priced right, call by call, and does the
4-rank premium grow with the compute between calls? Read from the executor's traces of the
kept runs against the simulator's per-call events (``simulate(detail=True)``) of the same plans
with each run's own profile.

Per run and tp plan: the median duration of a TP call carrying at least 64 KiB, measured (every
round, every rank) and predicted (rank 0), and the median compute gap before it (the time
since the rank's previous TP call ended). Then, over the 4-rank plans (4 ranks on the 2
cores, ``CollectiveFit.shared_alpha``), the measured calls binned by that gap against the
predicted price at the same gap: the probe prices the premium up to its block
(``insitu_block_s``, a few ms) and holds it beyond.

    .venv/bin/python studies/validation_cpu/heldout/tp_calls.py [RUN ...] > studies/validation_cpu/heldout/tp_calls.txt

RUN defaults to every ``run_*`` folder with a ``profile.yaml``; about 2 s a run.
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from parsim.sim import simulate
from parsim.specs import load_cluster

from kept_rows import measured_rows, plan_label

HERE = Path(__file__).resolve().parent
BIG = 65536          # bytes: the activation-sized calls, not the loss's scalars
BINS = (0.0, 0.005, 0.01, 0.02, 0.04, 1e9)     # s of compute before a call


def calls(events: list, rank: int) -> list[tuple[float, float, float]]:
    """(gap before [s], duration [s], bytes) of each of ``rank``'s TP calls after its first;
    events: (rank, stage, stream, kind, microbatch, layer, start, end, bytes, ...)."""
    own = sorted((e for e in events if e[0] == rank and e[2] == "tp"), key=lambda e: e[6])
    return [(e[6] - prev[7], e[7] - e[6], e[8]) for prev, e in zip(own, own[1:])]


def predicted(model, profile: Path, plan) -> tuple[list[tuple[float, float, float]], float]:
    """Rank 0's TP calls in the simulator's detailed trace, and its step time [s]."""
    res = simulate(model, load_cluster(f"cpu:{plan.world_size}", profile=profile), plan, detail=True)
    events = [(e.rank, e.stage, e.stream, e.kind, e.microbatch, e.layer, e.start, e.end, e.bytes)
              for e in res.trace.events]
    return calls(events, 0), res.step_time_s


def _bin(gap: float) -> int:
    return next(i for i in range(len(BINS) - 1) if BINS[i] <= gap < BINS[i + 1])


def _big(cs: list[tuple[float, float, float]]) -> list[tuple[float, float]]:
    return [(g, d) for g, d, x in cs if x >= BIG]


def plan_row(run: Path, table: Path, i: int, model, plan, step_s: float, binned: dict) -> tuple[str, float, float, float] | None:
    """One plan of one run: its line, the per-call error, the TP calls' error as a share of
    the measured step (their sum per step on a rank, predicted less measured) and the step's
    error, priced today; None for a run that kept no round traces."""
    measured, sums = [], []
    for path in sorted((table.parent / "traces").glob(f"plan{i:02d}.round*.measured.json")):
        events = json.loads(path.read_text())["events"]
        for rank in range(plan.world_size):
            mine = calls(events, rank)
            measured += _big(mine)
            sums.append(sum(d for _, d, _ in mine))
    pred, pred_step = predicted(model, run / "profile.yaml", plan)
    pred_big = _big(pred)
    if not measured or not pred_big:
        return None
    m, p = statistics.median(d for _, d in measured), statistics.median(d for _, d in pred_big)
    tp_share = (sum(d for _, d, _ in pred) - statistics.median(sums)) / step_s
    step_error = pred_step / step_s - 1
    if plan.world_size == 4:
        for gap, d in measured:
            binned[_bin(gap)]["measured"].append(d)
        for gap, d in pred_big:
            binned[_bin(gap)]["predicted"].append(d)
    line = (f"call {m * 1e3:6.2f} / {p * 1e3:6.2f} ms ({p / m - 1:+6.1%})  gap "
            f"{statistics.median(g for g, _ in measured) * 1e3:5.1f} / {statistics.median(g for g, _ in pred_big) * 1e3:5.1f}"
            f" ms  step {step_error:+6.1%} = TP {tp_share:+6.1%} + rest {step_error - tp_share:+6.1%}")
    return line, p / m - 1, tp_share, step_error


def run_rows(run: Path, binned: dict, per_plan: dict) -> list[str]:
    lines = []
    for table, i, model, plan, row in measured_rows(run):
        if plan.tp < 2:
            continue
        row_out = plan_row(run, table, i, model, plan, float(row["measured_step_s"]), binned)
        if row_out is None:
            continue
        line, call_error, tp_share, step_error = row_out
        name = plan_label(model, plan, row)
        lines.append(f"  {run.name:22} {name:80} {line}")
        per_plan[name].append((call_error, tp_share, step_error))
    return lines


def main(runs: list[Path]) -> None:
    print("TP calls >= 64 KiB: median per call measured (every round and rank) / predicted (rank 0), and the "
          "compute gap before a call; the step error split into the TP calls' (their sum per step, predicted less "
          "measured, over the measured step) and the rest")
    binned: dict = defaultdict(lambda: defaultdict(list))
    per_plan: dict = defaultdict(list)
    for run in runs:
        for line in run_rows(run, binned, per_plan):
            print(line)
    print("\neach plan over the runs, medians: per-call error (min..max); step error = TP calls' share + the rest")
    for name in sorted(per_plan):
        calls_, shares, steps = zip(*per_plan[name])
        step, share = statistics.median(steps), statistics.median(shares)
        print(f"  {name:80} call {statistics.median(calls_):+7.1%} ({min(calls_):+.0%}..{max(calls_):+.0%}, "
              f"{len(calls_)} runs)  step {step:+6.1%} = TP {share:+6.1%} + rest {step - share:+6.1%}")
    print("\n4-rank plans (4 ranks on 2 cores), calls by the gap before them: median ms (count)")
    for b in sorted(binned):
        lo, hi = BINS[b], BINS[b + 1]
        m, p = binned[b]["measured"], binned[b]["predicted"]
        label = f"{lo * 1e3:.0f}-{hi * 1e3:.0f} ms" if hi < 1e9 else f">= {lo * 1e3:.0f} ms"
        ms = f"{statistics.median(m) * 1e3:6.2f} ({len(m):5d})" if m else "     - (    0)"
        ps = f"{statistics.median(p) * 1e3:6.2f} ({len(p):5d})" if p else "     - (    0)"
        print(f"  gap {label:11} measured {ms}  predicted {ps}")


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:]]
    main(args or sorted(p for p in HERE.glob("run_*") if (p / "profile.yaml").exists()))
