"""Three changes to the CPU cost model, tried on every kept held-out run before any is built:
each run's measured plans re-priced (SimPy, no executor) with its own profile as calibrated and
with the profile's layer terms re-derived three other ways.

* ``no floor``: the composition terms as fitted over the synthetic stages, without
  ``calibration.layer_terms.at_least_the_layer`` (which raises them until they price the
  probe's layer alone at no less than it measured; it only ever raises, 21 of 72 kept
  calibrations, mostly the backward by 1-3 %).
* ``membound factor``: GEMMs and attention composed at their priced time (factor 1), the
  fitted factor on the memory-bound ops only, plus seconds per op: measured = G + c M + tau n
  per pass over the stages (relative least squares, c >= 1, tau >= 0). The motive (the stages
  under torch.profiler on the Zen 4 VM, 2026-12-02, a one-off measurement): inside a stage the
  GEMMs ran within -4..+13 % of their priced time, the rest at ~2x, yet the calibrated factor
  (1.10 there) multiplies both.
* ``2-rank contention 1``: the fitted GEMM contention at 2 ranks set to 1 (the layer's 2-rank
  slowdown read 1.06-1.10 by the calibration; two processes stepping a stage read 0.95-1.17
  apart in a minute).

    .venv/bin/python studies/validation_cpu/heldout/cost_variants.py [RUN ...] > studies/validation_cpu/heldout/cost_variants.txt

About 2 minutes for the 17 default runs (one core). Prints, per run, pooled and per kind of
plan (2 ranks: dp=2, tp=2, pp=2; 4 ranks), the median and max |step error|, the plans predicted
slow and the signed median.
"""
from __future__ import annotations

import copy
import dataclasses
import statistics
import sys
import tempfile
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import yaml

import parsim.calibration.layer_terms as layer_terms
import parsim.costs.timing as timing
from parsim.calibration.profile_io import write_profile_text
from parsim.sim import simulate
from parsim.specs import RankCurve, device_from_dict, load_cluster, model_from_dict

from kept_rows import measured_rows

HERE = Path(__file__).resolve().parent
RUNS = ("run_20261129o_amd", "run_20261129p_amd", "run_20261130g_zen3", "run_20261130j_zen3", "run_20261201_zen3",
        "run_20261201b_zen3", "run_20261201c_zen3", "run_20261201d_zen3", "run_20261201e_zen3", "run_20261201f_zen3",
        "run_20261202_zen3", "run_20261202b_zen3", "run_20261202c_zen3", "run_20261202d_zen5", "run_20261202e_zen5",
        "run_20261202f_zen4", "run_20261202g_zen4")


def kept_runs() -> list[str]:
    """``RUNS`` and every run kept since them (2026-12-03 on): the later scripts' default."""
    return [*RUNS, *sorted(p.name for p in HERE.glob("run_202612[0-9][0-9]*") if p.name >= "run_20261203")]


VARIANTS = ("as calibrated", "no floor", "membound factor", "2-rank contention 1")
_alone = timing._op_time
_split = {"on": False}


def _op_time(device, op, pass_, dtype):
    """``timing._op_time``, divided by the pass's composition factor for GEMMs and attention
    while ``membound factor`` prices: ``op_time`` then multiplies them back to their own time."""
    t = _alone(device, op, pass_, dtype)
    composition = device.tables.layer_composition
    if _split["on"] and composition is not None and op.kind != "membound" and t > 0:
        t /= composition.factor(pass_)
    return t


timing._op_time = _op_time


def _write(data: dict) -> Path:
    path = Path(tempfile.mkdtemp()) / "profile.yaml"
    write_profile_text(str(path), "", data)
    return path


def _no_floor(data: dict) -> dict:
    """The profile with only its composition terms re-derived without the floor: the rest of a
    refit (the GEMM contention under today's rule) is not this variant's, so it is not taken."""
    keep = layer_terms.at_least_the_layer
    layer_terms.at_least_the_layer = lambda device, composition, *rest: composition
    try:
        refit = layer_terms.refit_data(copy.deepcopy(data))
    finally:
        layer_terms.at_least_the_layer = keep
    out = copy.deepcopy(data)
    out["device"]["extra"]["layer_composition"] = refit["device"]["extra"]["layer_composition"]
    return out


def _membound_terms(data: dict) -> dict:
    """measured = G + c M + tau n per pass over the profile's synthetic stages (G: GEMM and
    attention seconds, M: memory-bound seconds, priced alone; n: ops that run)."""
    device = device_from_dict(data["device"], "d")
    raw = dataclasses.replace(device, tables=device.tables.replace(layer_composition=None))
    terms = {}
    for pass_, runs in (("fwd", "fwd"), ("bwd", "bwd_input")):
        rows = []
        for stage in device.tables.stage_probes.stages:
            ops = layer_terms.stage_ops(model_from_dict(stage.spec), int(stage.mbs), "fp32", device.default_stack)
            g = sum(timing.op_time(raw, op, pass_, "fp32") for op in ops if op.kind != "membound")
            m = sum(timing.op_time(raw, op, pass_, "fp32") for op in ops if op.kind == "membound")
            n = sum(1 for op in ops if timing.op_time(raw, op, runs, "fp32") > 0)
            rows.append((g, m, n, float(getattr(stage, f"{pass_}_s"))))
        g, m, n, y = (np.array(col) for col in zip(*rows))
        a, b = np.stack([m / y, n / y], axis=1), 1.0 - g / y
        c, tau = np.linalg.lstsq(a, b, rcond=None)[0]
        if c < 1.0 or tau < 0.0:          # c at its bound 1, tau refitted alone
            c, tau = 1.0, max(0.0, float(np.sum(a[:, 1] * (b - a[:, 0])) / np.sum(a[:, 1] ** 2)))
        terms[pass_] = (float(c), float(tau))
    out = copy.deepcopy(data)
    out["device"]["extra"]["layer_composition"].update(
        fwd=terms["fwd"][0], bwd=terms["bwd"][0], per_op_fwd_s=terms["fwd"][1], per_op_bwd_s=terms["bwd"][1])
    return out


@contextmanager
def _priced(variant: str, run: Path):
    """(profile path, cluster edit) of ``variant`` for ``run``, with the op-time split on while
    ``membound factor`` prices."""
    data = yaml.safe_load((run / "profile.yaml").read_text())
    edit = None
    if variant == "no floor":
        path = _write(_no_floor(data))
    elif variant == "membound factor":
        path = _write(_membound_terms(data))
    else:
        path = run / "profile.yaml"
    if variant == "2-rank contention 1":
        def edit(tables):
            return tables.replace(contention=RankCurve(tuple((k, 1.0 if int(k) == 2 else v)
                                                             for k, v in tables.contention.values)))
    _split["on"] = variant == "membound factor"
    try:
        yield path, edit
    finally:
        _split["on"] = False


def run_errors(run: Path, variant: str) -> list[tuple[str, float]]:
    """(kind of plan, signed step error: predicted / measured - 1) of the run's plans under
    ``variant``."""
    errors = []
    with _priced(variant, run) as (profile, edit):
        for _table, _i, model, plan, row in measured_rows(run):
            cluster = load_cluster(f"cpu:{plan.world_size}", profile=profile)
            if edit is not None:
                cluster = dataclasses.replace(cluster, device=dataclasses.replace(
                    cluster.device, tables=edit(cluster.device.tables)))
            result = simulate(model, cluster, plan, record_events=False)
            errors.append((plan_kind(plan), result.step_time_s / float(row["measured_step_s"]) - 1.0))
    return errors


def plan_kind(plan) -> str:
    """The group a plan's error is pooled in: 4 ranks, or a 2-rank plan by what it splits."""
    if plan.world_size != 2:
        return f"{plan.world_size} ranks"
    return "2 ranks dp=2" if plan.dp == 2 else ("2 ranks tp=2" if plan.tp == 2 else "2 ranks pp=2")


def summary(errors: list[float]) -> str:
    size = sorted(map(abs, errors))
    return (f"{statistics.median(size):5.1%} {size[-1]:6.1%} {sum(e > 0 for e in errors):3d}/{len(errors):<3d}"
            f" {statistics.median(errors):+6.1%}")


def variant_table(runs: list[str], variants, errors_of, width: int = 24) -> dict[tuple[str, str], list[float]]:
    """Print one row per run and variant (``summary``), then the runs pooled, all and by kind of
    plan; ``errors_of(run, variant)`` gives (kind, plan, signed step error) per measured plan.
    Returns {(variant, plan): [its error in each run]}."""
    print(f"{'run':{width}s}" + "".join(f" | {v:28s}" for v in variants))
    pooled: dict[tuple[str, str], list[float]] = defaultdict(list)     # (variant, kind or "pooled")
    by_plan: dict[tuple[str, str], list[float]] = defaultdict(list)
    for name in runs:
        cells = []
        for variant in variants:
            errors = errors_of(HERE / name, variant)
            for kind, plan, error in errors:
                pooled[(variant, "pooled")].append(error)
                pooled[(variant, kind)].append(error)
                by_plan[(variant, plan)].append(error)
            cells.append(summary([e for *_, e in errors]))
        print(f"{name[4:]:{width}s}" + "".join(f" | {c:28s}" for c in cells), flush=True)
    for kind in ["pooled", *sorted({k for _, k in pooled} - {"pooled"})]:
        print(f"{kind:{width}s}" + "".join(f" | {summary(pooled[(v, kind)]):28s}" for v in variants))
    return by_plan


def per_plan_table(plans: dict[tuple[str, str], list[float]], variants, sort_by: str, width: int) -> None:
    """Each plan's median signed error over the runs under each variant (``variant_table``'s
    return), the plans sorted by their |median| under ``sort_by``, then the count beyond 5 %."""
    labels = sorted({label for _, label in plans}, key=lambda k: -abs(statistics.median(plans[(sort_by, k)])))
    print(f"\nper plan: median signed step error over the runs\n{'plan':88s}" + "".join(f" {v:>{width}s}" for v in variants))
    for label in labels:
        print(f"{label:88s}" + "".join(f" {statistics.median(plans[(v, label)]):+{width}.1%}" for v in variants))
    print(f"{'plans whose median is beyond 5 %':88s}" + "".join(
        f" {sum(abs(statistics.median(plans[(v, k)])) > 0.05 for k in labels):>{width}d}" for v in variants))


def main(runs: list[str]) -> None:
    print("per run and variant: median |step error|, max, plans predicted slow, signed median")
    variant_table(runs, VARIANTS, lambda run, v: [(kind, "", e) for kind, e in run_errors(run, v)])


if __name__ == "__main__":
    main(sys.argv[1:] or list(RUNS))
