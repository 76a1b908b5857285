"""What ``parsim calibrate --runs`` prints and writes: the per-group and leave-one-group-out
tables, the fitted numbers with their spread and how each was obtained, warnings, skipped
rows with their reasons, and the profiles (one YAML per GPU of the log)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

from parsim.specs import profiles_dir

from .calibrate import GroupError, RunsCalibration
from .predict import with_values


def group_rows(groups: list[GroupError]) -> list[list[str]]:
    return [[g.group, str(g.rows), f"{g.mape:.1f}", f"{g.median:+.1f}", str(g.not_fitting)] for g in groups]


GROUP_HEADER = ["group", "rows", "MAPE %", "median %", "ran, predicted not to fit"]


def parameter_rows(cal: RunsCalibration) -> list[list[str]]:
    out = []
    for key in sorted(cal.values):
        v = cal.values[key]
        out.append([key[0], ".".join(key[2:] if key[1] == "device" else key[1:]), f"{v:.4g}", cal.sources.get(key, "")])
    return out


def simulated_runs(cal: RunsCalibration) -> tuple[int, int]:
    """(runs whose reported plan the SimPy engine priced, runs)."""
    engine = {o.run_key: p.engine for o, p in zip(cal.observations, cal.predictions)}
    return sum(e == "sim" for e in engine.values()), len(engine)


def render_text(cal: RunsCalibration, table) -> str:
    lines = [f"{len(cal.observations)} usable rows, {len(cal.skipped)} skipped"]
    lines.append("")
    lines.append("error per group (median: + = predicted faster / more memory than published)")
    lines.append(table(group_rows(cal.groups), GROUP_HEADER))
    by_sim, runs = simulated_runs(cal)
    if by_sim:
        lines.append(f"({by_sim} of {runs} runs' chosen plans priced by the SimPy engine: the fast path's "
                     "price is approximate for them; the fit itself follows the fast path)")
    if cal.loso:
        lines += ["", "leave one group out (each group predicted by a fit without it)",
                  table(group_rows(cal.loso), GROUP_HEADER)]
    lines += ["", "fitted numbers", table(parameter_rows(cal), ["profile", "number", "value", "how"])]
    oom = [(o, p) for o, p in zip(cal.observations, cal.predictions) if o.kind == "oom"]
    if oom:
        lines.append(f"\nOOM rows predicted not to fit: {sum(int(p.value) for _, p in oom)} of {len(oom)}")
    for w in cal.warnings:
        lines.append(f"warning: {w}")
    if cal.skipped:
        lines.append("\nskipped rows (reason: rows)")
        for (reason, n) in Counter(s.reason for s in cal.skipped).most_common():
            lines.append(f"  {n:4d}  {reason}")
    return "\n".join(lines)


def to_json(cal: RunsCalibration) -> dict:
    def groups(gs):
        return [{"group": g.group, "rows": g.rows, "mape_pct": g.mape, "median_pct": g.median,
                 "ran_predicted_not_fitting": g.not_fitting} for g in gs]
    return {
        "usable_rows": len(cal.observations), "skipped_rows": len(cal.skipped),
        "runs_priced_by_simpy": simulated_runs(cal)[0],
        "groups": groups(cal.groups), "leave_one_group_out": groups(cal.loso),
        "parameters": [{"profile": k[0], "path": list(k[1:]), "value": v, "how": cal.sources.get(k, "")}
                       for k, v in sorted(cal.values.items())],
        "warnings": cal.warnings,
        "skipped": [{"row": s.row, "source": s.source, "metric": s.metric, "reason": s.reason} for s in cal.skipped],
    }


def write_profiles(cal: RunsCalibration, base: dict[str, dict], out: Path, log_name: str) -> list[Path]:
    """One YAML per profile of the log: the shipped template's text with the fitted block
    where a template exists, else the profile with the fitted numbers, as plain YAML."""
    from .profiles import render, templates_dir
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in sorted({o.profile for o in cal.observations} | {k[0] for k in cal.values}):
        path = out / f"{name}.yaml"
        if (templates_dir() / f"{name}.yaml").exists():
            path.write_text(render(name, cal, log_name))
        else:
            data = with_values({name: base[name]}, {k: v for k, v in cal.values.items() if k[0] == name})[name]
            path.write_text(f"# {name}: numbers fitted to {log_name} by parsim calibrate --runs\n"
                            + yaml.safe_dump(data, sort_keys=False))
        paths.append(path)
    return paths


def default_out() -> Path:
    return Path("out") / "calibrate-runs"


def shipped_dir() -> Path:
    return profiles_dir()
