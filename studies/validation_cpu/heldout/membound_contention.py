"""Does a rank per core slow the memory-bound ops of the other rank as the streaming probe says?
Every kept held-out run re-priced (SimPy, no executor) with its own profile, under today's GEMM
rule (``calibration.layer_terms.gemm_contention``: a rank per core computes its GEMMs at solo
speed, applied to the profiles calibrated before it), and with the memory-bound and AdamW
slowdowns at up to one rank per core set to 1 as well:

* ``GEMM 1``: the model before ``costs.host.lockstep`` (the profile's ``contention`` at N <= cores
  is 1; the probe's memory-bound slowdown on every plan, which this script keeps for every
  variant: ``lockstep_contention.py`` compares today's rule);
* ``+ membound 1``: also ``contention_membound`` at N <= cores 1 (``costs.host.ComputeScale``:
  the backward's memory-bound ops are priced at the streaming probe's slowdown, 1.8-1.9x at 2
  ranks, because they read activations saved a forward earlier);
* ``+ AdamW 1``: also ``contention_optimizer`` at N <= cores 1;
* ``+ bwd by size``: ``GEMM 1`` with a backward's memory-bound op taken from DRAM by its bytes
  against the rank's cache share, as a forward's is (``costs.host.dram_share``), not whole.

Printed: per run and pooled by kind of plan, then each plan's median signed error over the runs.

The motive (``action_bias.txt``, 2026-12-03): 2-rank plans' backwards priced 10-17 % slow on the
swiglu/rmsnorm/rope models, while those models' whole stages priced by the same profile in one
process read 1.00-1.02 of their measured backward; and the executor's traces show a compute
action no slower while the other rank computes (``trace_contention.txt``).

    .venv/bin/python studies/validation_cpu/heldout/membound_contention.py [RUN ...] > studies/validation_cpu/heldout/membound_contention.txt

RUN defaults to ``cost_variants.kept_runs()``; about 4 minutes (one core). The committed
``membound_contention.txt`` covers the 19 runs through ``run_20261203b_zen4``.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import yaml

import parsim.costs.host as host
import parsim.sim.engine as engine
from parsim.calibration.layer_terms import profile_model
from parsim.costs import layer_ops
from parsim.costs.timing import op_time
from parsim.sim import simulate
from parsim.specs import Plan, RankCurve, device_from_dict, load_cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost_variants import HERE, kept_runs, per_plan_table, plan_kind, variant_table  # noqa: E402
from kept_rows import measured_rows, plan_label  # noqa: E402

DRAM_WEIGHT = host.dram_weight
VARIANTS = ("as calibrated", "GEMM 1", "+ membound 1", "+ AdamW 1", "+ bwd by size")


def solo(curve: RankCurve | None, cores: int) -> RankCurve | None:
    """``curve`` with its slowdown at up to ``cores`` ranks set to 1."""
    if curve is None:
        return None
    return RankCurve(tuple((k, 1.0 if int(k) <= cores else v) for k, v in curve.values))


def edited(tables, variant: str):
    """The profile's tables as ``variant`` prices them."""
    if variant == "as calibrated":
        return tables
    cores = tables.cores or 1
    out = tables.replace(contention=solo(tables.contention, cores))
    if variant in ("+ membound 1", "+ AdamW 1"):
        out = out.replace(contention_membound=solo(tables.contention_membound, cores))
    if variant == "+ AdamW 1":
        out = out.replace(contention_optimizer=solo(tables.contention_optimizer, cores))
    return out


def by_size(op, pass_: str, cache_bytes):
    """``costs.host.dram_weight`` with the backward by its bytes against the cache, as the forward."""
    if op.kind != "membound":
        return 0.0
    return host.dram_share(op.fwd_bytes if pass_ == "fwd" else op.bwd_bytes, cache_bytes)


def run_errors(run: Path, variant: str) -> list[tuple[str, str, float]]:
    """(kind of plan, plan, predicted / measured step - 1) of every measured plan of ``run``."""
    host.dram_weight = by_size if variant == "+ bwd by size" else DRAM_WEIGHT
    engine.lockstep = lambda plan: True      # every plan's ranks in step: the rule these variants edit
    errors = []
    for _table, _i, model, plan, row in measured_rows(run):
        cluster = load_cluster(f"cpu:{plan.world_size}", profile=run / "profile.yaml")
        device = cluster.device
        cluster = dataclasses.replace(cluster, device=dataclasses.replace(device, tables=edited(device.tables, variant)))
        result = simulate(model, cluster, plan, record_events=False)
        errors.append((plan_kind(plan), plan_label(model, plan, row),
                       result.step_time_s / float(row["measured_step_s"]) - 1.0))
    return errors


def streaming_share(run: Path) -> float:
    """The calibration layer's memory-bound ops (``layer_terms.profile_model``, its probe's mbs,
    priced alone without composition): counted bytes over their seconds, over the profile's
    memory bandwidth (the memory-bound grid's rate). Above 1: they run from cache."""
    data = yaml.safe_load((run / "profile.yaml").read_text())
    device = device_from_dict(data["device"], "profile")
    device = dataclasses.replace(device, tables=device.tables.replace(layer_composition=None))
    probe = device.tables.layer_probe
    ops = [op for op in layer_ops(profile_model(data), Plan(mbs=int(probe.mbs), gbs=int(probe.mbs), dtype="fp32"))
           if op.kind == "membound"]
    passes = [(op.fwd_bytes, op_time(device, op, "fwd", "fp32")) for op in ops]
    passes += [(op.bwd_bytes, op_time(device, op, "bwd", "fp32")) for op in ops]
    return sum(b for b, _ in passes) / sum(t for _, t in passes) / device.memory_bandwidth


def main(runs: list[str]) -> None:
    print("per run and variant: median |step error|, max, plans predicted slow, signed median")
    per_plan_table(variant_table(runs, VARIANTS, run_errors), VARIANTS, VARIANTS[1], 14)
    shares = [streaming_share(HERE / name) for name in runs]
    print(f"\nthe calibration layer's memory-bound ops, alone: counted bytes a second over the profile's memory "
          f"bandwidth, {min(shares):.2f}-{max(shares):.2f} over the {len(runs)} runs (above 1: from cache)")


if __name__ == "__main__":
    main(sys.argv[1:] or kept_runs())
