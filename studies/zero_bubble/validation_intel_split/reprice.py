"""What the backward split's own cost (``costs.split_backward.split_weight_overhead``) changes on
measured runs: each plan of this run, of ``../validation_intel_split_b`` and of
``../validation_intel_final`` (measured before the term existed) simulated with its run's
profile, without and with the ``split_overhead`` that profile holds (this run's for the final
run), against the step the executor measured (no executor run).

    cd studies/zero_bubble/validation_intel_split && ../../../.venv/bin/python reprice.py > reprice.txt

Prints, per run, rank count and family (1F1B / interleaved against the new schedules), the mean
signed step error, the median and the largest |error|; a few seconds."""
from __future__ import annotations

import csv
import dataclasses
import statistics
from pathlib import Path

import yaml

from parsim.sim import simulate
from parsim.specs import load_cluster, load_model, parse_plan

HERE = Path(__file__).parent
RUNS = {"validation_intel_final (21:44-21:54, profile 21:41)": HERE.parent / "validation_intel_final",
        "validation_intel_split (22:36-22:46, profile 22:33)": HERE,
        "validation_intel_split_b (23:04-23:15, profile 23:01)": HERE.parent / "validation_intel_split_b"}


def main() -> None:
    model = load_model("cpu-small")
    for name, run in RUNS.items():
        own = yaml.safe_load((run / "profile.yaml").read_text())["device"]["extra"].get("split_overhead")
        fit = own or yaml.safe_load((HERE / "profile.yaml").read_text())["device"]["extra"]["split_overhead"]
        groups: dict[tuple[int, bool], list[tuple[float, float]]] = {}
        for row in csv.DictReader((run / "validation.csv").open()):
            plan = parse_plan(row["plan"])
            cluster = load_cluster(f"cpu:{plan.world_size}", profile=str(run / "profile.yaml"))
            errors = []
            for term in (None, fit):
                tables = cluster.device.tables.replace(split_overhead=term)
                priced = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, tables=tables))
                step = simulate(model, priced, plan, record_events=False).step_time_s
                errors.append(step / float(row["measured_step_s"]) - 1)
            new = plan.schedule not in ("1f1b", "interleaved")
            groups.setdefault((plan.world_size, new), []).append((errors[0], errors[1]))
        print(f"{name}: split_overhead {fit}")
        for (world, new), pairs in sorted(groups.items()):
            for i, label in enumerate(("without", "with")):
                e = [p[i] for p in pairs]
                family = "new" if new else "1f1b/int"
                print(f"   {world} ranks {family:8} ({len(e):2d}) {label:7} term: mean {statistics.mean(e):+6.1%}"
                      f"  median |e| {statistics.median(map(abs, e)):5.1%}  max |e| {max(map(abs, e)):5.1%}")


if __name__ == "__main__":
    main()
