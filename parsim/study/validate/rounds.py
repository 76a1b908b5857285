"""Running a validation: every plan of a matrix on the torch executor, in rounds, and on the
simulator; resumable.

A shared, noisy machine drifts in speed from one minute to the next, so every plan can be
measured in several *rounds*: round 1 runs every plan once, round 2 again, and so on
(consecutive plans of one world size share one set of executor processes), and a plan's
measured step time is the median over its rounds; its memory, busy time, losses and trace
come from the round closest to that median. Each finished run is appended to ``rounds.csv``
and each finished plan to ``validation.csv`` (``matrix``), so an interrupted run resumes where
it stopped (finished plans and rounds are kept and skipped). Asked for more rounds than a finished
plan has (``--rounds``), it measures the missing ones and judges the plan again: a study can
take its rounds across several matrices in turn, so a slow spell of the machine falls on every
matrix's plans (``studies/validation_cpu/heldout/run.sh``).

When the profile has a real-layer probe, the executor re-takes it around every timed step and
each round is also predicted with the profile anchored to those probes
(``parsim.calibration.anchor``). ``predicted_step_s`` stays the profile's own prediction;
``anchored_step_s`` is the median over rounds of the anchored predictions, ``probe_drift`` the
median over rounds of the layer's solo time over the profile's, and ``probe_contention`` the
median of the layer's concurrent slowdown.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable

from parsim.specs import ModelSpec, Plan, SpecError, load_cluster

from .compare import MedianMeasurement, ValidationReport, compare, summarise
from .matrix import (CSV_NAME, DID_NOT_FIT, RAN, ROUNDS_NAME, Matrix, MeasuredRound, append_round, append_row, drop_rows,
                     load_matrix, read_rounds, read_rows)

# consecutive plans of one world size run in one set of executor processes (start-up is seconds)
PLANS_PER_LAUNCH = 4


def launches(plans: list[Plan], per_launch: int = PLANS_PER_LAUNCH) -> list[list[Plan]]:
    """Consecutive plans of one world size, at most ``per_launch`` per executor launch."""
    out: list[list[Plan]] = []
    for p in plans:
        if out and out[-1][0].world_size == p.world_size and len(out[-1]) < per_launch:
            out[-1].append(p)
        else:
            out.append([p])
    return out


def median_round(rounds: list[MeasuredRound]) -> MeasuredRound:
    """The round whose step time is closest to the median over the rounds (ties: earlier)."""
    med = statistics.median(r.step_time_s for r in rounds)
    return min(rounds, key=lambda r: (abs(r.step_time_s - med), r.round))


def validate_matrix(matrix: str | Path, profile: str | Path, out: str | Path, *, rounds: int | None = None,
                    fresh: bool = False, worst: int = 3, progress: bool = True) -> ValidationReport:
    """``parsim validate``: check the inputs, run what is not yet in ``out`` (everything with
    ``fresh``), and draw the error plot and the ``worst`` plans' side-by-side timelines."""
    from parsim.plots import plot_timeline_pair
    from parsim.plots.validation import plot_validation
    from parsim.specs.files import check_output_dir
    from parsim.trace.io import load_trace

    spec = load_matrix(matrix)
    check_plans(spec, profile)
    if rounds is not None and rounds < 1:
        raise SpecError("rounds", rounds, "an integer >= 1")
    out = check_output_dir(out, "out")
    out.mkdir(parents=True, exist_ok=True)
    if fresh:
        for name in (CSV_NAME, ROUNDS_NAME):
            if (out / name).exists():
                (out / name).unlink()
    report = run_validation(spec, profile, out, progress=progress, rounds=rounds)
    rows = report.rows
    if not rows:            # every plan ran out of device memory: nothing to compare or draw
        return report
    report.plots.append(plot_validation(
        rows, out / "validation.png",
        title=f"{spec.model.name}: simulator ({profile}) vs torch executor, {len(rows)} plans"))
    for i, r in enumerate(sorted(rows, key=lambda r: -abs(r["step_error"]))[:worst]):
        pred = load_trace(out / f"{r['trace_file']}.predicted.json")
        meas = load_trace(out / f"{r['trace_file']}.measured.json")
        report.plots.append(plot_timeline_pair(pred, meas, out / f"worst{i + 1}_timeline.png",
                                               title=f"{r['plan']}  (step error {r['step_error']:+.1%})"))
    return report


def check_plans(spec: Matrix, profile: str | Path) -> None:
    """The whole profile, and every plan of the matrix against its model on the profile's cluster
    and what the executor does not run (``executor.checks.check_executable``), before any
    executor round: a bad plan found only when its turn comes would fail a validation after the
    plans before it had run (minutes to an hour). The error names the plan's place in the
    matrix: ``matrix.plans[i].<field>``."""
    from parsim.executor.checks import check_executable

    clusters = {world: load_cluster(f"cpu:{world}", profile=profile)
                for world in sorted({p.world_size for p in spec.plans})}
    for i, plan in enumerate(spec.plans):
        try:
            check_executable(spec.model, plan, cluster=clusters[plan.world_size])
        except SpecError as err:
            raise SpecError(f"matrix.plans[{i}].{err.field}", err.value,
                            f"{err.allowed} (plan {plan.to_string()!r})") from None


def run_validation(matrix: Matrix, profile: str, out_dir: str | Path, *, progress: bool = True,
                   on_row: Callable[[dict[str, Any]], None] | None = None, rounds: int | None = None) -> ValidationReport:
    """Run every plan not yet in ``out_dir/validation.csv``, or judged there over fewer than
    ``rounds`` rounds, on both engines, ``rounds`` times on the executor (default: the matrix's;
    the rounds already in ``rounds.csv`` are kept); resumable."""
    from parsim.calibration.anchor import probe_request
    from parsim.calibration.host_alloc import use_profile_policy
    from parsim.specs import load_profile_dict

    rounds = matrix.rounds if rounds is None else rounds
    profile_data = load_profile_dict(profile)
    use_profile_policy(profile_data)      # the executor's ranks run under the profile's host memory policy
    out = Path(out_dir)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    measured: dict[tuple[str, int], MeasuredRound] = {(m.plan, m.round): m for m in read_rounds(out)}
    rows = read_rows(out)
    # a row judged over fewer rounds than asked for now is measured further and judged again
    done = {r["plan"] for r in rows
            if r["outcome"] != RAN or all((r["plan"], k) in measured for k in range(rounds))}
    stale = {r["plan"] for r in rows} - done
    if stale:
        drop_rows(out, stale)
    todo = [p for p in matrix.plans if p.to_string() not in done]
    unfit = run_rounds(matrix, todo, rounds, out, measured, probe_request(profile_data), progress)
    for plan in todo:
        if plan.to_string() in unfit:
            row = unfit_row(matrix, plan, profile, unfit[plan.to_string()])
        else:
            row = judge_plan(matrix, plan, rounds, out, measured, profile, profile_data)
        append_row(out, row)
        if on_row:
            on_row(row)
    ours = {p.to_string() for p in matrix.plans}
    rows = [r for r in read_rows(out) if r["plan"] in ours]
    ran = [r for r in rows if r["outcome"] == RAN]
    did_not_fit = [r for r in rows if r["outcome"] != RAN]
    return ValidationReport(rows=ran, summary=summarise(ran, did_not_fit), did_not_fit=did_not_fit)


def run_rounds(matrix: Matrix, todo: list[Plan], rounds: int, out: Path,
               measured: dict[tuple[str, int], MeasuredRound], layer_probe: tuple[ModelSpec, int, str] | None,
               progress: bool) -> dict[str, str]:
    """Every (plan, round) of ``todo`` not yet in ``measured`` on the executor, round after
    round; each finished run is added to ``measured`` and appended to ``rounds.csv``. A plan
    that runs out of device memory is not run again: returns {plan: why it did not fit}."""
    from parsim.executor.config import ExecutorConfig
    from parsim.trace.io import save_trace

    runs_left = sum(1 for k in range(rounds) for p in todo if (p.to_string(), k) not in measured)
    bar = _progress(runs_left, 0, progress, unit="run")
    config = ExecutorConfig(steps=matrix.steps, warmup=matrix.warmup, layer_probe=layer_probe)
    unfit: dict[str, str] = {}
    for k in range(rounds):
        left = [p for p in todo if (p.to_string(), k) not in measured and p.to_string() not in unfit]
        for group in launches(left):
            for plan, res in run_group(matrix.model, group, config):
                if isinstance(res, str):
                    unfit[plan.to_string()] = res
                    bar.update(sum(1 for j in range(k, rounds) if (plan.to_string(), j) not in measured))
                    continue
                idx = matrix.plans.index(plan)
                trace_file = f"traces/plan{idx:02d}.round{k + 1}.measured.json"
                save_trace(res.trace, out / trace_file)
                m = MeasuredRound(plan.to_string(), k, res.step_time_s, list(res.step_times),
                                  list(res.peak_memory_bytes_by_rank), list(res.losses), trace_file, res.trace,
                                  list(res.layer_probes))
                append_round(out, m, plan.world_size)
                measured[(m.plan, k)] = m
                bar.set_postfix_str(f"round {k + 1}/{rounds} {plan.to_string()[:40]} {res.step_time_s:.2f} s")
                bar.update(1)
    bar.close()
    return unfit


# What an executor failure says when a rank ran out of memory: torch's CUDA allocator
# (torch.OutOfMemoryError, "CUDA out of memory"), its CPU allocator ("DefaultCPUAllocator: can't
# allocate memory ... Cannot allocate memory", ENOMEM), Python's MemoryError, or a rank the
# kernel's out-of-memory killer ended (SIGKILL: it sends no other signal).
_OUT_OF_MEMORY = ("OutOfMemoryError", "out of memory", "can't allocate memory", "Cannot allocate memory",
                  "MemoryError", "process died (SIGKILL)")


def out_of_memory(message: str) -> bool:
    return any(m in message for m in _OUT_OF_MEMORY)


def run_group(model: ModelSpec, group: list[Plan], config) -> list[tuple[Plan, object]]:
    """(plan, ExecutionResult, or why it did not fit) for the plans of one launch. When a rank
    runs out of memory the launch is repeated one plan at a time, so the plans that fit are
    still measured and the one that does not is named; any other failure ends the validation."""
    from parsim.executor import run_plans
    from parsim.executor.launch import ExecutorError
    from parsim.executor.worker import RunSpec

    try:
        return list(zip(group, run_plans([RunSpec(model, plan, config) for plan in group])))
    except ExecutorError as err:
        if not out_of_memory(str(err)):
            raise
        if len(group) == 1:
            return [(group[0], str(err).splitlines()[0][:300] if str(err) else "out of memory")]
    return [outcome for plan in group for outcome in run_group(model, [plan], config)]


def unfit_row(matrix: Matrix, plan: Plan, profile: str, cause: str) -> dict[str, Any]:
    """The ``validation.csv`` row of a plan that did not fit the device: the simulator's
    prediction (does it also say the plan does not fit?) and the executor's failure."""
    from parsim.sim import simulate

    predicted = simulate(matrix.model, load_cluster(f"cpu:{plan.world_size}", profile=profile), plan,
                         record_events=False)
    return {"plan": plan.to_string(), "model": matrix.model.name, "world_size": plan.world_size,
            "predicted_step_s": predicted.step_time_s, "predicted_peak_bytes": predicted.peak_memory_bytes,
            "predicted_fits": predicted.fits, "outcome": f"{DID_NOT_FIT}: {cause}"}


def judge_plan(matrix: Matrix, plan: Plan, rounds: int, out: Path, measured: dict[tuple[str, int], MeasuredRound],
               profile: str, profile_data: dict[str, Any]) -> dict[str, Any]:
    """A plan's ``validation.csv`` row: its measured rounds against the simulator's prediction
    (every rank simulated, so the traces line up rank by rank), plus the anchored prediction."""
    from parsim.sim import simulate
    from parsim.trace.io import load_trace, save_trace

    name = plan.to_string()
    mine = sorted((m for (p, _), m in measured.items() if p == name and _ < rounds), key=lambda m: m.round)
    chosen = median_round(mine)
    if chosen.trace is None:
        chosen.trace = load_trace(out / chosen.trace_file)
    cluster = load_cluster(f"cpu:{plan.world_size}", profile=profile)
    predicted = simulate(matrix.model, cluster, plan, mode="full")
    step = statistics.median(m.step_time_s for m in mine)
    trace_file = f"traces/plan{matrix.plans.index(plan):02d}"
    save_trace(chosen.trace, out / f"{trace_file}.measured.json")
    save_trace(predicted.trace, out / f"{trace_file}.predicted.json")
    return compare(matrix.model, plan, MedianMeasurement(step, chosen), predicted, trace_file,
                   rounds=[m.step_time_s for m in mine], anchor=anchored_prediction(matrix.model, plan, mine,
                                                                                   profile_data))


def anchored_prediction(model: ModelSpec, plan: Plan, mine: list[MeasuredRound],
                        profile_data: dict[str, Any]) -> dict[str, float] | None:
    """``anchored_step_s`` (seconds), ``probe_drift`` and ``probe_contention`` (ratios), each the
    median over the plan's rounds; None when the profile or a round has no layer probe."""
    from parsim.calibration.anchor import anchored_profile, mean_probe, probe_drift, probe_request
    from parsim.sim import simulate
    from parsim.specs import cluster_from_dict

    if not (probe_request(profile_data) and all(m.layer_probes for m in mine)):
        return None
    anchored = [anchored_profile(profile_data, m.layer_probes) for m in mine]
    return {
        "anchored_step_s": statistics.median(
            simulate(model, cluster_from_dict(a, num_devices=plan.world_size), plan, mode="full").step_time_s
            for a in anchored),
        "probe_drift": statistics.median(probe_drift(profile_data, m.layer_probes) for m in mine),
        "probe_contention": statistics.median(mean_probe(m.layer_probes)["contention"] for m in mine)}


def _progress(total: int, initial: int, enabled: bool, unit: str = "plan"):
    from tqdm import tqdm
    import sys
    return tqdm(total=total, initial=initial, unit=unit, desc="validate", file=sys.stderr, disable=not enabled,
                dynamic_ncols=True)
