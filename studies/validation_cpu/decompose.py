"""Where does a plan's step-time error come from? Measured executor steps against simulated ones,
split by action kind, from the traces ``parsim validate`` keeps.

For every plan of a validation folder (``validation.csv``, ``traces/planNN.{measured,predicted}.json``:
the median round and its prediction) and every rank, the step splits into the time inside the
rank's compute events by kind -- ``F`` (forward, with the loss on the last stage and the TP
collectives inside), ``B`` (backward), ``optimizer``, other compute (FSDP copies) -- and ``idle``:
the rest of the step (pipeline bubbles, waits for peers' messages, exposed DP / ZeRO
collectives, and whatever the executor does between actions). Each part's (simulated -
measured) / measured step, averaged over ranks, is its share of the step error; the parts add
up to it. Per round, ``rounds.csv`` also holds the executor's layer probes (the calibration's
own layer re-timed inside the run), whose ratio to the profile's probe is the *drift*: how
much slower the same layer ran inside the executor than when the profile was measured.

    .venv/bin/python studies/validation_cpu/decompose.py [FOLDER] [--profile PROFILE] > decompose.txt

Reads traces only: seconds to run, nothing measured.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

PARTS = ("F", "B", "optimizer", "other", "idle")


def step_parts(trace) -> dict[str, float]:
    """Seconds per part of the step, averaged over the trace's ranks (``PARTS`` + ``step``)."""
    ranks = sorted({e.rank for e in trace.events})
    step = max(e.end for e in trace.events) - min(0.0, min(e.start for e in trace.events))
    parts: dict[str, float] = defaultdict(float)
    for e in trace.events:
        if e.stream == "compute" and e.layer == -1:
            kind = e.kind if e.kind in ("F", "B", "optimizer") else "other"
            parts[kind] += (e.end - e.start) / len(ranks)
    parts["idle"] = step - sum(parts[k] for k in PARTS if k != "idle")
    parts["step"] = step
    return dict(parts)


def error_shares(measured: dict[str, float], predicted: dict[str, float]) -> dict[str, float]:
    """Each part's (predicted - measured) over the measured step; they sum to the step error."""
    step = measured["step"]
    out = {k: (predicted.get(k, 0.0) - measured.get(k, 0.0)) / step for k in PARTS}
    out["step"] = (predicted["step"] - step) / step
    return out


def probe_drift(rounds_csv: Path, profile: dict | None) -> dict[str, list[float]]:
    """Per plan: each round's layer drift (forward + backward of the probe inside the run over the
    profile's); empty without probes or a profile."""
    out: dict[str, list[float]] = defaultdict(list)
    if profile is None or not rounds_csv.exists():
        return out
    probe = profile["device"]["extra"].get("layer_probe")
    if not probe:
        return out
    cal = probe["fwd_s"] + probe["bwd_s"]
    with rounds_csv.open(newline="") as f:
        for r in csv.DictReader(f):
            probes = json.loads(r.get("layer_probes") or "[]")
            if probes:
                out[r["plan"]].append(statistics.fmean(p["solo_fwd_s"] + p["solo_bwd_s"] for p in probes) / cal)
    return out


def decompose(folder: Path, profile: dict | None) -> str:
    from parsim.trace.io import load_trace

    with (folder / "validation.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    drift = probe_drift(folder / "rounds.csv", profile)
    lines = [f"{'ranks':>5s} {'plan':58s} {'step':>7s} " + " ".join(f"{k:>9s}" for k in PARTS) + f" {'drift':>6s}"]
    by_world: dict[str, list[dict[str, float]]] = defaultdict(list)
    for r in rows:
        m = load_trace(folder / f"{r['trace_file']}.measured.json")
        p = load_trace(folder / f"{r['trace_file']}.predicted.json")
        shares = error_shares(step_parts(m), step_parts(p))
        d = statistics.median(drift[r["plan"]]) if drift.get(r["plan"]) else float("nan")
        shares["drift"] = d
        by_world[r["world_size"]].append(shares)
        plan = r["plan"].replace(" dtype=fp32", "").replace(" tp=1", "").replace(" pp=1", "").replace(" dp=1", "")
        lines.append(f"{r['world_size']:>5s} {plan[:58]:58s} {shares['step']:+7.1%} "
                     + " ".join(f"{shares[k]:+9.1%}" for k in PARTS) + f" {d:6.2f}")
    lines.append("")
    lines.append("median share of the step error by part (predicted - measured, over the measured step):")
    for world, shares in sorted(by_world.items()):
        med = {k: statistics.median(s[k] for s in shares) for k in ("step", *PARTS)}
        drifts = [s["drift"] for s in shares if s["drift"] == s["drift"]]
        lines.append(f"  {world} ranks ({len(shares)} plans): step {med['step']:+.1%} = "
                     + ", ".join(f"{k} {med[k]:+.1%}" for k in PARTS)
                     + (f"; layer drift inside the executor {statistics.median(drifts):.3f}x" if drifts else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import yaml

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(Path(__file__).parent))
    parser.add_argument("--profile", default="calibration/profiles/cpu-calibrated.yaml",
                        help="the profile the folder was predicted with (its layer probe: the drift)")
    args = parser.parse_args(argv)
    prof = Path(args.profile)
    print(decompose(Path(args.folder), yaml.safe_load(prof.read_text()) if prof.exists() else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
