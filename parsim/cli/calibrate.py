"""``parsim calibrate``: micro-benchmarks on this machine's devices -> profile YAML; or, with
``--runs FILE.csv``, the profiles of the GPUs in a log of past training runs fitted to it
(``parsim.api.calibrate_runs``)."""
from __future__ import annotations

import sys
from pathlib import Path

from .common import add_json_argument, emit_json, table

HELP = ("micro-benchmark this machine (GEMMs, attention, memory-bound ops, collectives) and write a profile YAML; "
        "or fit GPU profiles to a log of training runs (--runs)")


def add_arguments(p) -> None:
    p.add_argument("--model", default=None,
                   help="also measure this model's own shapes (exact tables beside the machine grid; never needed) "
                        "[none: the machine grid only]")
    p.add_argument("--dtype", default="fp32", help="dtype of the GEMM / attention / memory-bound tables [fp32]")
    p.add_argument("--ranks", default="2,4", help="process-group sizes for collectives and contention [2,4]")
    p.add_argument("--repeats", type=int, default=None, help="samples per point (median, p10/p90) [10; 3 with --quick]")
    p.add_argument("--quick", action="store_true", help="a smaller grid, sizes <= 4 MiB, 3 repeats (~30-70 s)")
    p.add_argument("--mbs", default=None, help="micro-batch sizes whose shapes are measured [1,2,4; 1 with --quick]")
    p.add_argument("--tp", default="1,2,4", help="tensor-parallel degrees whose shard shapes are measured [1,2,4]")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl, one GPU per rank) [cpu]")
    p.add_argument("--base", default=None, metavar="PROFILE",
                   help="profile supplying numbers not measured (network with --ranks 1; GPU host/inter-node links)")
    p.add_argument("--name", default=None, help="profile name [<device>-<hostname>]")
    p.add_argument("--out", default=None, metavar="PATH",
                   help="output YAML [calibration/profiles/<name>.yaml]; with --runs a folder [out/calibrate-runs]")
    p.add_argument("--runs", default=None, metavar="FILE.csv",
                   help="fit the profiles of the GPUs in this run log (columns of public_runs_train.csv: model shape, "
                        "GPUs, tp/pp/dp, ZeRO, batch, schedule, recompute, precision, metric, value; optional stack "
                        "column) instead of micro-benchmarking")
    p.add_argument("--group", default=None, metavar="COLUMN",
                   help="with --runs: report errors per this column's values [source]")
    p.add_argument("--no-loso", action="store_true", help="with --runs: skip the leave-one-group-out refits")
    add_json_argument(p)


def run(args) -> int:
    if args.runs:
        return run_logs(args)
    from parsim.api import calibrate

    done = calibrate(args.model, dtype=args.dtype, ranks=args.ranks, repeats=args.repeats, quick=args.quick,
                     mbs=args.mbs, tp=args.tp, device=args.device, base=args.base, name=args.name, out=args.out,
                     progress=True)
    if args.json:
        emit_json(done.to_dict())
        return 0
    print(render(done.profile, done.path))
    return 0


def run_logs(args) -> int:
    """``--runs``: fit, report per group and leave-one-group-out, write the profiles."""
    from parsim.api import calibrate_runs

    log = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    done = calibrate_runs(args.runs, group=args.group, loso=not args.no_loso, out=args.out, log=log)
    if args.json:
        emit_json(done.to_dict())
        return 0
    print(done.text(table))
    print("wrote " + ", ".join(str(p) for p in done.paths))
    return 0


def render(profile: dict, path: Path) -> str:
    from parsim.api.hardware import UNSTEADY, apart, probe_drift
    from parsim.specs import CollectiveTables, profile_tables

    dev, prov, tables = profile["device"], profile["provenance"], profile_tables(profile)
    lines = [f"{profile['name']}: {prov['cpu']} x {prov['cores']} cores, torch {prov['torch']} {prov['backend']}, "
             f"{prov['duration_s']:.0f} s",
             "peak GEMM " + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in dev["peak_flops"].items())
             + f"; gemm curve max_eff {dev['gemm']['max_efficiency']:.2f} half_dim {dev['gemm']['half_dim']:.0f}",
             f"memory-bound {dev['memory_bandwidth'] / 1e9:.2f} GB/s; op overhead {dev['kernel_overhead_s'] * 1e6:.1f} us; "
             f"attention eff {dev['attention_efficiency']:.2f}",
             f"GEMM contention (ranks: slowdown; 1 up to the {tables.cores or 1} cores) "
             + ", ".join(f"{k}: {v:.2f}" for k, v in tables.contention.values)
             + ("; AdamW step " + ", ".join(f"{k}: {v:.2f}" for k, v in tables.contention_optimizer.values)
                if tables.contention_optimizer is not None else "")]
    if tables.p2p_send_cpu is not None and tables.p2p_recv_cpu is not None:
        per_byte = dict(tables.p2p_cpu_per_byte.values) if tables.p2p_cpu_per_byte is not None else {}
        pairs = zip(tables.p2p_send_cpu.values, tables.p2p_recv_cpu.values)
        per = ", ".join(f"{k}: {s * 1e3:.2f} / {r * 1e3:.2f} + {per_byte.get(k, 0.0) * 2**20 * 1e3:.2f} a MiB"
                        for (k, s), (_, r) in pairs)
        lines.append(f"pipeline message CPU (ranks: send / receive ms + both sides' copies; counted where ranks "
                     f"outnumber the {tables.cores} cores) {per}"
                     + ("; an action on a message from another rank starts late by " + ", ".join(
                         f"{k}: {v * 1e3:.2f} ms" for k, v in tables.p2p_hold.values) if tables.p2p_hold else "")
                     + ("; a send's call holds its rank " + ", ".join(
                         f"{k}: {v * 1e3:.2f} ms" for k, v in tables.p2p_send_hold.values) if tables.p2p_send_hold else ""))
    if tables.layer_composition is not None:
        probe, comp = tables.layer_probe, tables.layer_composition
        def terms(factor: float, per_op_s: float) -> str:
            return f"x{factor:.3f} the per-op sum" + (f" + {per_op_s * 1e6:.1f} us per op" if per_op_s else "")
        lines.append(f"real layer (mbs={probe.mbs}, tp=1): forward {probe.fwd_s * 1e3:.1f} ms "
                     f"({terms(comp.fwd, comp.per_op_fwd_s)}), backward {probe.bwd_s * 1e3:.1f} ms "
                     f"({terms(comp.bwd, comp.per_op_bwd_s)})"
                     + ("; slowdown with N ranks at once " + ", ".join(f"{k}: {v:.2f}" for k, v in
                                                                      tables.contention_layer.values)
                        if tables.contention_layer is not None else ""))
        if tables.split_overhead:
            a, b = (tables.split_overhead[k] for k in ("per_layer", "per_layer_squared"))
            lines.append(f"  its backward split as zero-bubble schedules run it (I, then W): W of a chunk of L layers "
                         f"costs ({a:.3f} L + {b:.4f} L^2) x a layer's backward more than its ops")
        if probe.blocks:
            sums = [(f + b) * 1e3 for f, b in probe.blocks]
            lines.append(f"  the layer's forward + backward in {len(sums)} blocks over the run: "
                         + " / ".join(f"{x:.1f}" for x in sums)
                         + f" ms (the machine's drift: {apart(sums):.0%}; the profile takes "
                         "the median of all samples)")
            if probe_drift(profile) > UNSTEADY:
                lines.append(f"  warning: over {UNSTEADY:.0%} between blocks: the machine was busy or unsteady during "
                             "this calibration, and its numbers with it; calibrate again on a quiet machine")
        rounds = tables.stage_probes.rounds if tables.stage_probes is not None else None
        if rounds and len(rounds) > 1:
            lines.append(f"  the {len(tables.stage_probes.stages)} synthetic stages' forward + backward in {len(rounds)} "
                         "rounds over the run: " + " / ".join(f"{x * 1e3:.1f}" for x in rounds)
                         + f" ms ({apart(rounds):.0%} apart; the composition terms take "
                         "the median of all samples)")
    levels = profile.get("provenance", {}).get("membound_passes")
    if levels:
        lines.append(f"  the memory-bound grid in {len(levels)} passes over the run, each point's time over its "
                     "median: " + " / ".join(f"{x:.2f}" for x in levels) + " (the profile takes the median)")
    lines += fit_report_lines(tables.fit_report or {})
    lines.append("")
    rows = [[op, str(n), f"{f.alpha * 1e3:.3f}", f"{f.alpha_insitu * 1e3:.3f}" if f.alpha_insitu is not None else "-",
             f"{1 / f.beta / 1e9:.3f}" if f.beta > 0 else "inf",
             f"{f.knee / 2**20:g} MiB, {1 / f.beta_beyond / 1e9:.3f}" if f.knee is not None else "-",
             f"{f.spread:.2f}", f"{f.fit_rms_rel:.2f}"]
            for op, n, f in CollectiveTables.from_dict(profile["network"].get("collectives")).entries()]
    if rows:
        lines.append(table(rows, ["collective", "ranks", "alpha ms", "in situ ms", "1/beta GB/s", "past knee GB/s",
                                  "spread", "fit rms"]))
    lines.append(f"wrote {path}")
    return "\n".join(lines)


def fit_report_lines(report: dict) -> list[str]:
    """The calibration's own leave-out errors (``device.extra.fit_report`` in the profile), one
    line per family of fits (gemm, attention, membound, composition, collective): every measured
    point predicted by a fit it was not part of, |predicted / measured - 1|."""
    if not report:
        return []
    families: dict[str, list] = {}
    for key, r in report.items():
        families.setdefault(key.split(".")[0], []).append((key, r))
    medians = sorted(r.median for r in report.values())
    mid = len(medians) // 2
    overall = medians[mid] if len(medians) % 2 else (medians[mid - 1] + medians[mid]) / 2
    lines = [f"fit report (leave-out: each measured point predicted by the fit of the others; written to the "
             f"profile's device.extra.fit_report): median of the {len(report)} fits' medians {overall:.1%}"]
    for family, fits in families.items():
        worst_key, worst = max(fits, key=lambda kr: kr[1].median)
        points = sum(r.points for _, r in fits)
        lines.append(f"  {family:12s} {len(fits):3d} fits {points:5d} points: median {min(r.median for _, r in fits):.1%}"
                     f"-{worst.median:.1%}, max {max(r.max for _, r in fits):.1%} (worst median: {worst_key})")
    return lines
