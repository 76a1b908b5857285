"""The layer terms of a calibrated profile: what a real layer costs beyond its ops priced one
by one, and the GEMM contention fitted to the real layer's slowdown.

They depend on how ``parsim.costs.timing.op_time`` prices ops, so they are derived from the
measurements the profile keeps (``CalibratedTables.layer_probe``, ``contention_layer``,
``contention_membound``) by ``fit_layer_terms``: once by ``parsim calibrate``, again by
``python -m parsim.calibration.refit PROFILE`` after a change to how ops are priced, and for
each run by ``parsim validate``'s anchoring (``parsim.study.validate.anchored_profile``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from parsim.specs import (CalibratedTables, DeviceProfile, LayerComposition, LayerProbe, ModelSpec, RankCurve,
                          device_from_dict, with_profile_tables)

from .profile_io import write_profile_text
from .surface_fit import CompositionFit, fit_composition, fit_overlapped_composition
from .tables import contention_curve

PROBE_CALL = "parsim.executor.model Block (tp=1): forward, then backward of a fixed output gradient"


def layer_probe_tables(tables: CalibratedTables, layer, blocks: list[tuple[float, float]],
                       comm: dict[int, list[dict]]) -> CalibratedTables:
    """The real-layer probe's measurements (``compute.bench_layer``: (mbs, forward, backward)
    Summaries of one layer alone; the probe's ``blocks`` over the run; the concurrent
    ``layer_rounds`` of ``comm._alternating_rounds``) added to ``tables``: ``layer_probe``,
    ``contention_layer`` L(N) (the real layer's slowdown with N ranks at once), and the GEMM
    probe's contention kept as ``contention_gemm_probe`` (``fit_layer_terms`` replaces it)."""
    mbs, fwd, bwd = layer
    probe = LayerProbe(mbs=mbs, fwd_s=fwd.median, bwd_s=bwd.median, call=PROBE_CALL, tp=1,
                       spread=(fwd.rel_spread, bwd.rel_spread),
                       # the probe's blocks, spread over the run, in the order taken (the machine's drift)
                       blocks=tuple((f, b) for f, b in blocks) if len(blocks) > 1 else None)
    tables = tables.replace(layer_probe=probe)
    curve = contention_curve(comm, "layer_rounds")
    if len(curve) > 1:
        tables = tables.replace(contention_gemm_probe=tables.contention, contention_layer=curve)
    return tables


def fit_layer_terms(device: DeviceProfile, model, dtype: str) -> CalibratedTables:
    """``device.tables`` with the layer terms derived from its probes (unchanged without a
    layer probe):

    * ``layer_composition``: what composing ops costs beyond the ops timed alone (autograd's
      graph and engine, Python module calls, bias-gradient reductions, layout copies,
      allocation and its page faults, caches a pass evicts); ``timing.op_time`` applies it to
      every op. With the synthetic stages of a machine calibration (``stage_probes``):
      ``composition_terms``, scaled by the layer probe now over the one taken with the stages
      (1 as calibrated; the machine's drift when anchored to a later probe), and, on a device
      whose host and kernels take turns (a CPU), raised where they price the probe's layer
      below what it measured (``at_least_the_layer``). Without them: the
      real layer's measured time over its ops' priced sum (``costs.layer_ops`` at tp=1 and the
      probe's mbs), per pass. Dimensionless; 1 = the per-op sum is exact.
    * ``contention``: the per-rank GEMM slowdown when N ranks compute at once
      (``gemm_contention``): 1 while each rank has a core of its own, as the executor's traces
      show; past the cores fitted to the real layer's slowdown L(N) (``contention_layer``)
      instead of one GEMM repeated: the layer's op sum is G (GEMMs and attention) + M
      (memory-bound ops), of which D runs from DRAM at N ranks (the backward's, and the
      forward's by ``costs.host.dram_share``) at the streaming probe's slowdown c_m(N) and the
      rest at the GEMMs' c_g(N), as the simulator prices them (``costs.host.ComputeScale``), so
      L(N) (G + M) = c_g(N) (G + M - D) + c_m(N) D gives
      c_g(N) = (L(N) (G + M) - c_m(N) D) / (G + M - D) (>= 1).
    * the probe's ``ops_fwd_s`` / ``ops_bwd_s``: its ops' priced sums, seconds."""
    from parsim.costs import layer_ops
    from parsim.costs.timing import op_time
    from parsim.specs import Plan

    tables = device.tables
    probe = tables.layer_probe
    if probe is None:
        return tables
    dev = replace(device, tables=tables.replace(layer_composition=None))
    ops = layer_ops(model, Plan(mbs=int(probe.mbs), gbs=int(probe.mbs), dtype=dtype, stack=device.default_stack))
    pred = {p: {kind: sum(op_time(dev, op, p, dtype) for op in ops if (op.kind == "membound") == (kind == "m"))
                for kind in ("g", "m")} for p in ("fwd", "bwd")}
    ops_fwd, ops_bwd = sum(pred["fwd"].values()), sum(pred["bwd"].values())
    if tables.stage_probes is not None and tables.stage_probes.stages:
        ref_f, ref_b = tables.stage_probes.reference
        terms = composition_terms(dev, dtype)
        composition = terms.composition.scaled(float(probe.fwd_s) / float(ref_f), float(probe.bwd_s) / float(ref_b))
        composition = at_least_the_layer(dev, composition, ops, probe, dtype)
        tables = tables.replace(fit_report={**(tables.fit_report or {}), "composition.fwd": terms.fwd.report,
                                            "composition.bwd": terms.bwd.report})
    else:
        composition = LayerComposition(float(probe.fwd_s) / ops_fwd, float(probe.bwd_s) / ops_bwd)
    tables = tables.replace(layer_composition=composition, layer_probe=replace(probe, ops_fwd_s=ops_fwd,
                                                                                 ops_bwd_s=ops_bwd))
    layer = tables.contention_layer
    if layer is not None and len(layer) > 1:
        tables = tables.replace(contention=gemm_contention(dev, tables, layer, ops, pred, dtype))
    return tables


def gemm_contention(dev: DeviceProfile, tables: CalibratedTables, layer: RankCurve, ops: list,
                    pred: dict[str, dict[str, float]], dtype: str) -> RankCurve:
    """The GEMM-kind contention c_g(N) (``fit_layer_terms``): 1 where the N ranks each have a
    core of their own (N <= ``tables.cores``), else fitted to the real layer's slowdown L(N).

    At N <= cores the calibration's alternating rounds read the layer 1.01-1.16x slower with N
    ranks at once (median 1.056 over 16 held-out runs' calibrations on Zen 3, Zen 4 and Zen 5
    EPYC VMs, 2026-11-30 to 12-02), but inside the executor a compute action of a 2-rank
    pipeline is no slower while the other rank computes: its duration regressed on the fraction
    of it the other rank spent computing reads 0.95-1.03x (median 1.003); the same regression
    on the simulator's predicted traces recovers each calibration's contention (median 1.068;
    studies/validation_cpu/heldout/trace_contention.py -> .txt). What the rounds read there is
    not what a training step meets, so a rank per core computes at its solo speed. Memory-bound
    ops keep the streaming probe's slowdown (``contention_membound``: DRAM bandwidth is shared).
    Past the cores (ranks share a core): L(N) (G + M) = c_g(N) (G + M - D) + c_m(N) D, with
    G + M the layer's priced op sum (``pred``: GEMMs and attention, memory-bound ops) and D the
    seconds of its memory-bound ops from DRAM at N ranks (``costs.host.dram_share``), c_m as
    the engine takes it (``costs.host.curve_slowdown``; no streaming probe: 1)."""
    from parsim.costs.host import cache_share, curve_slowdown, dram_weight
    from parsim.costs.timing import op_time

    g = pred["fwd"]["g"] + pred["bwd"]["g"]
    mem = pred["fwd"]["m"] + pred["bwd"]["m"]
    cores = tables.cores or 1

    def from_dram(n: int) -> float:      # seconds of the layer's memory-bound ops out of cache
        cache = cache_share(tables, n)
        return sum(op_time(dev, op, p, dtype) * dram_weight(op, p, cache)
                   for op in ops if op.kind == "membound" for p in ("fwd", "bwd"))

    def fitted(n: int, slow: float) -> float:
        if n <= cores:
            return 1.0
        d = from_dram(n)
        return max(1.0, (slow * (g + mem) - curve_slowdown(tables.contention_membound, n) * d) / (g + mem - d))
    return RankCurve(tuple((n, fitted(int(n), float(slow))) for n, slow in layer.values))


def at_least_the_layer(device: DeviceProfile, composition: LayerComposition, ops: list, probe: LayerProbe,
                       dtype: str) -> LayerComposition:
    """``composition`` raised, pass by pass, to where it prices the probe's layer (its ``ops``)
    at no less than the probe measured it: a layer inside a stage (its weights cold, a deeper
    autograd graph around it) does not run faster than the same layer alone with its weights hot.
    The stages and the per-op tables are measured minutes apart; a VM whose speed drifts between
    them can fit terms that price the real layer below its probe (the zero-bubble run j on the
    Intel VM, 2026-11-28: the layer's backward 13 % below it, every plan read fast). Terms that
    price it at or above the probe are kept as fitted.

    Not where the host's issue overlaps the kernels (``composition.overlap``: CUDA). A layer
    alone there is timed from an empty queue to a synchronised end: nothing hides its host's
    issue, so it runs slower than inside a stage, where the host queues each op while the ones
    before it run (an H200, 2026-11-30, studies/gpu_check/h200_s71: the probe's hidden-2048 layer
    alone 1.05 ms forward and 2.15 ms backward at seq 1024; gpt3-1.3b's hidden-2048 layers at seq
    2048 ran 0.95 and 1.66 ms each inside the executor's microbatch). Raised to the lone layer,
    the backward's factor went from 1.04 to 1.50 and priced gpt3-1.3b's backward 34-64 % slow."""
    from parsim.costs.timing import op_time

    if composition.overlap:
        return composition
    dev = replace(device, tables=device.tables.replace(layer_composition=composition))
    priced = {p: sum(op_time(dev, op, p, dtype) for op in ops) for p in ("fwd", "bwd")}
    raise_f = max(1.0, float(probe.fwd_s) / priced["fwd"]) if priced["fwd"] > 0 else 1.0
    raise_b = max(1.0, float(probe.bwd_s) / priced["bwd"]) if priced["bwd"] > 0 else 1.0
    return composition if raise_f == raise_b == 1.0 else composition.scaled(raise_f, raise_b)


@dataclass(frozen=True)
class StageComposition:
    """The composition terms fitted over the synthetic stages, and each pass's fit."""
    composition: LayerComposition
    fwd: CompositionFit
    bwd: CompositionFit


def stage_ops(spec: ModelSpec, mbs: int, dtype: str, stack: str = "auto") -> list:
    """The ops of one stage holding every layer of ``spec`` -- embedding, layers, head and
    loss -- for one microbatch of ``mbs`` (tp = pp = 1), as the synthetic stages run them
    (under ``stack``: the calibrated device's executor, ``DeviceProfile.default_stack``)."""
    from parsim.costs import embedding_ops, head_ops, layer_ops
    from parsim.specs import Plan

    plan = Plan(mbs=mbs, gbs=mbs, dtype=dtype, stack=stack)
    return embedding_ops(spec, plan) + layer_ops(spec, plan) * spec.layers + head_ops(spec, plan)


def stage_prices(device: DeviceProfile, dtype: str, spec: ModelSpec, mbs: int) -> dict[str, tuple[float, int]]:
    """Per pass ("fwd", "bwd"): (seconds, ops that run) of ``stage_ops`` priced op by op by
    ``device`` (its own composition terms included, if it has any)."""
    from parsim.costs.timing import op_time

    ops = stage_ops(spec, mbs, dtype, device.default_stack)
    out = {}
    for pass_, runs in (("fwd", "fwd"), ("bwd", "bwd_input")):
        out[pass_] = (sum(op_time(device, op, pass_, dtype) for op in ops),
                      sum(1 for op in ops if op_time(device, op, runs, dtype) > 0))
    return out


def stage_op_seconds(device: DeviceProfile, dtype: str, spec: ModelSpec, mbs: int) -> dict[str, tuple[list, float]]:
    """Per pass ("fwd", "bwd"): (the seconds of each op of ``stage_ops`` that runs in it -- in
    the backward its input-gradient half --, seconds of the rest: the weight-gradient halves),
    priced op by op by ``device``: what ``surface_fit.fit_overlapped_composition`` fits."""
    from parsim.costs.timing import op_time

    ops = stage_ops(spec, mbs, dtype, device.default_stack)
    fwd = [t for t in (op_time(device, op, "fwd", dtype) for op in ops) if t > 0]
    bwd = [t for t in (op_time(device, op, "bwd_input", dtype) for op in ops) if t > 0]
    return {"fwd": (fwd, 0.0), "bwd": (bwd, sum(op_time(device, op, "bwd_weight", dtype) for op in ops))}


def composition_terms(device: DeviceProfile, dtype: str) -> StageComposition:
    """measured = factor x priced + per-op seconds x ops, per pass, fitted over the stages of
    ``device.tables.stage_probes`` priced without composition (``surface_fit.fit_composition``,
    with its leave-one-stage-out error); on a device whose host's issue overlaps its kernels
    (``StageProbes.overlap``) each op takes the longer of the two
    (``surface_fit.fit_overlapped_composition``)."""
    from parsim.specs import model_from_dict

    raw = replace(device, tables=device.tables.replace(layer_composition=None))
    probes = device.tables.stage_probes
    measured = {pass_: [float(getattr(s, f"{pass_}_s")) for s in probes.stages] for pass_ in ("fwd", "bwd")}
    if probes.overlap:
        split = [stage_op_seconds(raw, dtype, model_from_dict(s.spec), int(s.mbs)) for s in probes.stages]
        fits = {pass_: fit_overlapped_composition([x[pass_][0] for x in split], [x[pass_][1] for x in split],
                                                  measured[pass_]) for pass_ in ("fwd", "bwd")}
    else:
        priced = [stage_prices(raw, dtype, model_from_dict(s.spec), int(s.mbs)) for s in probes.stages]
        fits = {pass_: fit_composition([p[pass_][0] for p in priced], [p[pass_][1] for p in priced], measured[pass_])
                for pass_ in ("fwd", "bwd")}
    return StageComposition(LayerComposition(fits["fwd"].factor, fits["bwd"].factor, fits["fwd"].per_op_s,
                                             fits["bwd"].per_op_s, probes.overlap), fits["fwd"], fits["bwd"])


def refit_data(data: dict[str, Any]) -> dict[str, Any]:
    """A profile mapping with its layer terms re-derived (``fit_layer_terms``), on the model
    its probe measured (``profile_model``) and the dtype it was calibrated in."""
    prov = data.get("provenance", {})
    device = device_from_dict(data["device"], data.get("name", "device"))
    return with_profile_tables(data, fit_layer_terms(device, profile_model(data), prov.get("dtype", "fp32")))


def profile_model(data: dict[str, Any]):
    """The ModelSpec whose shapes a calibrated profile measured (its layer probe's layer): the
    spec the profile keeps (``provenance.model_spec``), else its preset name (profiles written
    before the spec was kept, which were all calibrated on presets)."""
    from parsim.specs import load_model, model_from_dict

    prov = data.get("provenance", {})
    spec = prov.get("model_spec")
    return model_from_dict(spec) if spec else load_model(prov.get("model", "cpu-small"))


def refit_profile(path: str) -> LayerComposition | None:
    """Re-derive a calibrated profile's layer terms in place (``fit_layer_terms``); the
    measurements and the header comment are kept. Returns the new composition factors
    (None: the profile has no layer probe)."""
    text = Path(path).read_text()
    data = refit_data(yaml.safe_load(text))
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    note = "# Layer terms re-derived from the stored measurements by `python -m parsim.calibration.refit`.\n"
    write_profile_text(path, header + ("" if note in header else note), data)
    return device_from_dict(data["device"]).tables.layer_composition
