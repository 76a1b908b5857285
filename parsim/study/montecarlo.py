"""Monte-Carlo over seeded steps: the step-time distribution under variability and faults, and
which ranks and links are on the critical path.

Every step ``k`` draws a compute factor per device from ``Variability`` (generator seeded with
``(seed, k)``: the same numbers whatever runs the step) times the persistent ``Faults``.

``mode="representative"`` (the default; bounded cost at any scale): the rank layout is
``rank = (pp_rank * dp + dp_rank) * tp + tp_rank``. TP peers meet at every layer, so a TP group
computes at its slowest member's pace: stage ``p`` of DP replica ``d`` gets ``s[p, d] = max_t
m[p, d, t]``. Each replica's pipeline is screened with the classic pipeline estimate
``sum_p u_p s[p,d] + (M - 1) max_p u_p s[p,d]`` (``u_p``: stage p's compute per microbatch in
the clean step, M microbatches; Huang et al. 2019, GPipe Sec. 2.2, with unequal stages), and
the ``top`` slowest replicas, plus every replica holding a degraded NIC, are simulated in the
SimPy engine's representative mode with those stage factors (DP collectives costed for the
whole group, so they wait for that replica, as the slowest one's gradients are the last). The
step time is the slowest of them. ``mode="full"`` simulates every device each step (exact;
as slow as the full mode is). Under a stack that hides backward TP collectives behind the
weight-gradient GEMM (``costs.stack.tp_covered``: megatron-core, megatron-lm) a TP group is not
gated by its slowest member at every collective, and the representative step errs high (~2 %
with 8 % lognormal variability, tests/test_montecarlo.py).

The critical rank of a step is the slowest TP member of the bottleneck stage of the slowest
replica; the critical links are the communication the compute stream waited for in that
replica's simulation (exposed TP, DP and PP seconds, on NVLink or NIC as the layout places them).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from parsim.sim import simulate
from parsim.sim.network import group_link
from parsim.specs import ClusterSpec, ModelSpec, Plan, RankLayout, SpecError, load_cluster, load_model, parse_plan

from .faults import Faults, Variability
from .workers import default_workers, run_tasks

MODES = ("representative", "full")


@dataclass(frozen=True)
class Setup:
    """What every task needs (pickled to the workers)."""
    model: ModelSpec
    cluster: ClusterSpec
    plan: Plan
    variability: Variability
    faults: Faults
    seed: int
    mode: str
    top: int
    stage_seconds: tuple[float, ...]     # compute per microbatch of each pipeline rank, clean step


@dataclass(frozen=True)
class StepSample:
    step: int
    step_time_s: float
    critical_rank: int
    critical_replica: int
    critical_stage: int
    exposed_s: dict[str, float]          # "tp/nvlink" etc. -> seconds the compute stream waited
    simulated: int                       # SimPy runs this step took (cached repeats excluded)


def step_factors(setup: Setup, k: int) -> np.ndarray:
    """Compute-time factor of every rank in step ``k``."""
    world = setup.plan.world_size
    rng = np.random.default_rng([setup.seed, k])
    return setup.variability.draw(rng, world) * setup.faults.compute_factors(setup.cluster, world)


def replica_estimates(stage_factor: np.ndarray, stage_seconds: np.ndarray, microbatches: int) -> np.ndarray:
    """Pipeline time estimate of every DP replica (seconds) from stage factors ``(pp, dp)``."""
    per_mb = stage_factor * stage_seconds[:, None]
    return per_mb.sum(axis=0) + (microbatches - 1) * per_mb.max(axis=0)


def _links(setup: Setup) -> dict[str, str]:
    """The link each dimension's traffic uses (from replica 0, pipeline rank 0's groups)."""
    plan, cluster = setup.plan, setup.cluster
    lay = RankLayout(plan.dp, plan.tp, plan.pp)
    tp = group_link(cluster, [lay.rank(0, 0, t) for t in range(plan.tp)])
    dp = group_link(cluster, [lay.rank(0, d, 0) for d in range(plan.dp)])
    pp = group_link(cluster, [lay.rank(p, 0, 0) for p in range(plan.pp)])
    return {"tp": f"tp/{tp}", "dp": f"dp/{dp}", "pp": f"pp/{pp}"}


def _simulate(setup: Setup, slowdown: dict, links: dict, mode: str, cache: dict):
    key = (mode, tuple(sorted(slowdown.items())), tuple(sorted(links.items())))
    hit = cache.get(key)
    if hit is None:
        res = simulate(setup.model, setup.cluster, setup.plan, mode=mode, slowdown=slowdown, link_slowdown=links,
                       record_events=False)
        hit = cache[key] = (res.step_time_s, dict(res.exposed_comm_s))
    return hit


def _replica_run(setup: Setup, lay: RankLayout, d: int, s: np.ndarray, nics: dict[int, float], cache: dict):
    """Replica ``d`` in representative mode: its stage factors on the simulated ranks, its
    degraded NICs moved onto them (the DP groups keep every degraded member)."""
    slowdown = {lay.rank(p, 0, 0): float(s[p, d]) for p in range(setup.plan.pp) if s[p, d] != 1.0}
    links = dict(nics)
    for r, f in nics.items():
        p, dr, t = lay.coords(r)
        if dr == d:
            links[lay.rank(p, 0, t)] = max(f, links.get(lay.rank(p, 0, t), 1.0))
    return _simulate(setup, slowdown, links, "representative", cache)


def sample_step(setup: Setup, k: int, cache: dict) -> StepSample:
    """One Monte-Carlo step (module docstring)."""
    plan = setup.plan
    lay = RankLayout(plan.dp, plan.tp, plan.pp)
    m = step_factors(setup, k)
    grid = m.reshape(plan.pp, plan.dp, plan.tp)
    s = grid.max(axis=2)
    u = np.asarray(setup.stage_seconds)
    estimates = replica_estimates(s, u, plan.num_microbatches)
    nics = setup.faults.nic_factors(setup.cluster, plan.world_size)
    misses = len(cache)
    if setup.mode == "full":
        slowdown = {r: float(f) for r, f in enumerate(m) if f != 1.0}
        step, exposed = _simulate(setup, slowdown, nics, "full", cache)
        d = int(np.argmax(estimates))
    else:
        candidates = set(np.argsort(-estimates, kind="stable")[:setup.top].tolist())
        candidates |= {lay.coords(r)[1] for r in nics}
        runs = {d: _replica_run(setup, lay, d, s, nics, cache) for d in sorted(candidates)}
        d = max(runs, key=lambda x: (runs[x][0], -x))
        step, exposed = runs[d]
    p = int(np.argmax(s[:, d] * u))
    t = int(np.argmax(grid[p, d]))
    names = _links(setup)
    return StepSample(k, step, lay.rank(p, d, t), d, p, {names[x]: float(v) for x, v in exposed.items()},
                      len(cache) - misses)


def _run_chunk(task: tuple[Setup, list[int]]) -> list[StepSample]:
    setup, steps = task
    cache: dict = {}
    return [sample_step(setup, k, cache) for k in steps]


@dataclass
class MonteCarloResult:
    model: str
    cluster: str
    plan: str
    mode: str
    variability: str
    faults: dict
    seed: int
    clean_step_time_s: float               # no variability, no faults
    samples: list[StepSample] = field(repr=False)
    wall_s: float = 0.0

    @property
    def step_times(self) -> np.ndarray:
        return np.array([s.step_time_s for s in self.samples])

    def quantiles(self) -> dict[str, float]:
        t = self.step_times
        return {"mean": float(t.mean()), "p50": float(np.percentile(t, 50)), "p90": float(np.percentile(t, 90)),
                "p99": float(np.percentile(t, 99)), "min": float(t.min()), "max": float(t.max())}

    def critical_rank_share(self) -> dict[int, float]:
        """Fraction of steps each rank was the critical one (most frequent first)."""
        counts = Counter(s.critical_rank for s in self.samples)
        return {r: c / len(self.samples) for r, c in counts.most_common()}

    def critical_link_share(self) -> dict[str, float]:
        """Mean fraction of the step the compute stream waited on each dimension's link."""
        total: Counter = Counter()
        for s in self.samples:
            for name, sec in s.exposed_s.items():
                total[name] += sec / s.step_time_s
        return {name: v / len(self.samples) for name, v in total.most_common()}

    def to_dict(self, ranks: int = 16) -> dict:
        share = self.critical_rank_share()
        return {"model": self.model, "cluster": self.cluster, "plan": self.plan, "mode": self.mode,
                "variability": self.variability, "faults": self.faults, "seed": self.seed, "steps": len(self.samples),
                "clean_step_time_s": self.clean_step_time_s, "step_time_s": self.quantiles(),
                "critical_rank_share": {str(r): v for r, v in list(share.items())[:ranks]},
                "critical_link_share": self.critical_link_share(),
                "step_times_s": self.step_times.tolist(), "simpy_runs": sum(s.simulated for s in self.samples),
                "wall_s": self.wall_s}


# Steps a Monte-Carlo runs at most: each is a (representative) simulation of ~10-100 ms, so
# 100,000 steps are hours of one core; the bound keeps a typo from being days or a MemoryError.
MAX_STEPS = 100_000


def monte_carlo(model, cluster, plan, *, steps: int = 100, variability="none", faults: Faults | None = None,
                seed: int = 0, mode: str = "representative", top: int = 2, workers: int | None = None,
                address: str | None = None) -> MonteCarloResult:
    """``steps`` seeded steps of ``plan`` under ``variability`` and ``faults`` (module docstring),
    run on ``workers`` local processes [one per core] or the Dask scheduler at ``address``."""
    wall = time.perf_counter()
    model, cluster, plan = load_model(model), load_cluster(cluster), parse_plan(plan)
    variability, faults = Variability.parse(variability), faults or Faults()
    if mode not in MODES:
        raise SpecError("mode", mode, f"one of {', '.join(MODES)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise SpecError("steps", steps, f"a positive integer up to {MAX_STEPS:,} (each step is a simulation; "
                        "a p99 needs about 1,000)")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise SpecError("top", top, "a positive integer")
    faults.check(cluster, plan.world_size)
    clean = simulate(model, cluster, plan, record_events=False)
    lay = RankLayout(plan.dp, plan.tp, plan.pp)
    per_mb = tuple(clean.recorder.busy[lay.rank(p, 0, 0)] / plan.num_microbatches for p in range(plan.pp))
    setup = Setup(model, cluster, plan, variability, faults, seed, mode, top, per_mb)
    n = max(1, min(steps, (workers or default_workers()) * 2 if not address else steps))
    chunks = [(setup, list(range(i, steps, n))) for i in range(n)]
    samples = sorted((s for part in run_tasks(_run_chunk, chunks, workers, address) for s in part),
                     key=lambda s: s.step)
    return MonteCarloResult(model.name, f"{cluster.name}:{cluster.num_devices}", plan.to_string(), mode,
                            str(variability), {"slow_ranks": faults.slow_ranks, "slow_nodes": faults.slow_nodes,
                                               "degraded_nics": faults.degraded_nics},
                            seed, clean.step_time_s, samples, time.perf_counter() - wall)
