"""Measured against predicted: one ``validation.csv`` row per plan and the summary over them.

Errors are relative to the measurement: ``(predicted - measured) / measured``. Ranking
agreement is Spearman's rho between the predicted and measured step times (Spearman 1904;
ties get average ranks)."""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parsim.specs import ModelSpec, Plan

from .matrix import ANCHOR_COLUMNS, RAN, MeasuredRound


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


def peaks_by_rank(predicted, plan) -> list[float]:
    """A simulation's predicted peak bytes of every rank (its pipeline stage's total)."""
    from parsim.specs import RankLayout
    layout = RankLayout(plan.dp, plan.tp, plan.pp)
    by_stage = [s["total"] if isinstance(s, dict) else s.total for s in predicted.memory_by_stage]
    return [by_stage[layout.coords(r)[0]] for r in range(plan.world_size)]


def compare(model: ModelSpec, plan: Plan, measured, predicted, trace_file: str = "",
            rounds: list[float] | None = None, anchor: dict[str, float] | None = None) -> dict[str, Any]:
    """One CSV row from an ExecutionResult (or a ``MedianMeasurement``) and a SimResult of the
    same plan; ``rounds``: the step time of every round (the row's is their median);
    ``anchor``: the drift-anchored prediction (``anchored_step_s``, ``probe_drift``,
    ``probe_contention``; ``parsim.calibration.anchor``), or None."""
    from parsim.trace.metrics import bubble_fraction, busy_time

    pred_by_rank = peaks_by_rank(predicted, plan)
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
        "predicted_fits": predicted.fits, "outcome": RAN,
        **({**anchor, "anchored_error": (anchor["anchored_step_s"] - measured.step_time_s) / measured.step_time_s}
           if anchor else {k: "" for k in ANCHOR_COLUMNS}),
    }


@dataclass
class MedianMeasurement:
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


@dataclass
class ValidationReport:
    """The rows of ``validation.csv`` for the matrix's plans and their summary; ``to_dict()`` is
    the JSON of ``parsim validate --json``. ``plots``: the charts written (error plot, then the
    worst plans' side-by-side timelines)."""
    rows: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    plots: list[Path] = field(default_factory=list)
    did_not_fit: list[dict[str, Any]] = field(default_factory=list)   # plans that ran out of device memory

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary, "rows": self.rows, "did_not_fit": self.did_not_fit}


def summarise(rows: list[dict[str, Any]], did_not_fit: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """Errors over the plans that ran; ``did_not_fit``: plans that ran out of device memory,
    counted with how many of them the simulator also predicted not to fit."""
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
        "num_did_not_fit": len(did_not_fit),
        "num_did_not_fit_predicted": sum(1 for r in did_not_fit if r.get("predicted_fits") is False),
        **({"mape_step_time_anchored": statistics.fmean(abs(r["anchored_error"]) for r in rows),
            "spearman_step_time_anchored": spearman_rho([r["anchored_step_s"] for r in rows],
                                                        [r["measured_step_s"] for r in rows])} if anchored else {}),
    }
