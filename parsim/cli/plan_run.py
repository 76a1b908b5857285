"""``parsim plan-run``: time-to-train a token budget under failures, with checkpoints."""
from __future__ import annotations

import argparse

from .common import add_spec_arguments, emit_json, load_specs
from .montecarlo import add_variability_arguments, variability_options

HELP = "time-to-train N tokens: goodput under failures, best checkpoint interval (vs Young/Daly), GPU-h, $, energy"


def add_run_arguments(p: argparse.ArgumentParser, tokens_required: bool = True) -> None:
    """The run's inputs (shared with ``recommend --rank-by time-to-train``); defaults: ``parsim.api.run``."""
    from parsim.api.run import CHECKPOINT_BANDWIDTH, DEVICE_MTBF_H, NODE_MTBF_H, RESTART_S, USD_PER_GPU_HOUR
    p.add_argument("--tokens", type=float, required=tokens_required, default=None,
                   help="training tokens, e.g. 15e12")
    p.add_argument("--device-mtbf-h", type=float, default=DEVICE_MTBF_H,
                   help=f"mean hours between failures of one device [{DEVICE_MTBF_H:,.0f}: Llama 3, Table 5]")
    p.add_argument("--node-mtbf-h", type=float, default=NODE_MTBF_H,
                   help=f"mean hours between failures of one node, besides its devices [{NODE_MTBF_H:,.0f}]")
    p.add_argument("--ckpt-write-bw", type=float, default=CHECKPOINT_BANDWIDTH,
                   help=f"aggregate checkpoint write bytes/s [{CHECKPOINT_BANDWIDTH:.0e}]")
    p.add_argument("--ckpt-read-bw", type=float, default=CHECKPOINT_BANDWIDTH,
                   help=f"aggregate checkpoint read bytes/s [{CHECKPOINT_BANDWIDTH:.0e}]")
    p.add_argument("--restart-s", type=float, default=RESTART_S,
                   help=f"seconds to detect, re-schedule and re-initialise after a failure [{RESTART_S:.0f}]")
    p.add_argument("--usd-per-gpu-hour", type=float, default=USD_PER_GPU_HOUR, help=f"[{USD_PER_GPU_HOUR}]")
    p.add_argument("--power-w", type=float, default=None, help="device power under load, W [the profile's TDP]")


def reliability(args: argparse.Namespace):
    from parsim.api.run import Reliability
    return Reliability(args.device_mtbf_h, args.node_mtbf_h, args.ckpt_write_bw, args.ckpt_read_bw, args.restart_s,
                       args.usd_per_gpu_hour, args.power_w)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_spec_arguments(p, model="gpt3-175b", cluster="a100-80g:1024", plan="dp=8 tp=8 pp=16 gbs=1536")
    add_run_arguments(p)
    add_variability_arguments(p, steps=50)
    p.add_argument("--plot", default=None, metavar="PNG", help="write goodput vs checkpoint interval here")


def run(args: argparse.Namespace) -> int:
    from parsim.api.run import plan_run
    model, cluster, plan, _ = load_specs(args)
    res = plan_run(model, cluster, plan, tokens=args.tokens, reliability=reliability(args), **variability_options(args))
    if args.plot:
        plot(res, args.plot)
    if args.json:
        emit_json(res.to_dict())
        return 0
    print(report(res))
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


def plot(res, path: str) -> None:
    import numpy as np

    from parsim.costs.goodput import goodput
    from parsim.plots.at_scale import plot_goodput_curve
    e = res.estimate
    taus = np.geomspace(e.interval_s / 30, e.interval_s * 30, 200)
    plot_goodput_curve(taus, [goodput(t, e.checkpoint_write_s, e.restart_s, e.mtbf_s) for t in taus], e.interval_s,
                       e.young_s, e.daly_s, path, f"{res.model} on {res.cluster}: goodput vs checkpoint interval")


def report(res) -> str:
    e = res.estimate
    day = 86400.0
    rows = [
        ["step time", f"{e.step_time_s * 1e3:,.1f} ms ({res.step_source})"],
        ["steps", f"{e.steps:,.0f} for {e.tokens:.3g} tokens"],
        ["job MTBF", f"{e.mtbf_s / 3600:,.2f} h between interruptions"],
        ["checkpoint", f"{e.checkpoint_bytes / 1e12:,.2f} TB: write {e.checkpoint_write_s:,.1f} s, "
                       f"restart {e.restart_s:,.0f} s with read-back"],
        ["best interval", f"{e.interval_s / 60:,.1f} min (numeric) = every {e.interval_steps} steps; "
                          f"Young {e.young_s / 60:,.1f} min, Daly {e.daly_s / 60:,.1f} min"],
        ["goodput", f"{e.goodput:.1%} of wall time is kept training"],
        ["time to train", f"{e.wall_s / day:,.1f} days ({e.compute_s / day:,.1f} failure-free), "
                          f"{e.expected_failures:,.0f} interruptions expected"],
        ["GPU-hours", f"{e.gpu_hours:,.3g}"],
        ["cost", f"${e.cost_usd:,.4g}"],
        ["energy", f"{e.energy_j / 3.6e9:,.4g} MWh at {res.power_w:,.0f} W per device (TDP: an upper bound; "
                   "devices only)" if res.power_w else "unknown: the device profile has no power_w (use --power-w)"],
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join([f"{res.model} on {res.cluster}  plan: {res.plan}", "",
                      *(f"  {k:<{width}}  {v}" for k, v in rows), "", f"power: {res.power_source}"])
