"""Where the step-time errors of the Intel validation come from: compute or waiting (issue 21).

For each of the 28 plans of ``validation.csv``: the step error, the error of the mean busy
(compute) seconds per rank, predicted / measured - 1, and what is left of the step's gap
once the compute gap is taken out, the waiting the simulator does not price:

    wait gap = (measured step - predicted step) - (measured busy - predicted busy)   [ms]

divided by the sends of the busiest-sending rank in the SimPy engine's trace (the same profile,
``profile.yaml``): milliseconds per pipeline message if the wait were all messages.

    .venv/bin/python studies/zero_bubble/validation_intel/decompose.py > studies/zero_bubble/validation_intel/decompose.txt

About 10 s; it reads the measurements, it measures nothing.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import parsim

HERE = Path(__file__).resolve().parent


def main() -> None:
    warnings.filterwarnings("ignore")
    runs = pd.read_csv(HERE / "validation.csv")
    rows = []
    for _, r in runs.iterrows():
        measured = np.mean(list(json.loads(r.measured_busy_s_by_rank).values()))
        predicted = np.mean(list(json.loads(r.predicted_busy_s_by_rank).values()))
        events = parsim.simulate(r.model, f"cpu:{r.world_size}", r.plan, profile=HERE / "profile.yaml").to_pandas()
        sends = events[(events.stream == "pp") & (events.kind == "send")].groupby("rank").size()
        most = int(sends.max()) if len(sends) else 0
        wait = (r.measured_step_s - r.predicted_step_s) - (measured - predicted)
        rows.append({"plan": r.plan.replace(" dtype=fp32", ""), "ranks": r.world_size,
                     "step err %": 100 * r.step_error, "busy err %": 100 * (predicted / measured - 1),
                     "wait gap ms": 1e3 * wait, "sends": most,
                     "ms per send": 1e3 * wait / most if most else float("nan")})
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    print(table.round(2).to_string(index=False))
    for n in sorted(table.ranks.unique()):
        t = table[table.ranks == n]
        print(f"{n} ranks: busy error median {t['busy err %'].median():+.1f} %, wait gap median "
              f"{t['wait gap ms'].median():.0f} ms ({t['ms per send'].median():.1f} ms per send)")


if __name__ == "__main__":
    main()
