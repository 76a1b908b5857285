"""Where the step time of the tensor-parallel plans goes: measured vs simulated, per component.

    .venv/bin/python studies/validation_cpu/tp_breakdown.py [--profile PROFILE] [--probe] [--execute]

From the traces `parsim validate` left in traces/ (planNN.measured.json, the median round) it
splits rank 0's step of every TP plan in validation.csv into

* own compute: the F/B/R actions less the TP collectives inside them (per action kind), and
  the optimizer step;
* TP collectives, each matched across its TP group (the i-th collective of every member is
  the same call): "in call" = the time the last-arriving member spends in it (the collective
  itself), "wait" = the rest of the mean over members (the earlier members wait for the
  last), "layer" = the transformer layers' Megatron collectives the simulator models, "edge"
  = the embedding / output-head / vocab-parallel cross-entropy ones (layer -1 in the trace);

and re-simulates each plan with the profile (mode=full, per-segment detail) twice: pricing the
TP collectives back to back (the profile's ``alpha``) and in situ (its ``alpha_insitu``,
``parsim.costs.timing.collective_time``), to show what the in-situ latency changes.
Per segment (the compute between two consecutive layer collectives) it compares the median
measured length with the simulated one (are TP-sharded layers slower than priced?).

``--probe`` runs the calibration's collectives job for the TP ops (back to back, and in situ:
``parsim.calibration.insitu``) on 2 and 4 ranks now; ``--execute`` then runs tp=2 (gbs=8, 3
steps) on the executor, so probe and executor see the same machine; ``--write-profile PATH``
merges the probe's in-situ keys into a copy of the profile and reports with it. They need torch.
"""
from __future__ import annotations

import argparse
import copy
import csv
import json
import statistics as st
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from parsim.sim import simulate  # noqa: E402
from parsim.specs import RankLayout, cluster_from_dict, load_model, load_profile_dict, parse_plan  # noqa: E402
from parsim.trace.io import load_trace  # noqa: E402

MS = 1e3


# ----------------------------------------------------------------------------- trace analysis

def _events(trace, rank: int, stream: str) -> list:
    return sorted((e for e in trace.events if e.rank == rank and e.stream == stream), key=lambda e: e.start)


def collectives(trace, plan) -> dict[str, float]:
    """Rank 0's TP collectives matched across its TP group: counts and seconds per step."""
    layout = RankLayout(plan.dp, plan.tp, plan.pp)
    group = next(g for g in layout.tp_groups() if 0 in g)
    per = {r: _events(trace, r, "tp") for r in group}
    n = min(len(v) for v in per.values())
    out: dict[str, float] = defaultdict(float)
    for i in range(n):
        evs = [per[r][i] for r in group]
        cls = "layer" if evs[0].layer >= 0 else "edge"
        last = max(evs, key=lambda e: e.start)
        mean = st.fmean(e.end - e.start for e in evs)
        out[f"{cls}_n"] += 1
        out[f"{cls}_mean_s"] += mean                  # what a member spends in it, on average
        out[f"{cls}_call_s"] += last.end - last.start
        out[f"{cls}_skew_s"] += max(e.start for e in evs) - min(e.start for e in evs)
    out["rank0_s"] = sum(e.end - e.start for e in per[0])
    return dict(out)


def own_compute(trace, rank: int) -> dict[str, float]:
    """Seconds per action kind of rank ``rank`` with the TP collectives inside taken out."""
    tp = _events(trace, rank, "tp")
    out: dict[str, float] = defaultdict(float)
    for a in _events(trace, rank, "compute"):
        if a.layer != -1 or a.kind not in ("F", "B", "I", "W", "optimizer"):
            continue                                  # whole actions only (not the simulator's detail segments)
        inside = sum(e.end - e.start for e in tp if a.start <= e.start < a.end)
        out[a.kind] += a.end - a.start - inside
    return dict(out)


def segments(trace, rank: int) -> dict[tuple, list[float]]:
    """Compute seconds before each layer collective, keyed (action kind, k-th collective of
    that layer in the action): the ops between two consecutive TP collectives."""
    tp = _events(trace, rank, "tp")
    out: dict[tuple, list[float]] = defaultdict(list)
    for a in _events(trace, rank, "compute"):
        if a.layer != -1 or a.kind not in ("F", "B"):
            continue
        prev, seen = a.start, defaultdict(int)
        for e in (e for e in tp if a.start <= e.start < a.end):
            if e.layer >= 0:
                out[(a.kind, seen[e.layer])].append(e.start - prev)
                seen[e.layer] += 1
            prev = e.end
    return out


# ----------------------------------------------------------------------------- simulation

def cluster_for(profile: dict, world: int, in_situ: bool):
    """The profile's cluster; ``in_situ=False`` drops the in-situ keys (back-to-back prices)."""
    prof = copy.deepcopy(profile)
    if not in_situ:
        for per in prof["network"].get("collectives", {}).values():
            for entry in per.values():
                entry.pop("alpha_insitu", None)
                entry.pop("alpha_insitu_shared", None)
    return cluster_from_dict(prof, num_devices=world)


def predicted(model, profile: dict, plan, in_situ: bool):
    return simulate(model, cluster_for(profile, plan.world_size, in_situ), plan, mode="full", detail=True)


# ----------------------------------------------------------------------------- report

def tp_rows(out_dir: Path) -> list[dict]:
    with (out_dir / "validation.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if parse_plan(r["plan"]).tp > 1]
    return rows


def report_plan(model, profile: dict, row: dict, out_dir: Path) -> dict:
    plan = parse_plan(row["plan"])
    meas = load_trace(out_dir / f"{row['trace_file']}.measured.json")
    mc, comp = collectives(meas, plan), own_compute(meas, 0)
    b2b, ins = predicted(model, profile, plan, False), predicted(model, profile, plan, True)
    pc_b2b, pc_ins = collectives(b2b.trace, plan), collectives(ins.trace, plan)
    pcomp = own_compute(ins.trace, 0)
    steps = float(row["measured_step_s"])
    print(f"\n== {row['trace_file']}  {plan.to_string()}")
    print(f"   step: measured {steps * MS:7.1f} ms (median of rounds); simulated back-to-back "
          f"{b2b.step_time_s * MS:7.1f} ({(b2b.step_time_s - steps) / steps:+.1%}), in situ "
          f"{ins.step_time_s * MS:7.1f} ({(ins.step_time_s - steps) / steps:+.1%})")
    kinds = sorted(set(comp) | set(pcomp))
    print("   rank-0 own compute (ms):  " + "  ".join(
        f"{k} {comp.get(k, 0) * MS:6.1f}/{pcomp.get(k, 0) * MS:6.1f}" for k in kinds) + "   (measured/simulated)")
    for cls in ("layer", "edge"):
        n = mc.get(f"{cls}_n", 0)
        if not n:
            continue
        line = (f"   {cls:5s} TP collectives: {int(n):3d}/step, measured per call {mc[f'{cls}_mean_s'] / n * MS:5.2f} ms "
                f"(in call {mc[f'{cls}_call_s'] / n * MS:4.2f} + wait {(mc[f'{cls}_mean_s'] - mc[f'{cls}_call_s']) / n * MS:4.2f};"
                f" arrival skew {mc[f'{cls}_skew_s'] / n * MS:4.2f}), {mc[f'{cls}_mean_s'] * MS:6.1f} ms/step")
        pn = pc_ins.get(f"{cls}_n", 0)
        if pn:
            line += (f" | simulated {int(pn)}/step at {pc_b2b[f'{cls}_mean_s'] / pn * MS:4.2f} (back to back) / "
                     f"{pc_ins[f'{cls}_mean_s'] / pn * MS:4.2f} ms (in situ)")
        else:
            line += " | not simulated"
        print(line)
    seg_m, seg_p = segments(meas, 0), segments(ins.trace, 0)
    parts = []
    for key in sorted(seg_p):
        if seg_m.get(key):
            parts.append(f"{key[0]}{key[1]} {st.median(seg_m[key]) * MS:5.2f}/{st.median(seg_p[key]) * MS:5.2f}")
    print("   per-layer compute segments, median ms (measured/simulated): " + ", ".join(parts))
    return {"plan": plan.to_string(), "measured": steps, "b2b": b2b.step_time_s, "in_situ": ins.step_time_s}


# ----------------------------------------------------------------------------- probe (torch)

def probe(profile: dict, worlds=(2, 4), repeats: int = 10) -> dict:
    """The calibration's collectives job (``calibration.comm.run_comm_job``) for the TP ops:
    back to back over a few sizes and in situ at the TP buffer of cpu-small (mbs=1, fp32), on
    ``worlds`` ranks now. Prints both and returns {world: per-rank results}."""
    import numpy as np

    from parsim.calibration.comm import CommJob, run_comm_job
    from parsim.calibration.insitu import INSITU_OPS, per_rank_bytes
    from parsim.calibration.tables import group_samples
    from parsim.calibration.runner import insitu_gemm, insitu_sizes

    model = load_model("cpu-small")
    full = insitu_sizes(model, "fp32", (1,))
    out = {}
    for world in worlds:
        blocks = tuple((n, *insitu_gemm(model, n, 1)) for n in range(2, world + 1) if world % n == 0)
        job = CommJob(world=world, device_type="cpu", sizes=(32768, 131072, 262144, 1048576), ops=INSITU_OPS,
                      repeats=repeats, point_budget_s=1.0, min_sample_s=2e-2, contention_gemm=(128, 512, 512),
                      contention_dtype="fp32", contention_s=0.2, insitu_sizes=full, insitu_blocks=blocks)
        ranks = out[world] = run_comm_job(job)
        for op in INSITU_OPS:
            x = per_rank_bytes(op, full[0], world)
            b2b = group_samples(ranks, op)
            near = min(b2b, key=lambda s: abs(s - x))
            ins = ranks[0]["insitu"][op][x]
            shipped = profile["network"]["collectives"][op][str(world)]
            print(f"probe {world} ranks {op:14s} x={x:7d} B: back to back {b2b[near].median * MS:5.2f} ms (at {near} B),"
                  f" in situ {np.median(ins) * MS:5.2f} ms (p10 {np.percentile(ins, 10) * MS:5.2f}, p90 "
                  f"{np.percentile(ins, 90) * MS:5.2f}); profile back to back {(shipped['alpha'] + shipped['beta'] * x) * MS:5.2f}")
            for n, per in ranks[0]["insitu_groups"].items():
                xs = per_rank_bytes(op, full[0], n)
                v = per[op][xs]
                print(f"      TP groups of {n} on {world} ranks, in situ {np.median(v) * MS:5.2f} ms "
                      f"(p10 {np.percentile(v, 10) * MS:5.2f}, p90 {np.percentile(v, 90) * MS:5.2f})")
    return out


def merge_insitu(profile: dict, measured: dict) -> dict:
    """A copy of ``profile`` with the in-situ keys fitted from ``probe`` results against the
    profile's own back-to-back bytes time (``calibration.tables.insitu_fit``)."""
    from parsim.calibration.tables import insitu_fit
    from parsim.specs import CollectiveTables

    prof = copy.deepcopy(profile)
    prof["name"] = f"{profile['name']}-insitu"
    prof["source"] = f"{profile.get('source', '?')}; in-situ TP collectives merged by tp_breakdown.py --probe"
    table = CollectiveTables.from_dict(prof["network"]["collectives"])
    for world, ranks in sorted(measured.items()):
        for op, samples in ranks[0]["insitu"].items():
            fit = table.ops[op][world]
            table = table.with_fit(op, world, fit.with_insitu(insitu_fit(samples, fit.bytes_seconds)))
        for n, per in ranks[0]["insitu_groups"].items():
            for op, samples in per.items():
                fit = table.ops[op][n]
                table = table.with_fit(op, n, fit.with_insitu(insitu_fit(samples, fit.bytes_seconds), host_ranks=world))
    prof["network"]["collectives"] = table.to_dict()
    import datetime as dt
    prof.setdefault("provenance", {})["insitu"] = {
        "by": "studies/validation_cpu/tp_breakdown.py --probe (calibration.insitu, cpu-small mbs=1 fp32)",
        "date": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        "note": "alpha_insitu fitted against this profile's back-to-back beta; the rest is the profile as it was"}
    return prof


def execute_tp2() -> None:
    from parsim.executor import run_plans
    from parsim.executor.config import ExecutorConfig
    from parsim.executor.worker import RunSpec

    model, plan = load_model("cpu-small"), parse_plan("tp=2 gbs=8 dtype=fp32")
    res = run_plans([RunSpec(model, plan, ExecutorConfig(steps=3, warmup=2))])[0]
    mc = collectives(res.trace, plan)
    n = mc["layer_n"]
    print(f"executor now, tp=2: step {res.step_time_s * MS:.1f} ms; layer all-reduces {int(n)}/step at "
          f"{mc['layer_mean_s'] / n * MS:.2f} ms per call (in call {mc['layer_call_s'] / n * MS:.2f}, "
          f"wait {(mc['layer_mean_s'] - mc['layer_call_s']) / n * MS:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=str(ROOT / "calibration/profiles/cpu-calibrated.yaml"))
    ap.add_argument("--out", default=str(HERE), help="the validate output folder [this folder]")
    ap.add_argument("--probe", action="store_true", help="run the in-situ probe on 2 and 4 ranks now (torch)")
    ap.add_argument("--execute", action="store_true", help="with --probe: also run tp=2 on the executor")
    ap.add_argument("--write-profile", metavar="PATH",
                    help="with --probe: write --profile with the probe's in-situ keys merged in, and report with it")
    args = ap.parse_args()
    out_dir, profile = Path(args.out), load_profile_dict(args.profile)
    model = load_model("cpu-small")
    if args.probe:
        measured = probe(profile)
        if args.execute:
            execute_tp2()
        if args.write_profile:
            from parsim.calibration import write_profile
            profile = merge_insitu(profile, measured)
            write_profile(profile, args.write_profile)
            print(f"wrote {args.write_profile}")
            args.profile = args.write_profile
    has = any("alpha_insitu" in e for per in profile["network"].get("collectives", {}).values() for e in per.values())
    print(f"profile {args.profile}: {'has' if has else 'has no'} alpha_insitu "
          f"({'in-situ and back-to-back runs differ' if has else 'both simulations price back to back'})")
    results = [report_plan(model, profile, row, out_dir) for row in tp_rows(out_dir)]
    if results:
        err = lambda key: st.median(abs(r[key] - r["measured"]) / r["measured"] for r in results)  # noqa: E731
        print(f"\nTP plans: median |step error| back to back {err('b2b'):.1%}, in situ {err('in_situ'):.1%}")
        print(json.dumps([{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in results]))


if __name__ == "__main__":
    main()
