"""Drift anchoring: a calibrated profile re-derived from a real-layer probe taken later.

A profile's compute prices hang on its real-layer probe (``CalibratedTables.layer_probe``,
``contention_layer``), taken once when ``parsim calibrate`` ran. A shared machine drifts in
speed, so the executor can re-take the same probe right before every timed step and after the
last (``executor.layer_probe``; ``ExecutorConfig.layer_probe = probe_request(profile)``). The
profile *anchored* to those probes takes their mean — the layer's solo forward and backward
seconds and its concurrent slowdown with the run's rank count — in place of its own, and
re-derives the layer composition and contention terms from them with ``fit_layer_terms``,
exactly as ``parsim calibrate`` derived the profile's; nothing else changes. ``probe_drift``
says how much slower (> 1) the machine ran the same layer then than when it was calibrated.

``parsim validate`` and ``parsim demo`` predict every plan with the profile and with the profile
anchored to the probes around its timed steps. Profile mappings in and out, typed tables
(``parsim.specs.CalibratedTables``) in between: no torch.
"""
from __future__ import annotations

import copy
import statistics
from dataclasses import replace
from typing import Any

from parsim.specs import ModelSpec, profile_tables, with_profile_tables

from .layer_terms import profile_model, refit_data


def probe_request(profile_data: dict[str, Any]) -> tuple[ModelSpec, int, str] | None:
    """(model, mbs, dtype) of the profile's real-layer probe, for ``ExecutorConfig.layer_probe``;
    None when the profile has none (GPU presets, profiles older than the probe)."""
    probe = profile_tables(profile_data).layer_probe
    prov = profile_data.get("provenance", {})
    if probe is None or not (prov.get("model") or prov.get("model_spec")):
        return None
    return profile_model(profile_data), int(probe.mbs), str(prov.get("dtype", "fp32"))


def mean_probe(probes: list[dict[str, float]]) -> dict[str, float]:
    """The mean of the probes around a run's timed steps: solo forward and backward seconds,
    concurrent seconds per step, and the concurrent slowdown they give (a ratio)."""
    fwd = statistics.fmean(p["solo_fwd_s"] for p in probes)
    bwd = statistics.fmean(p["solo_bwd_s"] for p in probes)
    conc = statistics.fmean(p["concurrent_s"] for p in probes)
    return {"fwd_s": fwd, "bwd_s": bwd, "concurrent_s": conc, "contention": conc / (fwd + bwd),
            "world": int(probes[0]["world"])}


def probe_drift(profile_data: dict[str, Any], probes: list[dict[str, float]]) -> float:
    """The layer's solo forward + backward seconds around a run over the profile's (1 = as calibrated)."""
    cal = profile_tables(profile_data).layer_probe
    now = mean_probe(probes)
    return (now["fwd_s"] + now["bwd_s"]) / (float(cal.fwd_s) + float(cal.bwd_s))


def anchored_profile(profile_data: dict[str, Any], probes: list[dict[str, float]],
                     contention: bool = True) -> dict[str, Any]:
    """A copy of the profile whose layer probe is the one taken around a run: its solo forward
    and backward seconds, and the concurrent slowdown for the run's rank count; the layer
    composition and GEMM contention are re-derived from them (``fit_layer_terms``) exactly as
    ``parsim calibrate`` derived the profile's. Everything else (per-op tables, collectives)
    is the profile's. ``contention=False``: the level only, the profile's concurrent slowdown
    kept where it has one for the run's rank count (``api.hardware.reanchored_now``)."""
    now = mean_probe(probes)
    data = copy.deepcopy(profile_data)
    tables = profile_tables(data)
    tables = tables.replace(layer_probe=replace(tables.layer_probe, fwd_s=now["fwd_s"], bwd_s=now["bwd_s"]))
    curve = tables.contention_layer
    if now["world"] > 1 and curve is not None and (contention or now["world"] not in dict(curve.values)):
        tables = tables.replace(contention_layer=tables.contention_layer.with_value(now["world"], now["contention"]))
    # the probe's layer is the profile's model (``probe_request``), whatever the matrix's is
    return refit_data(with_profile_tables(data, tables))
