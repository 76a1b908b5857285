"""Observations -> the simulator's predictions, through the fast path (``parsim.fast``).

Each distinct run (model, cluster, stack, candidate plans) is evaluated once: its candidates
in one PlanTable, the fastest that fits taken (the fastest of all when none fits: the run is
then reported as predicted not to fit). A whole data set (~200 runs) takes about a second,
so a fit can afford hundreds of evaluations. ``exact=True`` (the reported predictions) runs
the SimPy engine on every candidate whose fast-path price is approximate
(``fast.honesty``) and could beat the chosen one, as a sweep does before it ranks: the number
reported is then what ``parsim simulate`` prints for the plan. Layer-time metrics read the fast path's
per-layer table (``fast.tables.layer_row``: the same op and TP-collective times the engines
use).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from parsim.fast import PlanTable, evaluate
from parsim.fast.honesty import PESSIMISM, approximate_mask
from parsim.fast.tables import (L_BWD, L_FWD, L_RECOMPUTE, L_TP_BWD, L_TP_FWD, L_TP_RECOMPUTE, layer_row,
                                with_stack)
from parsim.specs import ClusterSpec, cluster_from_dict, load_profile_dict

from .observations import Observation, published_from_step, time_like


@dataclass(frozen=True)
class Prediction:
    value: float            # in the observation's SI unit; for "oom": 1.0 = predicted not to fit
    fits: bool              # the chosen plan fits
    step_time_s: float
    peak_memory_bytes: float
    capacity_bytes: float
    plan: str
    engine: str = "fast"    # whose step time: "fast" (the closed form) or "sim" (the SimPy engine)


def base_profiles(names) -> dict[str, dict]:
    return {n: load_profile_dict(n) for n in sorted(set(names))}


def clusters_for(profiles: dict[str, dict], observations: list[Observation]) -> dict[tuple, ClusterSpec]:
    """Each observation's cluster (``Observation.cluster_key``): its profile on its GPU count,
    with the network its source states where it differs from the profile's node."""
    out = {}
    for o in observations:
        key = o.cluster_key
        if key not in out:
            out[key] = cluster_on_network(profiles[o.profile], o.gpus, o.network_overrides())
    return out


def cluster_on_network(profile: dict, gpus: int, network: dict | None = None) -> ClusterSpec:
    """``gpus`` devices of a profile (its dict), with keys of its ``network`` section replaced
    by ``network`` (a source's own nodes: ``sources.SourceFacts.network``)."""
    if network:
        profile = {**profile, "network": {**profile.get("network", {}), **network}}
    return cluster_from_dict(profile, num_devices=gpus)


def predict(observations: list[Observation], profiles: dict[str, dict] | None = None,
            exact: bool = False) -> list[Prediction]:
    """Every observation's prediction under ``profiles`` (name -> profile dict; default: the
    shipped ones); ``exact``: approximate fast-path prices that matter re-run by the engine."""
    profiles = profiles or base_profiles(o.profile for o in observations)
    clusters = clusters_for(profiles, observations)
    runs: dict[tuple, dict] = {}
    out = []
    for o in observations:
        r = runs.get(o.run_key)
        if r is None:
            r = runs[o.run_key] = _run(o, clusters[o.cluster_key], exact)
        out.append(_prediction(o, r))
    return out


def fastest_fitting(res) -> tuple[int, np.ndarray]:
    """(the index of the fastest plan of a fast-path result that fits, or of the fastest of all
    when none fits -- a run logged as having run is then predicted not to fit; which plans fit)."""
    fits = res.fits()
    return _fastest(res.step_time_s, fits), fits


def _choosable(fits: np.ndarray) -> np.ndarray:
    """The plans a run may be predicted with: those that fit, all where none does."""
    return fits if fits.any() else np.ones(len(fits), dtype=bool)


def _fastest(steps: np.ndarray, fits: np.ndarray) -> int:
    idx = np.flatnonzero(_choosable(fits))
    return int(idx[np.argmin(steps[idx])])


def exact_steps(model, cluster: ClusterSpec, table: PlanTable, steps: np.ndarray, fits: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """(step times, True where the SimPy engine priced the plan) of a table's plans, from their
    fast-path ``steps``: every approximate plan (``fast.honesty.approximate_mask``) among the ones
    that may be chosen (``_choosable``) whose fast price, allowed ``PESSIMISM`` of error, could
    still beat the best price known, run by the engine, until none is left (``parsim.study.sweep``
    ranks its top the same way). Peak memory, and so ``fits``, is the same in both engines."""
    from parsim.sim import simulate
    from parsim.study.sweep import simulable
    steps = np.array(steps, dtype=float)
    eligible = _choosable(fits)
    todo = eligible & approximate_mask(table.cols, cluster)
    for j in np.flatnonzero(todo):
        todo[j] = simulable(model, cluster, table.plan(int(j)))
    by_sim = np.zeros(len(steps), dtype=bool)
    while True:
        best = steps[eligible].min()
        reach = np.flatnonzero(todo & ~by_sim & (steps / (1.0 + PESSIMISM) < best))
        if not len(reach):
            return steps, by_sim
        for j in reach:
            steps[j] = simulate(model, cluster, table.plan(int(j)), record_events=False).step_time_s
            by_sim[j] = True


def _run(o: Observation, cluster: ClusterSpec, exact: bool = False) -> dict:
    table = PlanTable.from_plans([p.replace(stack=o.stack) for p in o.plans])
    res = evaluate(o.model, cluster, table)
    i, fits = fastest_fitting(res)
    step, by_sim = float(res.step_time_s[i]), False
    if exact and not o.kind.startswith("layer_"):
        steps, sims = exact_steps(o.model, cluster, table, res.step_time_s, fits)
        i = _fastest(steps, fits)
        step, by_sim = float(steps[i]), bool(sims[i])
    plan = table.plan(i)
    out = {"step": step, "engine": "sim" if by_sim else "fast", "fits": bool(fits[i]), "any_fit": bool(fits.any()),
           "peak": float(res.peak_memory_bytes[i]), "capacity": float(res.capacity_bytes), "plan": plan.to_string(),
           "reported": reported_memory(with_stack(o.model, cluster, table)[1], float(res.peak_memory_bytes[i]))}
    if o.kind.startswith("layer_"):
        model, eff, _ = with_stack(o.model, cluster, table)
        row = layer_row(model, eff, plan)
        out["layer_fwd"] = row[L_FWD] + row[L_TP_FWD]
        out["layer_bwd"] = row[L_BWD] + row[L_TP_BWD] + row[L_RECOMPUTE] + row[L_TP_RECOMPUTE]
    return out


def reported_memory(cluster: ClusterSpec, allocated: float) -> float:
    """What a run log reports as a device's memory (the allocator's reserved bytes, or
    nvidia-smi): the tensors' peak grown by the stack's fragmentation, plus what lives outside
    the allocator (``Stack.fragmentation``, ``Stack.memory_reserve_bytes``; 0 when not stated)."""
    stack = cluster.device.stack
    frag = (stack.fragmentation or 0.0) if stack is not None else 0.0
    reserve = (stack.memory_reserve_bytes or 0.0) if stack is not None else 0.0
    return allocated * (1.0 + frag) + reserve


def _prediction(o: Observation, r: dict) -> Prediction:
    if o.kind == "layer_fwd":
        value = r["layer_fwd"]
    elif o.kind == "layer_bwd":
        value = r["layer_bwd"]
    elif o.kind == "layer_fwd_bwd":
        value = r["layer_fwd"] + r["layer_bwd"]
    elif time_like(o):
        value = published_from_step(o, r["step"])
    elif o.kind == "memory":
        value = r["reported"]
    else:                                     # oom: 1 = predicted not to fit (no candidate fits)
        value = 0.0 if r["any_fit"] else 1.0
    return Prediction(value, r["fits"], r["step"], r["peak"], r["capacity"], r["plan"], r["engine"])


def with_values(profiles: dict[str, dict], values: dict[tuple, float]) -> dict[str, dict]:
    """Copies of the profile dicts with ``values`` set: key (profile, path...) -> number."""
    out = copy.deepcopy(profiles)
    for (profile, *path), v in values.items():
        node = out[profile]
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = v
    return out
