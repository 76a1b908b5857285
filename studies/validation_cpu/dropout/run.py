"""Models with dropout on the executor against the simulator: peak memory per rank, step time.

The held-out matrix (``../heldout``) has no model with dropout. Here two models with dropout on
(attention, residual and embedding dropout; ``model_gpt.yaml`` explicit attention,
``model_llama.yaml`` SDPA, which on a CPU runs its math path once dropout is on) run 15 plans each
on 2 gloo ranks (``parsim validate``), and every plan is priced twice: as parsim prices it
now, and under the rules before (a 1-byte dropout mask and SDPA's flash kernel, as on a GPU:
``Stack.dropout_noise`` and ``Stack.flash_dropout`` off for the ``torch`` stack).

    .venv/bin/python studies/validation_cpu/dropout/run.py PROFILE [OUT]   # ~3 min, 2 cores

PROFILE: a calibrated CPU profile of this machine (memory does not depend on it; step times do).
OUT: folder for the two validations [out/dropout]. Prints the table ``results.txt`` holds.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
MODELS = ("gpt", "llama")
MiB = 2 ** 20


def validate(profile: str, out: Path, key: str) -> pd.DataFrame:
    """Run (or resume) ``parsim validate`` of one matrix; its rows."""
    folder = out / key
    cmd = [sys.executable, "-m", "parsim", "validate", "--matrix", str(HERE / f"matrix_{key}.yaml"),
           "--profile", profile, "--out", str(folder), "--worst", "0", "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"parsim validate failed for {key}:\n{proc.stderr[-2000:]}")
    return pd.read_csv(folder / "validation.csv")


def priced_before(model_path: Path, profile: str, plan_text: str, world: int) -> list[float]:
    """Per-rank peaks under the old rules: the ``torch`` stack with a 1-byte dropout mask and
    SDPA's flash kernel kept with dropout."""
    from parsim.sim import simulate
    from parsim.specs import cluster_from_dict, load_model, load_profile_dict, parse_plan
    from parsim.specs import stack as stacks
    from parsim.study.validate.compare import peaks_by_rank

    saved = stacks.STACK_PRESETS["torch"]
    stacks.STACK_PRESETS["torch"] = replace(saved, dropout_noise=False, flash_dropout=True)
    try:
        cluster = cluster_from_dict(load_profile_dict(profile), world)
        plan = parse_plan(plan_text)
        return peaks_by_rank(simulate(load_model(str(model_path)), cluster, plan), plan)
    finally:
        stacks.STACK_PRESETS["torch"] = saved


def worst(measured: list[float], predicted: list[float]) -> float:
    """The largest |error| over ranks (signed)."""
    errors = [p / m - 1 for m, p in zip(measured, predicted)]
    return max(errors, key=abs)


def main(profile: str, out: Path) -> None:
    print(f"profile {profile}; memory error = the worst rank's predicted / measured peak - 1")
    print(f"{'model':6s} {'plan':62s} {'meas MiB':>9s} {'now':>7s} {'before':>7s} {'step err':>8s}")
    now_all, before_all = [], []
    for key in MODELS:
        rows = validate(profile, out, key)
        for _, r in rows.iterrows():
            measured = json.loads(r.measured_peak_bytes_by_rank)
            now = json.loads(r.predicted_peak_bytes_by_rank)
            before = priced_before(HERE / f"model_{key}.yaml", profile, r.plan, len(measured))
            e_now, e_before = worst(measured, now), worst(measured, before)
            now_all.append(abs(e_now))
            before_all.append(abs(e_before))
            print(f"{key:6s} {r.plan[:62]:62s} {max(measured) / MiB:9.1f} {e_now:+7.1%} {e_before:+7.1%} "
                  f"{r.step_error:+8.1%}")
    n = len(now_all)
    print(f"peak memory, worst rank: now max {max(now_all):.1%}, {sum(e <= 0.03 for e in now_all)}/{n} within 3 %; "
          f"before max {max(before_all):.1%}, {sum(e <= 0.03 for e in before_all)}/{n} within 3 %")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "out" / "dropout")
