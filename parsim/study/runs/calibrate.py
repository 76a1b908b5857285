"""``parsim calibrate --runs``: run logs -> fitted profiles, with the evidence.

1. Read the log (``observations.read_runs``): observations and skipped rows with reasons.
2. Fit, per profile with at least ``MIN_RUNS`` runs, the numbers ``parameters`` names
   (robust Levenberg-Marquardt, ``fit.fit``); a parameter the data cannot identify keeps
   its documented start and is reported. Profiles with fewer runs take the fitted stack and
   elementwise numbers of the most-measured GPU (they are fractions of each GPU's own
   datasheet / benchmark ceilings); their runs are then an out-of-GPU check.
3. Fit each stack's allocator (reserve, fragmentation) to the measured memory rows; stacks of
   the same allocator family without rows take it (``parameters.ALLOCATOR_FAMILIES``).
4. Report every group's error and, with ``loso``, each group predicted by a fit without it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from parsim.specs.stack import STACKS

from .observations import Observation, Skipped, read_runs, time_like
from .predict import Prediction, base_profiles, predict, with_values
from .fit import FitParam, FitResult, expand, fit, fit_memory
from .parameters import ANALOGY, allocator_owner, fit_parameters

MIN_RUNS = 5          # runs of a GPU the fit needs before it fits that GPU's numbers


@dataclass
class GroupError:
    group: str
    rows: int
    mape: float               # %
    median: float             # signed, %, + = predicted faster (throughput) / larger (memory)
    not_fitting: int          # runs that ran but are predicted not to fit


@dataclass
class RunsCalibration:
    observations: list[Observation]
    skipped: list[Skipped]
    params: list[FitParam]
    fit: FitResult | None
    values: dict[tuple, float]                 # every number written into the profiles
    sources: dict[tuple, str]                  # how each was obtained
    memory: dict[tuple[str, str], tuple[float, float, int]]
    predictions: list[Prediction]
    groups: list[GroupError]
    loso: list[GroupError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def fitted_how(p, value: float, unidentified: bool, spread: float) -> str:
    """How a fitted number came about, as the report and the profile's comment say it: at a
    bound (with the bound's source), weakly identified (with its start, and whether it stayed
    within 10 % of it), or fitted with its 1-sigma spread."""
    bound = (f"at its bound {p.hi:g} ({p.source.split(';')[-1].strip()})" if value >= p.hi * 0.999
             else f"at its bound {p.lo:g}" if value <= p.lo * 1.001 else "")
    if not unidentified:
        return f"fit, {bound}" if bound else f"fit, 1 sigma {100 * spread:.1f} %"
    if bound:
        return f"weakly identified (1 sigma > 50 %): {bound}, start {p.start:g}"
    near = abs(value / p.start - 1) <= 0.1
    return f"weakly identified (1 sigma > 50 %): {'near' if near else f'{value / p.start:.2g}x'} its start {p.start:g}"


def calibrate_runs(path: str, profiles: dict[str, dict] | None = None, group_column: str | None = None,
                   loso: bool = True, max_iter: int = 15, log=None) -> RunsCalibration:
    obs, skipped = read_runs(path, group_column)
    if not obs:
        from parsim.specs import SpecError
        raise SpecError("runs", path, "a log with at least one usable row (all were skipped)")
    base = profiles or base_profiles(o.profile for o in obs)
    out = fit_all(obs, base, max_iter, log, exact=True)
    out.skipped = skipped
    out.groups = errors(obs, out.predictions)
    if loso:
        out.loso = leave_one_group_out(obs, base, max_iter, log)
    return out


def fit_all(obs: list[Observation], base: dict[str, dict], max_iter: int = 15, log=None,
            exact: bool = False) -> RunsCalibration:
    """Fit ``obs`` over the ``base`` profiles; its predictions under the fitted numbers are the
    fast path's, or with ``exact`` what ``parsim simulate`` says (``predict``): the fit itself
    follows the fast path, a report the engine."""
    runs_per_profile = {p: len({o.run_key for o in obs if o.profile == p and time_like(o)}) for p in base}
    fitted = [p for p, n in runs_per_profile.items() if n >= MIN_RUNS]
    # the fitted GPUs' rows only: another GPU's runs are an out-of-GPU check, not evidence
    evidence = [o for o in obs if o.profile in fitted]
    params = fit_parameters(evidence, base)
    result, warnings = None, []
    values: dict[tuple, float] = {}
    sources: dict[tuple, str] = {}
    if params:
        if log:
            log(f"fitting {len(params)} numbers to {sum(time_like(o) for o in evidence)} timing rows ...")
        result = fit(evidence, base, params, max_iter=max_iter, log=log)
        final = dict(result.values)
        for p in params:
            how = fitted_how(p, result.values[p.key], p.label in result.unidentified, result.spread[p.key])
            sources[p.key] = how
            for other in p.tied:
                sources[(p.profile, *p.path[:-2], other, p.path[-1])] = f"as {p.stack}: {how}"
        values = expand(final, params)
        warnings += [f"{p.label}: weakly identified by these runs (1 sigma > 50 %): {result.values[p.key]:.4g} "
                     f"against its documented start {p.start:g}; the data hardly constrain it, so it leans on "
                     "the weak prior" for p in params if p.label in result.unidentified]
    donor = max(fitted, key=lambda p: runs_per_profile[p]) if fitted else None
    for p in base:
        if p in fitted or donor is None:
            continue
        for key, v in list(values.items()):
            if key[0] == donor:
                values[(p, *key[1:])] = v
                sources[(p, *key[1:])] = f"carried over from {donor}: {sources.get(key, 'fit')}"
        if runs_per_profile[p]:
            warnings.append(f"{p}: {runs_per_profile[p]} runs (< {MIN_RUNS}): numbers carried over from {donor}; "
                            "its runs are an out-of-GPU check")
    profiles = with_values(base, values)
    preds = predict(obs, profiles)
    memory = fit_memory(obs, preds)
    for profile in {p for p, _ in memory}:
        measured = {s for p, s in memory if p == profile}
        for stack in STACKS:
            owner = allocator_owner(stack, measured)
            if owner is None:
                continue
            reserve, frag, n = memory[(profile, owner)]
            for name, v in (("memory_reserve_bytes", reserve), ("fragmentation", frag)):
                key = (profile, "device", "stacks", stack, name)
                values[key] = v
                sources[key] = f"{'' if owner == stack else f'as {owner}: '}fit to {n} measured memory rows"
    if memory or exact:
        if exact and log:
            log("pricing the runs whose fast-path prices are approximate with the SimPy engine ...")
        preds = predict(obs, with_values(base, values), exact=exact)
    return RunsCalibration(obs, [], params, result, values, sources, memory, preds, [], warnings=warnings)


def errors(obs: list[Observation], preds: list[Prediction], kinds=("time", "memory")) -> list[GroupError]:
    """Per group: MAPE and signed median of the timing rows (and, as "<group>:memory", of
    the memory rows), and the runs that ran but are predicted not to fit."""
    out = []
    for kind in kinds:
        by: dict[str, list[tuple[float, float, bool]]] = {}
        for o, p in zip(obs, preds):
            if (kind == "time") != time_like(o) or (kind == "memory" and o.kind != "memory"):
                continue
            err = p.value / o.value - 1.0
            speed = (o.value / p.value - 1.0) if o.kind in ("step_time", "layer_fwd", "layer_bwd",
                                                           "layer_fwd_bwd") else err
            by.setdefault(o.group + ("" if kind == "time" else ":memory"), []).append((err, speed, p.fits))
        for g, rows in sorted(by.items()):
            e = np.array([r[0] for r in rows])
            s = np.array([r[1] for r in rows])
            out.append(GroupError(g, len(rows), 100 * float(np.mean(np.abs(e))), 100 * float(np.median(s)),
                                  sum(1 for r in rows if not r[2])))
    return out


def leave_one_group_out(obs: list[Observation], base: dict[str, dict], max_iter: int = 15, log=None) -> list[GroupError]:
    """Each group with timing rows predicted by a fit to all the other groups."""
    out = []
    for g in sorted({o.group for o in obs if time_like(o)}):
        if log:
            log(f"leave out {g} ...")
        rest = [o for o in obs if o.group != g]
        held = [o for o in obs if o.group == g and time_like(o)]
        cal = fit_all(rest, base, max_iter) if rest else None
        profiles = with_values(base, cal.values) if cal else base
        preds = predict(held, profiles, exact=True)
        out += errors(held, preds, ("time",))
    return out


def stack_runs(obs: list[Observation]) -> dict[tuple[str, str], list[str]]:
    """(profile, stack) -> the groups whose timing rows ran it (for the profile comments)."""
    out: dict[tuple[str, str], set[str]] = {}
    for o in obs:
        if time_like(o):
            out.setdefault((o.profile, o.stack), set()).add(o.group)
            for s, (b, _) in ANALOGY.items():
                if b == o.stack:
                    out.setdefault((o.profile, s), set())
    return {k: sorted(v) for k, v in out.items()}


def spread_text(v: float) -> str:
    return f"{100 * v:.1f} %" if math.isfinite(v) else "n/a"
