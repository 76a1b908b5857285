"""``parsim montecarlo``: the step-time distribution under variability and faults."""
from __future__ import annotations

import argparse

from .common import add_spec_arguments, emit_json, table

HELP = "Monte-Carlo over seeded steps with variability, slow ranks/nodes, degraded NICs: p50/p90/p99, critical path"


def add_variability_arguments(p: argparse.ArgumentParser, steps: int = 100) -> None:
    """Variability, faults and where the steps run (shared with ``plan-run`` and ``recommend``)."""
    p.add_argument("--variability", default="none", metavar="DIST:SIGMA",
                   help="per-step compute-time factor of every device: lognormal:SIGMA, normal:SIGMA or none [none]")
    p.add_argument("--slow-ranks", default=None, metavar="RANK=FACTOR,...",
                   help="persistent compute slowdown of these global ranks, e.g. 3=1.5")
    p.add_argument("--slow-nodes", default=None, metavar="NODE=FACTOR,...",
                   help="persistent compute slowdown of every device of these nodes, e.g. 12=1.2")
    p.add_argument("--degraded-nics", default=None, metavar="NODE=FACTOR,...",
                   help="every transfer over these nodes' NICs takes FACTOR x longer, e.g. 7=4")
    p.add_argument("--steps", type=int, default=steps, help=f"seeded steps of the Monte-Carlo [{steps}]")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws [0]")
    p.add_argument("--workers", type=int, default=None, help="local processes [one per core]")
    p.add_argument("--cluster-address", default=None, metavar="TCP://HOST:PORT",
                   help="run the steps on this Dask scheduler instead [$PARSIM_DASK_SCHEDULER]")


def variability_options(args: argparse.Namespace) -> dict:
    return {"variability": args.variability, "slow_ranks": args.slow_ranks, "slow_nodes": args.slow_nodes,
            "degraded_nics": args.degraded_nics, "steps": args.steps, "seed": args.seed, "workers": args.workers,
            "address": args.cluster_address}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_spec_arguments(p, model="gpt3-1.3b", cluster="a100-80g:16", plan="dp=2 tp=2 pp=4 gbs=32")
    add_variability_arguments(p)
    p.add_argument("--mode", choices=("representative", "full"), default="representative",
                   help="representative: simulate the slowest replicas [default]; full: every device each step")
    p.add_argument("--top", type=int, default=2, help="replicas refined in SimPy per step (representative) [2]")
    p.add_argument("--plot", default=None, metavar="PREFIX",
                   help="write PREFIX_steps.png (distribution) and PREFIX_critical.png (critical ranks, links)")


def run(args: argparse.Namespace) -> int:
    from parsim.api.run import monte_carlo
    from .common import load_specs
    model, cluster, plan, _ = load_specs(args)
    res = monte_carlo(model, cluster, plan, mode=args.mode, top=args.top, **variability_options(args))
    if args.plot:
        from parsim.plots.at_scale import plot_critical_share, plot_step_distribution
        plot_step_distribution(res.step_times, res.clean_step_time_s, f"{args.plot}_steps.png",
                               f"{res.model} on {res.cluster}: {len(res.samples)} steps, {res.variability}")
        plot_critical_share(res.critical_rank_share(), res.critical_link_share(), f"{args.plot}_critical.png")
    if args.json:
        emit_json(res.to_dict())
        return 0
    print(report(res))
    if args.plot:
        print(f"wrote {args.plot}_steps.png, {args.plot}_critical.png")
    return 0


def report(res) -> str:
    q = res.quantiles()
    clean = res.clean_step_time_s
    lines = [f"{res.model} on {res.cluster}  plan: {res.plan}",
             f"{len(res.samples)} seeded steps (seed {res.seed}), variability {res.variability}, "
             f"faults {', '.join(f'{k} {v}' for k, v in res.faults.items() if v) or 'none'}; mode {res.mode}; "
             f"{sum(s.simulated for s in res.samples)} SimPy runs in {res.wall_s:.1f} s", ""]
    rows = [[name, f"{q[name] * 1e3:,.1f}", f"{q[name] / clean - 1:+.1%}"] for name in ("mean", "p50", "p90", "p99",
                                                                                      "max")]
    lines.append(table([["clean", f"{clean * 1e3:,.1f}", ""], *rows], ["step", "ms", "vs clean"]))
    share = list(res.critical_rank_share().items())[:8]
    lines += ["", "critical ranks (share of steps): " + ", ".join(f"{r} {v:.0%}" for r, v in share),
              "critical links (share of the step waiting on them): "
              + ", ".join(f"{k} {v:.1%}" for k, v in res.critical_link_share().items())]
    return "\n".join(lines)
