"""``parsim sweep``: every valid plan for a model on a cluster, ranked by throughput among
those that fit; the best re-run through the SimPy engine."""
from __future__ import annotations

import argparse
import sys

from parsim.api import sweep
from parsim.specs import SpecError

from .common import add_json_argument, emit_json, gib, table

HELP = "enumerate valid plans for a model + cluster, rank them (fast path + SimPy re-simulation)"


def add_sweep_arguments(p: argparse.ArgumentParser, model: str = "gpt3-1.3b", cluster: str = "a100-80g:8") -> None:
    """Arguments shared by ``sweep`` and ``recommend``."""
    p.add_argument("--model", default=model, help=f"preset name, model YAML, or HF config.json [{model}]")
    p.add_argument("--cluster", default=cluster, help=f"PRESET:NDEVICES or cluster YAML [{cluster}]")
    p.add_argument("--profile", default=None, help="calibration profile YAML overriding the cluster's device/network numbers")
    p.add_argument("--gbs", type=int, default=None, help="global batch in sequences [one per device]")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length [the model's]")
    p.add_argument("--headroom", type=float, default=0.1,
                   help="fraction of device memory kept free: a plan fits if peak <= capacity*(1-headroom) [0.1]")
    p.add_argument("--fix", default=None, help="hold keys to values, e.g. \"tp=8 zero=1\" (lists: mbs=1,2)")
    p.add_argument("--space", default=None, help="YAML mapping plan keys to lists of values to sweep")
    p.add_argument("--workers", type=int, default=None, help="processes for the SimPy re-simulation [one per core]")
    p.add_argument("--cluster-address", default=None, metavar="TCP://HOST:PORT",
                   help="re-simulate on this Dask scheduler instead [$PARSIM_DASK_SCHEDULER]")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_json_argument(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_sweep_arguments(p)
    p.add_argument("--top", type=int, default=10, help="ranked plans to print / put in the JSON rows [10]")
    p.add_argument("--resimulate", type=int, default=10,
                   help="re-run this many of the best fitting plans through the SimPy engine, and every plan "
                        "the fast path prices only approximately that could reach them (at most 10x as "
                        "many in all) [10; 0 = none]")
    p.add_argument("--out", default=None, help="write every evaluated plan with its metrics (.csv or .parquet)")


def sweep_options(args: argparse.Namespace) -> dict:
    """The arguments ``parsim.api.sweep`` and ``parsim.api.recommend`` share, from the command line."""
    return {"profile": args.profile, "gbs": args.gbs, "seq_len": args.seq_len, "headroom": args.headroom,
            "fix": args.fix, "space": args.space, "workers": args.workers, "progress": not args.no_progress,
            "address": args.cluster_address}


def run(args: argparse.Namespace) -> int:
    # the sweep's module (pandas, numba) is imported when a sweep runs, not to build the parser
    from parsim.study.sweep import MAX_RESIM_FACTOR

    if args.top < 1:
        raise SpecError("top", args.top, "a positive integer")
    result = sweep(args.model, args.cluster, resimulate=args.resimulate, out=args.out, **sweep_options(args))
    if args.json:
        emit_json(result.to_dict(args.top))
        return 0
    print(f"{result.model.name} on {result.cluster.name}:{result.cluster.num_devices}: {result.num_plans} valid "
          f"plans, {result.num_fit} fit in {gib(result.result.capacity_bytes * (1 - args.headroom))} GiB "
          f"({result.result.num_resimulated} re-simulated)")
    rows = result.rows(args.top)
    print(format_rows(rows))
    if any(r.get("approximate") and r["source"] == "fast" for r in rows) \
            and result.result.num_resimulated >= MAX_RESIM_FACTOR * args.resimulate > 0:
        print(f"the re-simulation budget ({MAX_RESIM_FACTOR} x --resimulate = {result.result.num_resimulated} plans) "
              f"ran out before the top held only the engine's numbers: a larger --resimulate re-runs more")
    schedules = result.schedules()
    if schedules:
        print("\npipeline schedules against 1f1b (best variant of each at every layout of the sweep):")
        for s in schedules:
            print(f"  - {s['verdict']}")
    if args.out:
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def format_rows(rows: list[dict]) -> str:
    body = [[r["rank"], r["plan"], f"{r['step_time_s'] * 1e3:.1f}", f"{r['tokens_per_s']:.4g}", f"{r['mfu']:.3f}",
             f"{r['bubble_fraction']:.3f}", f"{r['exposed_tp_s'] * 1e3:.1f}", f"{r['exposed_dp_s'] * 1e3:.1f}",
             f"{r['exposed_pp_s'] * 1e3:.1f}", gib(r["peak_memory_bytes"]), "yes" if r["fits"] else "NO",
             r["source"] + ("~" if r.get("approximate") and r["source"] == "fast" else "")]
            for r in rows]
    text = table(body, ["#", "plan", "step ms", "tokens/s", "MFU", "bubble", "TP ms", "DP ms", "PP ms",
                        "peak GiB", "fits", "by"])
    if any(r.get("approximate") and r["source"] == "fast" for r in rows):
        text += ("\nfast~: the fast path's numbers are approximate here (offload, link contention "
                 "or ranks sharing a CPU host: parsim.fast.honesty) and the plan was not re-simulated")
    return text
