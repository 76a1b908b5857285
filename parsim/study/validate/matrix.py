"""The files of a validation: the matrix YAML it reads, and the two tables it writes in its
output folder — ``validation.csv`` (one row per finished plan, ``compare``) and ``rounds.csv``
(one row per finished executor run, ``MeasuredRound``). Rows are appended as they finish, so an
interrupted validation resumes from these files."""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parsim.specs import ModelSpec, Plan, SpecError, load_model, parse_plan
from parsim.specs.files import path_exists, read_mapping, write_text

from .logs import Cells, is_count, is_finite_non_negative, is_number, read_log

CSV_NAME = "validation.csv"
ROUNDS_NAME = "rounds.csv"
ROUND_COLUMNS = ["plan", "round", "world_size", "step_time_s", "step_times_s", "peak_bytes_by_rank", "losses",
                 "trace_file", "layer_probes"]
COLUMNS = ["plan", "model", "world_size", "measured_step_s", "measured_rounds_s", "predicted_step_s", "step_error",
           "measured_peak_bytes", "predicted_peak_bytes", "peak_memory_error", "max_rank_memory_error",
           "measured_bubble", "predicted_bubble", "measured_busy_s_by_rank", "predicted_busy_s_by_rank",
           "measured_peak_bytes_by_rank", "predicted_peak_bytes_by_rank", "losses", "trace_file",
           "anchored_step_s", "anchored_error", "probe_drift", "probe_contention", "predicted_fits", "outcome"]
# ``outcome`` of a plan: it ran, or it did not fit the device ("did not fit: <the executor's error>",
# and only the plan's prediction is filled in); files written before the column read as RAN
RAN = "ran"
DID_NOT_FIT = "did not fit"
_FLOAT_COLUMNS = ("measured_step_s", "predicted_step_s", "step_error", "measured_peak_bytes", "predicted_peak_bytes",
                  "peak_memory_error", "max_rank_memory_error", "measured_bubble", "predicted_bubble")
# columns that stay empty when the profile has no layer probe (or rounds.csv predates it)
ANCHOR_COLUMNS = ("anchored_step_s", "anchored_error", "probe_drift", "probe_contention")


_MATRIX_KEYS = ("model", "plans", "steps", "warmup", "rounds", "description")
_MAX_COUNT = 10_000     # steps, warm-up steps or rounds of a validation: far beyond any use


@dataclass(frozen=True)
class Matrix:
    model: ModelSpec
    plans: list[Plan]
    steps: int = 4
    warmup: int = 1
    rounds: int = 1


def load_matrix(path: str | Path) -> Matrix:
    p = Path(path)
    if not path_exists(p):
        raise SpecError("matrix", str(path), "an existing YAML file with 'model' and 'plans'")
    data = read_mapping(p, "matrix")
    if "plans" not in data:
        raise SpecError("matrix", str(path), "a YAML mapping with 'model' and a list 'plans'")
    unknown = sorted((k for k in data if k not in _MATRIX_KEYS), key=str)
    if unknown:
        k = unknown[0]
        raise SpecError(f"matrix.{k}", data[k], "unknown key; allowed: model, plans, steps, warmup, rounds, "
                        "description")
    for key, low in (("steps", 1), ("warmup", 0), ("rounds", 1)):
        if key in data and (not isinstance(data[key], int) or isinstance(data[key], bool) or data[key] < low
                            or data[key] > _MAX_COUNT):
            raise SpecError(f"matrix.{key}", data[key], f"an integer >= {low} (at most {_MAX_COUNT:,})")
    if not isinstance(data["plans"], list) or not all(isinstance(t, (str, dict)) for t in data["plans"]):
        raise SpecError("matrix.plans", data["plans"], "a list of plans, each a 'k=v ...' string or a mapping")
    if not isinstance(data.get("model", "cpu-small"), str):
        raise SpecError("matrix.model", data["model"], "a preset name, a model YAML or a HF config.json path")
    plans = [parse_plan(t) for t in data["plans"]]
    if not plans:
        raise SpecError("matrix.plans", [], "at least one plan")
    if len({p.to_string() for p in plans}) < len(plans):
        dup = next(p.to_string() for i, p in enumerate(plans) if p.to_string() in {q.to_string() for q in plans[:i]})
        raise SpecError("matrix.plans", dup, "each plan once (a plan's rows and rounds are keyed by it)")
    return Matrix(model=load_model(data.get("model", "cpu-small")), plans=plans,
                  steps=int(data.get("steps", 4)), warmup=int(data.get("warmup", 1)),
                  rounds=int(data.get("rounds", 1)))


def read_rows(out_dir: Path) -> list[dict[str, Any]]:
    """``validation.csv`` back, every cell checked (``logs.read_log``; SpecError on a bad one)."""
    rows = []
    for cells in read_log(out_dir / CSV_NAME, ("plan", "world_size")):
        r = dict(cells.row)
        r["outcome"] = r.get("outcome") or RAN
        for k in _FLOAT_COLUMNS + ANCHOR_COLUMNS:
            signed = k.endswith("_error") or k.startswith("probe_")      # relative errors: either sign
            r[k] = cells.number(k, optional=True, minimum=-math.inf if signed else 0.0)
        r["predicted_fits"] = {"True": True, "False": False}.get(r.get("predicted_fits") or "")
        r["world_size"] = cells.integer("world_size", minimum=1)
        rows.append(r)
    return rows


def append_row(out_dir: Path, row: dict[str, Any]) -> None:
    _append_csv(out_dir / CSV_NAME, COLUMNS, row)


def drop_rows(out_dir: Path, plans: set[str]) -> None:
    """``validation.csv`` without the rows of ``plans`` (to be judged again over more rounds),
    written whole, its header kept."""
    path = out_dir / CSV_NAME
    records = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))
    buffer = io.StringIO()
    csv.writer(buffer).writerows(records[:1] + [r for r in records[1:] if r and r[0] not in plans])
    write_text(path, buffer.getvalue(), "out")


def _append_csv(path: Path, columns: list[str], row: dict[str, Any]) -> None:
    """Append ``row``; a file written before a column was added keeps its own header (the
    new columns are left out of its rows, and read back as missing)."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    header = next(csv.reader(io.StringIO(old)), None)
    if header:
        columns = header
    buffer = io.StringIO()
    w = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    if not header:
        w.writeheader()
    w.writerow(row)
    # the table and the new row, written whole: a full disk leaves the old table, not half a row
    write_text(path, old + buffer.getvalue(), "out")


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
    def from_csv(cls, cells: Cells) -> "MeasuredRound":
        return cls(plan=cells.text("plan"), round=cells.integer("round"),
                   step_time_s=cells.number("step_time_s"),
                   step_times_s=cells.json_list("step_times_s", is_finite_non_negative, "seconds >= 0"),
                   peak_memory_bytes_by_rank=cells.json_list("peak_bytes_by_rank", is_count, "byte counts >= 0"),
                   losses=cells.json_list("losses", is_number, "numbers"), trace_file=cells.text("trace_file"),
                   layer_probes=cells.json_list("layer_probes", lambda x: isinstance(x, dict), "mappings", "[]"))


def read_rounds(out_dir: Path) -> list[MeasuredRound]:
    """``rounds.csv`` back, every cell checked (``logs.read_log``; SpecError on a bad one)."""
    return [MeasuredRound.from_csv(c) for c in read_log(out_dir / ROUNDS_NAME, tuple(ROUND_COLUMNS[:-1]))]


def append_round(out_dir: Path, m: MeasuredRound, world_size: int) -> None:
    _append_csv(out_dir / ROUNDS_NAME, ROUND_COLUMNS, {
        "plan": m.plan, "round": m.round, "world_size": world_size, "step_time_s": m.step_time_s,
        "step_times_s": json.dumps([round(x, 6) for x in m.step_times_s]),
        "peak_bytes_by_rank": json.dumps(list(m.peak_memory_bytes_by_rank)),
        "losses": json.dumps([round(x, 6) for x in m.losses]), "trace_file": m.trace_file,
        "layer_probes": json.dumps(m.layer_probes)})
