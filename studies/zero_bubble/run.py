"""Zero-bubble and DualPipe schedules: bubble fraction and step time vs microbatches.

Three parts (``--part``; all by default), each a CSV, drawn together in ``zero_bubble.png``:

* ``unit``: every schedule's unit-time dry run (F = I = W = 1, B = I + W = 2: the units of
  Qi et al. 2023, arXiv:2401.10241) against the published closed forms of the idle time per
  rank (``parsim.schedules.closed_form_idle_time``: Narayanan et al. 2021 Eq. 1; Qi et al.
  2023 Table 1 / Sec 3.1 / Sec 6; DeepSeek-AI 2024, arXiv:2412.19437, Table 2) -> unit_bubbles.csv
* ``scale``: GPT-3 175B on 1024 A100-80GB (dp=8 tp=8 pp=16, mbs=1, sp, ZeRO-1), each schedule
  at m = 16 ... 128 microbatches, recompute selective and full, one step each through the
  SimPy engine (fast path alongside) -> scale_175b.csv
* ``executor``: cpu-small on this machine's gloo ranks (``executor_run.py``), measured against
  the SimPy engine with the cpu-calibrated profile -> executor.csv

    .venv/bin/python studies/zero_bubble/run.py            # all; ~1 min + the executor part
    .venv/bin/python studies/zero_bubble/run.py --quick    # executor part cut to a smoke test
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from matplotlib import rc_context

from parsim.fast import PlanTable, evaluate
from parsim.plots.style import RC, new_figure, save
from parsim.schedules import build_schedule, closed_form_idle_time, dry_run
from parsim.sim import simulate
from parsim.specs import SpecError, load_cluster, load_model, parse_plan

HERE = Path(__file__).resolve().parent
SCHEDULES = [("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zbv", 2), ("dualpipev", 2)]
UNIT_SCHEDULES = SCHEDULES[:3] + [("zb-h2", 1)] + SCHEDULES[3:]
UNIT_PP = (2, 4, 8)
SCALE_MICROBATCHES = (16, 32, 48, 64, 128)
SCALE_LAYOUT = "dp=8 tp=8 pp=16 mbs=1 sp=true zero=1"
COLORS = {"1f1b": "#0072b2", "interleaved": "#009e73", "zb-h1": "#e69f00", "zb-h2": "#cc79a7", "zbv": "#d55e00",
          "dualpipev": "#56b4e9"}


def unit_rows() -> list[dict]:
    """Dry-run idle time per rank (the largest) and bubble vs the closed form, in units."""
    rows = []
    for name, vpp in UNIT_SCHEDULES:
        for pp in UNIT_PP:
            for m in (pp, 2 * pp, 4 * pp, 8 * pp):
                try:
                    schedule = build_schedule(name, pp, m, vpp=vpp)
                except SpecError:
                    continue
                run = dry_run(schedule, t_f=1, t_b=2)
                idle = max(run.makespan - busy for busy in run.busy_time)
                closed = closed_form_idle_time(name, pp, m, vpp, t_f=1, t_b=2)
                rows.append({"schedule": name, "vpp": vpp, "pp": pp, "microbatches": m,
                             "makespan_units": float(run.makespan), "max_idle_units": float(idle),
                             "closed_form_idle_units": None if closed is None else float(closed),
                             "equal": None if closed is None else idle == closed,
                             "bubble_fraction": float(run.bubble_fraction)})
    return rows


def scale_rows(microbatches=SCALE_MICROBATCHES) -> list[dict]:
    """GPT-3 175B / 1024 GPUs: SimPy step per (schedule, m, recompute), fast path alongside."""
    model, cluster = load_model("gpt3-175b"), load_cluster("a100-80g:1024")
    dp = int(SCALE_LAYOUT.split()[0].split("=")[1])
    rows = []
    for name, vpp in SCHEDULES:
        for recompute in ("selective", "full"):
            for m in microbatches:
                text = f"{SCALE_LAYOUT} gbs={dp * m} recompute={recompute} schedule={name} vpp={vpp}"
                try:
                    plan = parse_plan(text)
                    result = simulate(model, cluster, plan, record_events=False)
                except SpecError as e:
                    print(f"skip {text}: {e}", file=sys.stderr)
                    continue
                fast = evaluate(model, cluster, PlanTable.from_plans([plan]))
                rows.append({"schedule": name, "vpp": vpp, "recompute": recompute, "microbatches": m,
                             "microbatches_per_stage": m / plan.pp, "step_time_s": result.step_time_s,
                             "bubble_fraction": result.bubble_fraction, "mfu": result.mfu, "hfu": result.hfu,
                             "peak_memory_bytes": result.peak_memory_bytes, "fits": result.fits,
                             "fast_step_time_s": float(fast.step_time_s[0]),
                             "fast_bubble_fraction": float(fast.bubble_fraction[0]), "plan": plan.to_string()})
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def _series(rows, name, recompute, key):
    sel = [r for r in rows if r["schedule"] == name and r.get("recompute", recompute) == recompute]
    return [float(r["microbatches"]) for r in sel], [float(r[key]) for r in sel]


def plot(scale: list[dict], executor: list[dict], path: Path) -> None:
    """Four panels: 175B bubble and speed-up over 1F1B vs m (selective), the recompute=full slowdown,
    and the executor's measured bubble next to the simulated one."""
    with rc_context(RC):
        fig = new_figure(12, 8.5)
        (bub, step), (rec, exe) = fig.subplots(2, 2)
        for name, _ in SCHEDULES:
            c = COLORS[name]
            bub.plot(*_series(scale, name, "selective", "bubble_fraction"), "o-", color=c, label=name)
            m1, one = _series(scale, "1f1b", "selective", "step_time_s")
            ms, st = _series(scale, name, "selective", "step_time_s")
            ref = dict(zip(m1, one))
            step.plot(ms, [ref[x] / t - 1 for x, t in zip(ms, st)], "o-", color=c, label=name)
            m, full = _series(scale, name, "full", "step_time_s")
            m2, sel = _series(scale, name, "selective", "step_time_s")
            ratio = [f / s for f, s, a, b in zip(full, sel, m, m2) if a == b]
            rec.plot(m[:len(ratio)], ratio, "o-", color=c, label=name)
        bub.set(xlabel="microbatches per step (pp = 16)", ylabel="bubble fraction",
                title="GPT-3 175B / 1024 A100, recompute=selective (SimPy)")
        step.set(xlabel="microbatches per step (pp = 16)", ylabel="throughput over 1F1B - 1",
                 title="speed-up over 1F1B, same plans")
        rec.set(xlabel="microbatches per step (pp = 16)", ylabel="step time full / selective",
                title="recompute=full: split-backward W re-runs the forward")
        for name, _ in SCHEDULES:
            for pp, marker in (("2", "o"), ("4", "s")):
                sel = [r for r in executor if r["schedule"] == name and r["pp"] == pp]
                if sel:
                    exe.plot([float(r["microbatches"]) for r in sel], [float(r["measured_bubble"]) for r in sel],
                             marker + "-", color=COLORS[name], label=f"{name} pp={pp} measured")
                    exe.plot([float(r["microbatches"]) for r in sel], [float(r["predicted_bubble"]) for r in sel],
                             marker + ":", color=COLORS[name], alpha=0.6)
        exe.set(xlabel="microbatches per step", ylabel="bubble fraction",
                title="cpu-small on gloo: measured (solid) vs SimPy (dotted)")
        if not executor:
            exe.text(0.5, 0.5, "not measured yet: run.py --part executor", ha="center", transform=exe.transAxes)
        for ax in (bub, step, rec, exe):
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        save(fig, path)


def summary(unit: list[dict], scale: list[dict]) -> list[str]:
    """The findings' numbers, printed and written to results.txt."""
    out = []
    checked = [r for r in unit if r["equal"] not in (None, "")]
    bad = [r for r in checked if str(r["equal"]) not in ("True", "true")]
    out.append(f"unit time: {len(checked)} (schedule, pp, m) points with a closed form, "
               f"{len(checked) - len(bad)} equal to the dry run's largest idle time per rank")
    for r in bad:
        out.append(f"  differs: {r}")
    by = {(r["schedule"], r["recompute"], int(float(r["microbatches"]))): r for r in scale}
    for (name, recompute, m), r in sorted(by.items()):
        ref = by.get(("1f1b", recompute, m))
        vs = f" {float(ref['step_time_s']) / float(r['step_time_s']) - 1:+.1%} vs 1f1b" if ref else ""
        out.append(f"175B {name:12s} {recompute:9s} m={m:4d}: step {float(r['step_time_s']):7.2f} s, bubble "
                   f"{float(r['bubble_fraction']):.3f}, peak {float(r['peak_memory_bytes']) / 2**30:5.1f} GiB{vs}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "unit", "scale", "executor", "plot"), default="all")
    ap.add_argument("--quick", action="store_true", help="executor part: pp=2, m=4, 3 steps (a smoke test)")
    ap.add_argument("--out", default=str(HERE), help="output folder [this study's]")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.part in ("all", "unit"):
        write_csv(unit_rows(), out / "unit_bubbles.csv")
    if args.part in ("all", "scale"):
        write_csv(scale_rows(), out / "scale_175b.csv")
    if args.part in ("all", "executor"):
        from executor_run import executor_rows
        write_csv(executor_rows(quick=args.quick), out / ("executor_quick.csv" if args.quick else "executor.csv"))
    unit, scale = read_csv(out / "unit_bubbles.csv"), read_csv(out / "scale_175b.csv")
    executor = read_csv(out / "executor.csv") or read_csv(out / "executor_quick.csv")
    lines = summary(unit, scale) + [f"executor {r['plan']}: measured step {float(r['measured_step_s']) * 1e3:.0f} ms, "
                                    f"simulated {float(r['predicted_step_s']) * 1e3:.0f} ms; bubble "
                                    f"{float(r['measured_bubble']):.3f} vs {float(r['predicted_bubble']):.3f}; "
                                    f"peak {float(r['measured_peak_bytes']) / 2**20:.1f} vs "
                                    f"{float(r['predicted_peak_bytes']) / 2**20:.1f} MiB" for r in executor]
    (out / "results.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if scale:
        plot(scale, executor, out / "zero_bubble.png")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
