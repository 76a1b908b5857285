"""Do memory-bound ops contend for DRAM only where ranks run in lockstep? Every kept held-out
run re-priced (SimPy, no executor) with its own profile, the memory-bound slowdown at up to one
rank per core (the streaming probe's ``contention_membound``, 1.5-1.9x at 2 ranks) applied by
three rules (``parsim.costs.host.lockstep``, which the engine asks):

* ``every plan``: on every plan, whatever the other rank does meanwhile (parsim before
  ``costs.host.lockstep``);
* ``lockstep``: where the ranks on the host run in step (today) -- a TP group, whose collectives
  align the ranks op by op, or ZeRO-3 replicas, whose parameter gathers align them unit by unit,
  so a memory-bound op meets the same op on the other rank -- and not where they run
  independently (DP replicas and pipeline stages drift apart within a step: in the executor's
  traces a pipeline rank's compute ran 1.003x as long with the other rank computing, median over
  16 runs, ``trace_contention.txt``);
* ``no plan``: on none (``membound_contention.py``'s ``+ membound 1``).

Every variant prices the GEMM at solo speed up to one rank per core (today's calibration rule,
``layer_terms.gemm_contention``; profiles calibrated before it measured otherwise).

    .venv/bin/python studies/validation_cpu/heldout/lockstep_contention.py [RUN ...] > studies/validation_cpu/heldout/lockstep_contention.txt

RUN defaults to ``cost_variants.kept_runs()``; about 2 minutes (one core).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import parsim.sim.engine as engine
from parsim.costs.host import lockstep
from parsim.sim import simulate
from parsim.specs import load_cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost_variants import kept_runs, per_plan_table, plan_kind, variant_table  # noqa: E402
from kept_rows import measured_rows, plan_label  # noqa: E402
from membound_contention import edited  # noqa: E402

VARIANTS = ("every plan", "lockstep", "no plan")
RULES = {"every plan": lambda plan: True, "lockstep": lockstep, "no plan": lambda plan: False}


def run_errors(run: Path, variant: str) -> list[tuple[str, str, float]]:
    """(kind of plan, plan, predicted / measured step - 1) of every measured plan of ``run``."""
    engine.lockstep = RULES[variant]
    errors = []
    for _table, _i, model, plan, row in measured_rows(run):
        cluster = load_cluster(f"cpu:{plan.world_size}", profile=run / "profile.yaml")
        device = cluster.device
        device = dataclasses.replace(device, tables=edited(device.tables, "GEMM 1"))
        result = simulate(model, dataclasses.replace(cluster, device=device), plan, record_events=False)
        errors.append((plan_kind(plan), plan_label(model, plan, row),
                       result.step_time_s / float(row["measured_step_s"]) - 1.0))
    return errors


def main(runs: list[str]) -> None:
    print("per run and variant: median |step error|, max, plans predicted slow, signed median")
    per_plan_table(variant_table(runs, VARIANTS, run_errors), VARIANTS, VARIANTS[0], 12)


if __name__ == "__main__":
    main(sys.argv[1:] or kept_runs())
