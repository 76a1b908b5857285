"""Raw measurements -> the profile mapping ``parsim.specs.cluster_from_dict`` reads.

``build_profile`` is pure: it takes the ``Measurements`` of one calibration run, reduces them
to the calibrated tables (``tables``: typed ``parsim.specs.CalibratedTables`` and
``CollectiveTables``), derives the layer terms (``layer_terms``) and assembles the mapping;
``profile_io.write_profile`` writes it as YAML.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parsim.specs import CalibratedTables, CollectiveTables, GemmTable, device_from_dict
from parsim.specs.surfaces import StageProbe, StageProbes

from .fit import Summary, fit_alpha_beta, fit_gemm_efficiency
from .layer_terms import fit_layer_terms, layer_probe_tables
from .machine_fit import device_numbers, fit_surfaces
from .shapes import AttentionPoint, GemmPoint, MemboundPoint
from .sharded import dtensor_per_tensor_s, fsdp_unit_host_s
from .tables import (attention_efficiency, attention_table, collective_fits, collective_leave_out, contention_curve,
                     interference_curve, membound_table, message_cpu_curves, message_hold_curve, send_hold_curve,
                     spreads)


@dataclass
class Measurements:
    """Everything one calibration run measured (seconds unless named otherwise)."""

    dtype: str
    device_name: str
    device_type: str                                   # "cpu" | "cuda"
    norm: str = "layernorm"                            # the model's norm (stands for input_norm etc.)
    gemm: list[tuple[GemmPoint, Summary]] = field(default_factory=list)
    dtype_probes: dict[str, tuple[tuple[int, int, int], float]] = field(default_factory=dict)  # dtype -> (shape, FLOP/s)
    attention: list[tuple[AttentionPoint, Summary, Summary]] = field(default_factory=list)
    attention_explicit: list[tuple[AttentionPoint, Summary, Summary]] = field(default_factory=list)
    membound: list[tuple[MemboundPoint, Summary, Summary | None]] = field(default_factory=list)
    op_overhead: dict[str, Summary] = field(default_factory=dict)
    host_copy: list[tuple[int, Summary]] = field(default_factory=list)
    model: Any = None                                  # the ModelSpec whose shapes were measured
    layer: tuple[int, Summary, Summary] | None = None  # (mbs, forward, backward) of one real layer, solo
    layer_blocks: list[tuple[float, float]] = field(default_factory=list)   # per probe block: median fwd, bwd
    split_extra: dict[str, float] | None = None        # the backward split's own cost (compute.split_extra)
    comm: dict[int, list[dict]] = field(default_factory=dict)   # world -> per-rank results of comm.run_comm_job
    memory_bytes: float = 0.0
    devices_per_node: int = 64
    provenance: dict[str, Any] = field(default_factory=dict)
    base: dict[str, Any] | None = None                 # profile supplying what was not measured
    grid: Any = None                                   # machine_bench.GridResults: the machine grid
    sms: int | None = None                             # a GPU's SMs (wave quantisation of its GEMM surface)
    caches: tuple[int, ...] = ()                       # the host's cache levels (cache.cache_levels), bytes


def build_profile(m: Measurements, name: str) -> dict[str, Any]:
    """The profile mapping of one run: the machine grid's fitted surfaces (``machine_fit``) and,
    where a model's own shapes were measured (``--model``), its exact tables beside them."""
    overhead = float(np.median([s.median for s in m.op_overhead.values()]))
    surfaces = (fit_surfaces(m.grid, m.dtype, m.sms, overlap=m.device_type == "cuda", overhead=overhead,
                             caches=m.caches, cpu_flash=m.device_type == "cpu") if m.grid is not None else None)
    membound = membound_table(m.membound, overhead, m.norm) if m.membound else None
    device: dict[str, Any] = {"name": m.device_name, **_compute_numbers(m, surfaces, membound),
                              "memory_bytes": int(m.memory_bytes), "membound_efficiency": 1.0,
                              "kernel_overhead_s": overhead}
    device = {k: device[k] for k in ("name", "peak_flops", "memory_bytes", "memory_bandwidth", "gemm",
                                     "membound_efficiency", "attention_efficiency", "kernel_overhead_s")}
    if m.device_type == "cpu":   # the host is the device: offloaded optimizer steps run at the same rates
        device["host_flops"] = device["peak_flops"][m.dtype]
        # the grid's AdamW bandwidth (its per-tensor term apart) before a --model's own rate
        rates = {**(membound["measured"] if membound else {}), **(surfaces.rates if surfaces else {})}
        device["host_memory_bandwidth"] = float(rates.get("adamw", device["memory_bandwidth"]))
    else:   # the executor on this GPU: CUDA's autocast op lists (``specs.stack`` "torch-cuda")
        device["default_stack"] = "torch-cuda"
        for key in ("host_flops", "host_memory_bandwidth", "usable_memory_fraction"):
            if m.base and key in m.base["device"]:
                device[key] = float(m.base["device"][key])
    collectives = collective_fits(m.comm)
    tables = _tables(m, surfaces, membound)
    if collectives:      # the collectives' own leave-out errors beside the surfaces' (fit_report)
        tables = tables.replace(fit_report={**(tables.fit_report or {}), **collective_leave_out(collectives)} or None)
    if m.layer is not None and m.model is not None:
        # the real-layer probe and the synthetic stages: the layer terms (``layer_terms``)
        tables = layer_probe_tables(tables, m.layer, m.layer_blocks, m.comm)
        if m.grid is not None and m.grid.stages:
            rounds = m.grid.stage_rounds.rounds if m.grid.stage_rounds is not None else None
            tables = tables.replace(stage_probes=stage_probes(m.grid.stages, m.layer, rounds, m.device_type == "cuda"))
        tables = fit_layer_terms(device_from_dict({**device, "extra": tables.to_dict()}, name), m.model, m.dtype)
    device["extra"] = tables.to_dict()
    prov = dict(m.provenance)
    passes = m.grid.membound_rounds if m.grid is not None else None
    if passes is not None and len(passes.done) > 1:     # the memory-bound passes' levels (machine_bench)
        prov["membound_passes"] = [round(x, 3) for x in passes.levels()]
    prov["spread"] = spreads(m.gemm or [p for rows in (m.grid.gemm.values() if m.grid else []) for p in rows],
                             m.attention or (m.grid.attention if m.grid else []),
                             m.membound or (m.grid.membound if m.grid else []), collectives)
    return {
        "name": name,
        "source": f"parsim calibrate on {prov.get('host', '?')}, {prov.get('date', '?')}",
        "provenance": prov,
        "devices_per_node": int(m.devices_per_node),
        "device": device,
        "network": _network(m, collectives),
    }


def _compute_numbers(m: Measurements, surfaces, membound) -> dict[str, Any]:
    """Peak FLOP/s, GEMM curve, memory bandwidth and attention efficiency: from the fitted
    surfaces where the grid ran, else from the model's own tables."""
    if surfaces is not None:
        return device_numbers(surfaces, m.dtype)
    overhead = float(np.median([s.median for s in m.op_overhead.values()]))
    gemm_rows = [(*p.key, p.flops / s.median) for p, s in m.gemm]
    peak = max(r[3] for r in gemm_rows)
    curve = fit_gemm_efficiency([tuple(r[:3]) for r in gemm_rows], [r[3] for r in gemm_rows], peak)
    peaks = {m.dtype: peak}
    for dt, (shape, rate) in m.dtype_probes.items():
        if dt != m.dtype:    # the same efficiency curve for every dtype (GemmEfficiency): peak = rate / eff(shape)
            occupancy = math.prod(d / (d + curve.half_dim) for d in shape)
            peaks[dt] = rate / (curve.max_efficiency * occupancy)
    return {"peak_flops": {k: float(v) for k, v in sorted(peaks.items())},
            "memory_bandwidth": float(np.median(list(membound["measured"].values()))),
            "gemm": {"max_efficiency": float(curve.max_efficiency), "half_dim": float(curve.half_dim)},
            "attention_efficiency": attention_efficiency(m.attention, peak, overhead)}


def _tables(m: Measurements, surfaces, membound) -> CalibratedTables:
    exact = bool(m.gemm)
    gemm_rows = [(*p.key, p.flops / s.median, s.rel_spread) for p, s in m.gemm]
    rates = {**(surfaces.rates if surfaces else {}), **(membound["table"] if membound else {})}
    per_tensor = surfaces.optimizer_per_tensor_s if surfaces else None
    fsdp_host = _first_measured(fsdp_unit_host_s, m.comm)
    if per_tensor is not None:   # a --model's own AdamW rate holds its loop's cost: keep the grid's bytes term
        rates["adamw"] = surfaces.rates["adamw"]
    messages = message_cpu_curves(m.comm)     # (send, receive, per byte) CPU of a pipeline message
    curve_rms, cores = None, os.cpu_count() or 1
    if exact and surfaces is None:
        peak = max(r[3] for r in gemm_rows)
        curve_rms = fit_gemm_efficiency([tuple(r[:3]) for r in gemm_rows], [r[3] for r in gemm_rows], peak).rms_log
    return CalibratedTables(
        cores=cores,
        cache_levels=tuple(m.caches) or None,   # () on a GPU: its L2 is no host cache (costs.host.dram_share)
        gemm={m.dtype: GemmTable(tuple(gemm_rows))} if exact else None,
        gemm_fit_rms_log=curve_rms,
        attention={m.dtype: attention_table(m.attention)} if exact else None,
        attention_explicit={m.dtype: attention_table(m.attention_explicit)} if exact else None,
        membound=rates,
        membound_detail=membound["detail"] if membound else None,
        op_overhead_s={k: s.median for k, s in m.op_overhead.items()},
        contention=contention_curve(m.comm, "gemm_rounds"),
        contention_membound=contention_curve(m.comm, "stream_rounds"),
        contention_optimizer=contention_curve(m.comm, "optimizer_rounds") if m.device_type == "cpu" else None,
        comm_interference=interference_curve(m.comm),
        p2p_send_cpu=messages[0],
        p2p_recv_cpu=messages[1],
        p2p_cpu_per_byte=messages[2],
        p2p_hold=message_hold_curve(m.comm, cores),
        p2p_send_hold=send_hold_curve(m.comm, cores),
        # the executor accumulates microbatch gradients with autograd's separate
        # AccumulateGrad kernel (costs.ops._grad_accumulation)
        grad_accumulation="unfused",
        # ZeRO-2/3 run as FSDP2 (executor/zero.py): flat-buffer copy-in / copy-out around every
        # collective; FSDP2 overlaps its collectives through CUDA side streams only, so on a CPU
        # they are waited for where they are issued (parsim.sim.actions.fsdp_copy, engine)
        zero_copies="fsdp2",
        zero_overlap=m.device_type != "cpu",
        gemm_surface=surfaces.gemm if surfaces else None,
        attention_surface=surfaces.attention or None if surfaces else None,
        membound_surface=surfaces.membound or None if surfaces else None,
        fit_report=surfaces.report or None if surfaces else None,
        optimizer_per_tensor_s=per_tensor,
        optimizer_levels=surfaces.optimizer_levels if surfaces else None,
        split_overhead=split_overhead(m.split_extra),
        optimizer_sharded_per_tensor_s=_first_measured(dtensor_per_tensor_s, m.comm),
        fsdp_gather_host_s=fsdp_host[0] if fsdp_host else None,
        fsdp_scatter_host_s=fsdp_host[1] if fsdp_host else None)


def _first_measured(reduce, comm: dict) -> Any:
    """``reduce(rank results)`` of the first communication job (by world size) it gives a value
    for; None where none measured it."""
    return next((x for x in (reduce(r) for _, r in sorted(comm.items())) if x is not None), None)


def split_overhead(extra: dict[str, float] | None) -> dict[str, float] | None:
    """``split_extra``'s measurements as ``costs.split_backward.split_weight_overhead``'s
    fractions of one layer's fused backward B1: extra(L) = B1 (a L + b L^2) through L = 1 and
    4, so b = (e4 - 4 e1) / (12 B1) and a = e1 / B1 - b; extras and terms clamped at 0 (noise)."""
    if not extra or extra.get("b1", 0.0) <= 0:
        return None
    b1, e1, e4 = extra["b1"], max(extra["e1"], 0.0), max(extra["e4"], 0.0)
    squared = max((e4 - 4 * e1) / (12 * b1), 0.0)
    return {"per_layer": max(e1 / b1 - squared, 0.0), "per_layer_squared": squared}


def stage_probes(stages, layer, rounds=None, overlap: bool = False) -> StageProbes:
    """The synthetic stages' measured seconds, with the real-layer probe of the same run as
    their reference, and each round's total (``specs.surfaces.StageProbes``); ``overlap``: a
    CUDA device, whose host issues kernels ahead of it."""
    _, fwd, bwd = layer
    return StageProbes(stages=tuple(StageProbe(spec=dataclasses.asdict(spec), mbs=mbs, fwd_s=f.median, bwd_s=b.median)
                                    for spec, mbs, f, b in stages),
                       reference=(fwd.median, bwd.median), rounds=tuple(rounds) if rounds else None,
                       overlap=overlap)


def _network(m: Measurements, collectives: CollectiveTables) -> dict[str, Any]:
    host_ab = fit_alpha_beta([n for n, _ in m.host_copy], [s.median for _, s in m.host_copy])
    host = {"bandwidth": 1.0 / host_ab.beta if host_ab.beta > 0 else math.inf, "latency": host_ab.alpha}
    ar = (collectives.ops or {}).get("all_reduce")
    if ar:
        entry = ar[min(ar)]    # the smallest group measured, 2 ranks by default
        intra = {"bandwidth": 1.0 / entry.beta, "latency": entry.alpha}
    elif m.base:
        intra = dict(m.base["network"]["intra_node"])
    else:
        raise ValueError("no collective measured and no base profile for the network numbers")
    # One machine: every rank is on this node, so "inter-node" traffic is the same loopback
    # (CPU) or, on a GPU box, only known from the base profile.
    gpu_base = bool(m.base) and m.device_type == "cuda"
    inter = dict(m.base["network"]["inter_node"]) if gpu_base else dict(intra)
    net: dict[str, Any] = {"intra_node": _floats(intra), "inter_node": _floats(inter), "host_link": _floats(host),
                           "nics_per_node": int(m.base["network"].get("nics_per_node", 1)) if gpu_base else 1}
    if collectives:
        net["collectives"] = collectives.to_dict()
    return net


def _floats(d: dict) -> dict[str, float]:
    return {k: float(v) for k, v in d.items()}
