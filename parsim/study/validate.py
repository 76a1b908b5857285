"""Validation: run a matrix of plans on the torch executor and on the simulator, compare.

A shared, noisy machine drifts in speed from one minute to the next, so every plan can be
measured in several *rounds*: round 1 runs every plan once, round 2 again, and so on
(consecutive plans of one world size share one set of executor processes), and a plan's
measured step time is the median over its rounds; its memory, busy time, losses and trace
come from the round closest to that median. Each finished run is appended to ``rounds.csv``
and each finished plan to the CSV, so an interrupted run resumes where it stopped (finished
plans and rounds are kept and skipped). Errors are relative to the measurement:
``(predicted - measured) / measured``. Ranking agreement is Spearman's rho between the
predicted and measured step times (Spearman 1904; ties get average ranks).

Drift anchoring. A profile's compute prices hang on its real-layer probe (``layer_probe``,
``contention_layer``), taken once when ``parsim calibrate`` ran. When the profile has one, the
executor re-takes the same probe right before every timed step and after the last
(``executor.layer_probe``), and the plan's round is also predicted with the profile anchored
to the probes around its timed steps (their mean: the layer's solo forward and backward and
its concurrent slowdown replace the profile's, and ``fit_layer_terms`` re-derives
the composition and contention terms from them; nothing else changes). ``predicted_step_s``
stays the profile's own prediction; ``anchored_step_s`` is the median over rounds of the
anchored predictions, and ``probe_drift`` the median over rounds of the layer's solo time
(forward + backward) over the profile's: how much slower (> 1) the machine ran the same layer
while the plan ran than when it was calibrated.
"""
from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from parsim.specs import ModelSpec, Plan, SpecError, load_cluster, load_model, parse_plan

CSV_NAME = "validation.csv"
ROUNDS_NAME = "rounds.csv"
ROUND_COLUMNS = ["plan", "round", "world_size", "step_time_s", "step_times_s", "peak_bytes_by_rank", "losses",
                 "trace_file", "layer_probes"]
# consecutive plans of one world size run in one set of executor processes (start-up is seconds)
PLANS_PER_LAUNCH = 4
COLUMNS = ["plan", "model", "world_size", "measured_step_s", "measured_rounds_s", "predicted_step_s", "step_error",
           "measured_peak_bytes", "predicted_peak_bytes", "peak_memory_error", "max_rank_memory_error",
           "measured_bubble", "predicted_bubble", "measured_busy_s_by_rank", "predicted_busy_s_by_rank",
           "measured_peak_bytes_by_rank", "predicted_peak_bytes_by_rank", "losses", "trace_file",
           "anchored_step_s", "anchored_error", "probe_drift", "probe_contention"]
# columns that stay empty when the profile has no layer probe (or rounds.csv predates it)
ANCHOR_COLUMNS = ("anchored_step_s", "anchored_error", "probe_drift", "probe_contention")


@dataclass(frozen=True)
class Matrix:
    model: ModelSpec
    plans: list[Plan]
    steps: int = 4
    warmup: int = 1
    rounds: int = 1


def load_matrix(path: str | Path) -> Matrix:
    p = Path(path)
    if not p.exists():
        raise SpecError("matrix", str(path), "an existing YAML file with 'model' and 'plans'")
    data = yaml.safe_load(p.read_text())
    if not isinstance(data, dict) or "plans" not in data:
        raise SpecError("matrix", str(path), "a YAML mapping with 'model' and a list 'plans'")
    unknown = set(data) - {"model", "plans", "steps", "warmup", "rounds", "description"}
    if unknown:
        k = sorted(unknown)[0]
        raise SpecError(f"matrix.{k}", data[k], "unknown key; allowed: model, plans, steps, warmup, rounds, "
                        "description")
    for key, low in (("steps", 1), ("warmup", 0), ("rounds", 1)):
        if key in data and (not isinstance(data[key], int) or isinstance(data[key], bool) or data[key] < low):
            raise SpecError(f"matrix.{key}", data[key], f"an integer >= {low}")
    plans = [parse_plan(t) for t in data["plans"]]
    if not plans:
        raise SpecError("matrix.plans", [], "at least one plan")
    return Matrix(model=load_model(data.get("model", "cpu-small")), plans=plans,
                  steps=int(data.get("steps", 4)), warmup=int(data.get("warmup", 1)),
                  rounds=int(data.get("rounds", 1)))


def spearman_rho(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (Pearson correlation of the average ranks)."""
    ra, rb = _ranks(a), _ranks(b)
    n = len(a)
    if n < 2:
        return float("nan")
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def compare(model: ModelSpec, plan: Plan, measured, predicted, trace_file: str = "",
            rounds: list[float] | None = None, anchor: dict[str, float] | None = None) -> dict[str, Any]:
    """One CSV row from an ExecutionResult (or a ``MeasuredRound``) and a SimResult of the
    same plan; ``rounds``: the step time of every round (the row's is their median);
    ``anchor``: the drift-anchored prediction (``anchored_step_s``, ``probe_drift``,
    ``probe_contention``; module docstring), or None."""
    from parsim.specs import RankLayout
    from parsim.trace.metrics import bubble_fraction, busy_time

    layout = RankLayout(plan.dp, plan.tp, plan.pp)
    pred_by_stage = [s["total"] if isinstance(s, dict) else s.total for s in predicted.memory_by_stage]
    pred_by_rank = [pred_by_stage[layout.coords(r)[0]] for r in range(plan.world_size)]
    meas_by_rank = list(measured.peak_memory_bytes_by_rank)
    rank_errs = [abs(p - m) / m for p, m in zip(pred_by_rank, meas_by_rank) if m > 0]
    meas_busy = busy_time(measured.trace)
    pred_busy = busy_time(predicted.trace)
    return {
        "plan": plan.to_string(), "model": model.name, "world_size": plan.world_size,
        "measured_step_s": measured.step_time_s,
        "measured_rounds_s": json.dumps([round(x, 6) for x in (rounds or [measured.step_time_s])]),
        "predicted_step_s": predicted.step_time_s,
        "step_error": (predicted.step_time_s - measured.step_time_s) / measured.step_time_s,
        "measured_peak_bytes": max(meas_by_rank), "predicted_peak_bytes": max(pred_by_rank),
        "peak_memory_error": (max(pred_by_rank) - max(meas_by_rank)) / max(meas_by_rank),
        "max_rank_memory_error": max(rank_errs) if rank_errs else float("nan"),
        "measured_bubble": bubble_fraction(measured.trace), "predicted_bubble": predicted.bubble_fraction,
        "measured_busy_s_by_rank": json.dumps({int(k): round(v, 6) for k, v in meas_busy.items()}),
        "predicted_busy_s_by_rank": json.dumps({int(k): round(v, 6) for k, v in pred_busy.items()}),
        "measured_peak_bytes_by_rank": json.dumps(meas_by_rank),
        "predicted_peak_bytes_by_rank": json.dumps([int(x) for x in pred_by_rank]),
        "losses": json.dumps([round(x, 6) for x in measured.losses]), "trace_file": trace_file,
        **({**anchor, "anchored_error": (anchor["anchored_step_s"] - measured.step_time_s) / measured.step_time_s}
           if anchor else {k: "" for k in ANCHOR_COLUMNS}),
    }


def read_rows(out_dir: Path) -> list[dict[str, Any]]:
    path = out_dir / CSV_NAME
    if not path.exists():
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("measured_step_s", "predicted_step_s", "step_error", "measured_peak_bytes", "predicted_peak_bytes",
                  "peak_memory_error", "max_rank_memory_error", "measured_bubble", "predicted_bubble"):
            r[k] = float(r[k])
        for k in ANCHOR_COLUMNS:
            r[k] = float(r[k]) if r.get(k) not in (None, "") else None
        r["world_size"] = int(r["world_size"])
    return rows


def append_row(out_dir: Path, row: dict[str, Any]) -> None:
    _append_csv(out_dir / CSV_NAME, COLUMNS, row)


def _append_csv(path: Path, columns: list[str], row: dict[str, Any]) -> None:
    """Append ``row``; a file written before a column was added keeps its own header (the
    new columns are left out of its rows, and read back as missing)."""
    if path.exists():
        with path.open(newline="") as f:
            header = next(csv.reader(f), None)
        if header:
            columns = header
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)


@dataclass
class ValidationReport:
    rows: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary, "rows": self.rows}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(sel: list[dict[str, Any]], key: str) -> dict[str, float]:
        errs = [abs(r[key]) for r in sel]
        return {"median": statistics.median(errs), "max": max(errs), "n": len(errs)} if errs else {}

    by_world = {}
    for w in sorted({r["world_size"] for r in rows}):
        sel = [r for r in rows if r["world_size"] == w]
        by_world[str(w)] = {"step_time": stats(sel, "step_error"), "peak_memory": stats(sel, "max_rank_memory_error")}
        if all(r.get("anchored_error") is not None for r in sel):
            by_world[str(w)]["step_time_anchored"] = stats(sel, "anchored_error")
            by_world[str(w)]["probe_drift"] = stats(sel, "probe_drift")
    anchored = bool(rows) and all(r.get("anchored_step_s") is not None for r in rows)
    return {
        "num_plans": len(rows),
        "mape_step_time": statistics.fmean(abs(r["step_error"]) for r in rows) if rows else float("nan"),
        "mape_peak_memory": statistics.fmean(abs(r["max_rank_memory_error"]) for r in rows) if rows else float("nan"),
        "spearman_step_time": spearman_rho([r["predicted_step_s"] for r in rows], [r["measured_step_s"] for r in rows]),
        "by_world_size": by_world,
        **({"mape_step_time_anchored": statistics.fmean(abs(r["anchored_error"]) for r in rows),
            "spearman_step_time_anchored": spearman_rho([r["anchored_step_s"] for r in rows],
                                                        [r["measured_step_s"] for r in rows])} if anchored else {}),
    }


@dataclass
class MeasuredRound:
    """What validation keeps of one executor run of one plan (a row of ``rounds.csv``)."""
    plan: str
    round: int
    step_time_s: float
    step_times_s: list[float]
    peak_memory_bytes_by_rank: list[int]
    losses: list[float]
    trace_file: str
    trace: Any = None
    layer_probes: list[dict[str, float]] = field(default_factory=list)   # around the timed steps (executor.layer_probe)

    @classmethod
    def from_csv(cls, r: dict[str, str]) -> "MeasuredRound":
        return cls(plan=r["plan"], round=int(r["round"]), step_time_s=float(r["step_time_s"]),
                   step_times_s=json.loads(r["step_times_s"]), peak_memory_bytes_by_rank=json.loads(r["peak_bytes_by_rank"]),
                   losses=json.loads(r["losses"]), trace_file=r["trace_file"],
                   layer_probes=json.loads(r.get("layer_probes") or "[]"))


def read_rounds(out_dir: Path) -> list[MeasuredRound]:
    path = out_dir / ROUNDS_NAME
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [MeasuredRound.from_csv(r) for r in csv.DictReader(f)]


def _append_round(out_dir: Path, m: MeasuredRound, world_size: int) -> None:
    _append_csv(out_dir / ROUNDS_NAME, ROUND_COLUMNS, {
        "plan": m.plan, "round": m.round, "world_size": world_size, "step_time_s": m.step_time_s,
        "step_times_s": json.dumps([round(x, 6) for x in m.step_times_s]),
        "peak_bytes_by_rank": json.dumps(list(m.peak_memory_bytes_by_rank)),
        "losses": json.dumps([round(x, 6) for x in m.losses]), "trace_file": m.trace_file,
        "layer_probes": json.dumps(m.layer_probes)})


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


def run_validation(matrix: Matrix, profile: str, out_dir: str | Path, *, progress: bool = True,
                   on_row: Callable[[dict[str, Any]], None] | None = None, rounds: int | None = None) -> ValidationReport:
    """Run every plan not yet in ``out_dir/validation.csv`` on both engines, ``rounds`` times
    on the executor (default: the matrix's); resumable."""
    from parsim.executor import run_plans
    from parsim.executor.config import ExecutorConfig
    from parsim.executor.worker import RunSpec
    from parsim.sim import simulate
    from parsim.calibration.host_alloc import use_profile_policy
    from parsim.specs import cluster_from_dict, load_profile_dict
    from parsim.trace.io import load_trace, save_trace

    rounds = matrix.rounds if rounds is None else rounds
    profile_data = load_profile_dict(profile)
    use_profile_policy(profile_data)      # the executor's ranks run under the profile's host memory policy
    out = Path(out_dir)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    done = {r["plan"] for r in read_rows(out)}
    todo = [p for p in matrix.plans if p.to_string() not in done]
    measured: dict[tuple[str, int], MeasuredRound] = {(m.plan, m.round): m for m in read_rounds(out)}
    runs_left = sum(1 for k in range(rounds) for p in todo if (p.to_string(), k) not in measured)
    bar = _progress(runs_left, 0, progress, unit="run")
    config = ExecutorConfig(steps=matrix.steps, warmup=matrix.warmup, layer_probe=probe_request(profile_data))
    for k in range(rounds):
        for group in launches([p for p in todo if (p.to_string(), k) not in measured]):
            results = run_plans([RunSpec(matrix.model, plan, config) for plan in group])
            for plan, res in zip(group, results):
                idx = matrix.plans.index(plan)
                trace_file = f"traces/plan{idx:02d}.round{k + 1}.measured.json"
                save_trace(res.trace, out / trace_file)
                m = MeasuredRound(plan.to_string(), k, res.step_time_s, list(res.step_times),
                                  list(res.peak_memory_bytes_by_rank), list(res.losses), trace_file, res.trace,
                                  list(res.layer_probes))
                _append_round(out, m, plan.world_size)
                measured[(m.plan, k)] = m
                bar.set_postfix_str(f"round {k + 1}/{rounds} {plan.to_string()[:40]} {res.step_time_s:.2f} s")
                bar.update(1)
    bar.close()
    for plan in todo:
        name = plan.to_string()
        mine = sorted((m for (p, _), m in measured.items() if p == name and _ < rounds), key=lambda m: m.round)
        chosen = median_round(mine)
        if chosen.trace is None:
            chosen.trace = load_trace(out / chosen.trace_file)
        cluster = load_cluster(f"cpu:{plan.world_size}", profile=profile)
        # every rank simulated, so the simulated trace lines up rank by rank with the measured one
        predicted = simulate(matrix.model, cluster, plan, mode="full")
        step = statistics.median(m.step_time_s for m in mine)
        trace_file = f"traces/plan{matrix.plans.index(plan):02d}"
        save_trace(chosen.trace, out / f"{trace_file}.measured.json")
        save_trace(predicted.trace, out / f"{trace_file}.predicted.json")
        anchor = None
        if probe_request(profile_data) and all(m.layer_probes for m in mine):
            anchored = [anchored_profile(profile_data, m.layer_probes) for m in mine]
            anchor = {
                "anchored_step_s": statistics.median(
                    simulate(matrix.model, cluster_from_dict(a, num_devices=plan.world_size), plan,
                             mode="full").step_time_s for a in anchored),
                "probe_drift": statistics.median(probe_drift(profile_data, m.layer_probes) for m in mine),
                "probe_contention": statistics.median(_mean_probe(m.layer_probes)["contention"] for m in mine)}
        row = compare(matrix.model, plan, _Measured(step, chosen), predicted, trace_file,
                      rounds=[m.step_time_s for m in mine], anchor=anchor)
        append_row(out, row)
        if on_row:
            on_row(row)
    rows = [r for r in read_rows(out) if r["plan"] in {p.to_string() for p in matrix.plans}]
    return ValidationReport(rows=rows, summary=summarise(rows))


def probe_request(profile_data: dict[str, Any]) -> tuple[ModelSpec, int, str] | None:
    """(model, mbs, dtype) of the profile's real-layer probe, for ``ExecutorConfig.layer_probe``;
    None when the profile has none (GPU presets, profiles older than the probe)."""
    from parsim.calibration.layer_terms import profile_model
    from parsim.specs import profile_tables

    probe = profile_tables(profile_data).layer_probe
    prov = profile_data.get("provenance", {})
    if probe is None or not (prov.get("model") or prov.get("model_spec")):
        return None
    return profile_model(profile_data), int(probe.mbs), str(prov.get("dtype", "fp32"))


def _mean_probe(probes: list[dict[str, float]]) -> dict[str, float]:
    """The mean of the probes around a run's timed steps: solo forward and backward seconds,
    concurrent seconds per step, and the concurrent slowdown they give."""
    fwd = statistics.fmean(p["solo_fwd_s"] for p in probes)
    bwd = statistics.fmean(p["solo_bwd_s"] for p in probes)
    conc = statistics.fmean(p["concurrent_s"] for p in probes)
    return {"fwd_s": fwd, "bwd_s": bwd, "concurrent_s": conc, "contention": conc / (fwd + bwd),
            "world": int(probes[0]["world"])}


def probe_drift(profile_data: dict[str, Any], probes: list[dict[str, float]]) -> float:
    """The layer's solo forward + backward seconds around a run over the profile's (1 = as calibrated)."""
    from parsim.specs import profile_tables

    cal = profile_tables(profile_data).layer_probe
    now = _mean_probe(probes)
    return (now["fwd_s"] + now["bwd_s"]) / (float(cal.fwd_s) + float(cal.bwd_s))


def anchored_profile(profile_data: dict[str, Any], probes: list[dict[str, float]]) -> dict[str, Any]:
    """A copy of the profile whose layer probe is the one taken around a run: its solo forward
    and backward seconds, and the concurrent slowdown for the run's rank count; the layer
    composition and GEMM contention are re-derived from them (``fit_layer_terms``) exactly as
    ``parsim calibrate`` derived the profile's. Everything else (per-op tables, collectives)
    is the profile's."""
    import copy
    from dataclasses import replace

    from parsim.calibration.layer_terms import refit_data
    from parsim.specs import profile_tables, with_profile_tables

    now = _mean_probe(probes)
    data = copy.deepcopy(profile_data)
    tables = profile_tables(data)
    tables = tables.replace(layer_probe=replace(tables.layer_probe, fwd_s=now["fwd_s"], bwd_s=now["bwd_s"]))
    if now["world"] > 1 and tables.contention_layer is not None:
        tables = tables.replace(contention_layer=tables.contention_layer.with_value(now["world"], now["contention"]))
    # the probe's layer is the profile's model (``probe_request``), whatever the matrix's is
    return refit_data(with_profile_tables(data, tables))


@dataclass
class _Measured:
    """The median step time over the rounds, with the median round's other measurements."""
    step_time_s: float
    round: MeasuredRound

    @property
    def peak_memory_bytes_by_rank(self) -> list[int]:
        return self.round.peak_memory_bytes_by_rank

    @property
    def trace(self):
        return self.round.trace

    @property
    def losses(self) -> list[float]:
        return self.round.losses


def _progress(total: int, initial: int, enabled: bool, unit: str = "plan"):
    from tqdm import tqdm
    import sys
    return tqdm(total=total, initial=initial, unit=unit, desc="validate", file=sys.stderr, disable=not enabled,
                dynamic_ncols=True)
