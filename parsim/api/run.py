"""Planning a training run at scale: the step under variability and faults (Monte-Carlo), and
the whole run under failures (goodput, time-to-train, GPU-hours, dollars, energy).

Default failure inputs come from Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models",
Sec. 3.3.4 and Table 5): 419 unexpected interruptions in 54 days of pre-training on 16,384 H100
(2,048 nodes), i.e. one every 3.09 h, about 58.7 % of them GPU-related (faulty GPU, HBM3, SRAM,
GPU system processor, thermal, silent data corruption) and the rest host, network, software and
storage. Charging the GPU share to devices and the rest to nodes:
    device MTBF = 16,384 x 3.09 h / 0.587 = 86,000 h;  node MTBF = 2,048 x 3.09 h / 0.413 = 15,300 h.
Checkpoint store: Llama 3's Tectonic sustains 2 TB/s (Sec. 3.3.1); restart 10 minutes (an
assumption: detect, re-schedule, re-initialise; set yours). $/GPU-hour is an input.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from parsim.specs import SpecError

from .inputs import ClusterLike, ModelLike, PlanLike, load_specs

HOUR = 3600.0
DEVICE_MTBF_H = 86_000.0
NODE_MTBF_H = 15_300.0
CHECKPOINT_BANDWIDTH = 2e12        # bytes/s, aggregate write and read
RESTART_S = 600.0
USD_PER_GPU_HOUR = 2.0
# Below this share of wall time kept, the run does not make progress worth estimating (its wall
# time would be 1,000x its compute or more): an error naming the inputs, not an infinite answer.
MIN_GOODPUT = 1e-3


def monte_carlo(model: ModelLike, cluster: ClusterLike, plan: PlanLike, *, profile: str | Path | None = None,
                steps: int = 100, variability: str = "none", slow_ranks: str | dict | None = None,
                slow_nodes: str | dict | None = None, degraded_nics: str | dict | None = None, seed: int = 0,
                mode: str = "representative", top: int = 2, workers: int | None = None,
                address: str | None = None):
    """``steps`` seeded training steps under per-step compute ``variability`` (``lognormal:SIGMA``,
    ``normal:SIGMA``) and persistent faults ({rank or node: factor} or ``"3=1.5,5=1.2"``):
    the step-time distribution and the critical ranks and links (``parsim.study.montecarlo``).
    Runs on ``workers`` local processes [one per core], or the Dask scheduler at ``address``."""
    from parsim.study.faults import Faults
    from parsim.study.montecarlo import monte_carlo as run
    model, cluster, plan, _ = load_specs(model, cluster, plan, profile)
    faults = Faults.parse(slow_ranks, slow_nodes, degraded_nics)
    return run(model, cluster, plan, steps=steps, variability=variability, faults=faults, seed=seed, mode=mode,
               top=top, workers=workers, address=address)


@dataclass(frozen=True)
class Reliability:
    """Failure and checkpoint inputs, in hours, bytes/s, seconds (module docstring's defaults)."""
    device_mtbf_h: float = DEVICE_MTBF_H
    node_mtbf_h: float = NODE_MTBF_H
    write_bandwidth: float = CHECKPOINT_BANDWIDTH
    read_bandwidth: float = CHECKPOINT_BANDWIDTH
    restart_s: float = RESTART_S
    usd_per_gpu_hour: float = USD_PER_GPU_HOUR
    power_w: float | None = None          # None: the device profile's power_w

    def __post_init__(self) -> None:
        for name in ("device_mtbf_h", "node_mtbf_h", "write_bandwidth", "read_bandwidth"):
            if not getattr(self, name) > 0:
                raise SpecError(name, getattr(self, name), "a positive number")
        for name in ("restart_s", "usd_per_gpu_hour"):
            if not getattr(self, name) >= 0:
                raise SpecError(name, getattr(self, name), "a non-negative number")
        if self.power_w is not None and not self.power_w >= 0:
            raise SpecError("power_w", self.power_w, "a non-negative number of watts")


@dataclass(frozen=True)
class RunPlan:
    """A training run of a plan: the step it assumes and the run estimate (``costs.goodput``)."""
    model: str
    cluster: str
    plan: str
    step_source: str                     # "simulate" or "monte-carlo mean of N steps"
    power_w: float
    power_source: str
    estimate: Any                        # parsim.costs.goodput.RunEstimate

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "cluster": self.cluster, "plan": self.plan, "step_source": self.step_source,
                "power_w": self.power_w, "power_source": self.power_source, **self.estimate.to_dict()}


def run_estimate(model, cluster, plan, tokens: float, step_time_s: float, reliability: Reliability,
                 step_source: str) -> RunPlan:
    """The run estimate for specs already loaded and a step time already known."""
    from parsim.costs import plan_state_bytes, total_params
    from parsim.costs.goodput import Reliability as Inputs
    from parsim.costs.goodput import checkpoint_bytes, estimate_run
    from parsim.costs.stack import apply_stack_to_run
    if not tokens > 0:
        raise SpecError("tokens", tokens, "a positive number of training tokens, e.g. 15e12")
    r = reliability
    power = cluster.device.power_w if r.power_w is None else r.power_w
    source = cluster.device.power_source if r.power_w is None else "given"
    # the state bytes of the stack that runs the plan (an ``auto`` plan on a GPU profile is its
    # default stack's, 16-bit parameters + fp32 Adam: 14 bytes a parameter, not torch autocast's 12)
    sb = plan_state_bytes(apply_stack_to_run(cluster, plan)[2])
    ckpt = checkpoint_bytes(total_params(model), sb.param, sb.optimizer)
    inputs = Inputs(r.device_mtbf_h * HOUR, r.node_mtbf_h * HOUR, r.write_bandwidth, r.read_bandwidth, r.restart_s)
    est = estimate_run(tokens, plan.gbs * model.seq_len, step_time_s, cluster.num_devices, cluster.num_nodes, ckpt,
                       inputs, r.usd_per_gpu_hour, power)
    if not est.goodput >= MIN_GOODPUT:
        raise SpecError("reliability", f"device_mtbf_h={r.device_mtbf_h:g} node_mtbf_h={r.node_mtbf_h:g} "
                        f"write_bandwidth={r.write_bandwidth:g} read_bandwidth={r.read_bandwidth:g} "
                        f"restart_s={r.restart_s:g}", (
                            f"inputs under which the run makes progress: an interruption every {est.mtbf_s:.3g} s "
                            f"against a {est.restart_s:.3g} s restart and {est.checkpoint_write_s:.3g} s checkpoints "
                            f"keeps {est.goodput:.2g} of the wall time (below {MIN_GOODPUT:g}); raise the MTBFs or "
                            "the checkpoint bandwidths, or shorten the restart"))
    return RunPlan(model.name, f"{cluster.name}:{cluster.num_devices}", plan.to_string(), step_source, power,
                   source or "unknown (profile has no power_w)", est)


def plan_run(model: ModelLike, cluster: ClusterLike, plan: PlanLike, *, tokens: float,
             profile: str | Path | None = None, reliability: Reliability | None = None, variability: str = "none",
             slow_ranks=None, slow_nodes=None, degraded_nics=None, steps: int = 100, seed: int = 0,
             workers: int | None = None, address: str | None = None) -> RunPlan:
    """Time-to-train ``tokens`` tokens with ``plan``: the clean simulated step, or, with
    variability or faults, the mean of a ``steps``-step Monte-Carlo; then goodput under
    failures with the best checkpoint interval, GPU-hours, dollars and energy (``parsim plan-run``)."""
    from parsim.sim import simulate
    reliability = reliability or Reliability()
    model, cluster, plan, _ = load_specs(model, cluster, plan, profile)
    if variability not in (None, "none") or slow_ranks or slow_nodes or degraded_nics:
        mc = monte_carlo(model, cluster, plan, steps=steps, variability=variability, slow_ranks=slow_ranks,
                         slow_nodes=slow_nodes, degraded_nics=degraded_nics, seed=seed, workers=workers,
                         address=address)
        step, source = mc.quantiles()["mean"], f"monte-carlo mean of {steps} steps"
    else:
        step, source = simulate(model, cluster, plan, record_events=False).step_time_s, "simulate"
    return run_estimate(model, cluster, plan, tokens, step, reliability, source)


def rank_by_time_to_train(recommendation, model: ModelLike, cluster: ClusterLike, *, tokens: float,
                          top: int, profile: str | Path | None = None, reliability: Reliability | None = None,
                          **variability):
    """Re-rank a ``recommend`` result's plans by expected time-to-train ``tokens`` (each plan's
    step: its re-simulated one, or a Monte-Carlo mean with ``variability``), keep ``top``."""
    reliability = reliability or Reliability()
    scored = []
    for advice in recommendation.plans:
        if variability.get("variability", "none") != "none" or any(
                variability.get(k) for k in ("slow_ranks", "slow_nodes", "degraded_nics")):
            run = plan_run(model, cluster, advice.plan, tokens=tokens, profile=profile, reliability=reliability,
                           **variability)
        else:
            m, c, p, _ = load_specs(model, cluster, advice.plan, profile)
            run = run_estimate(m, c, p, tokens, advice.metrics["step_time_s"], reliability, "sweep")
        e = run.estimate
        reason = (f"time to train {tokens:.3g} tokens: {e.wall_s / 86400:.1f} days at {e.goodput:.1%} goodput "
                  f"({e.step_time_s * 1e3:,.0f} ms steps, checkpoint every {e.interval_steps} steps)")
        scored.append((e.wall_s, replace(advice, reasons=[*advice.reasons, reason],
                                         metrics={**advice.metrics, "time_to_train_s": e.wall_s,
                                                  "goodput": e.goodput})))
    scored.sort(key=lambda x: x[0])
    plans = [replace(a, rank=i + 1) for i, (_, a) in enumerate(scored[:top])]
    return replace(recommendation, plans=plans)
