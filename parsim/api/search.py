"""Many plans: ``sweep`` (every valid plan, ranked), ``recommend`` (the best and why) and
``partition`` (stage cuts of one model)."""
from __future__ import annotations

import importlib.util

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parsim.specs import ClusterSpec, ModelSpec, SpecError, load_cluster, load_model
from parsim.specs.errors import checked_int
from parsim.specs.plan import MAX_INT

from .inputs import ClusterLike, ModelLike, PlanLike

if TYPE_CHECKING:
    import pandas as pd

    from parsim.partition import PartitionResult
    from parsim.study.recommend import Recommendation
    from parsim.study.sweep import SweepResult


@dataclass
class Sweep:
    """Every valid plan of a sweep (``parsim sweep``), ranked best first: fitting plans by
    throughput; ``frame`` has one row per plan (times in seconds, memory in bytes)."""
    model: ModelSpec
    cluster: ClusterSpec
    result: "SweepResult"

    @property
    def frame(self) -> "pd.DataFrame":
        return self.result.frame

    @property
    def num_plans(self) -> int:
        return self.result.num_plans

    @property
    def num_fit(self) -> int:
        return self.result.num_fit

    def rows(self, top: int | None = None) -> list[dict[str, Any]]:
        """The ``top`` best plans (all without ``top``) as JSON-ready dicts."""
        return self.result.rows(top)

    def to_pandas(self) -> "pd.DataFrame":
        return self.result.frame

    def write(self, path: str | Path) -> None:
        """The whole table as CSV, or Parquet when the name ends in .parquet."""
        self.result.write(str(path))

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        """The JSON object of ``parsim sweep --json --top TOP``."""
        r = self.result
        return {"model": self.model.name, "cluster": self.cluster.name, "num_devices": self.cluster.num_devices,
                "gbs": int(r.frame["gbs"].iloc[0]), "seq_len": self.model.seq_len, "headroom": r.headroom,
                "capacity_bytes": r.capacity_bytes, "num_plans": r.num_plans, "num_fit": r.num_fit,
                "num_resimulated": r.num_resimulated, "timings_s": r.timings_s, "rows": r.rows(top),
                "schedules": self.schedules()}

    def schedules(self) -> list[dict[str, Any]]:
        """Each pipeline schedule against 1F1B at the same layouts: where it is faster, by how
        much and at how many microbatches per stage; where slower (recompute=full) or too big
        (``parsim.study.schedule_advice.schedule_summary``; memory in bytes)."""
        from parsim.study.schedule_advice import schedule_summary
        return schedule_summary(self.result.frame)


def _run_sweep(model: ModelLike, cluster: ClusterLike, *, profile: str | Path | None, gbs: int | None,
               seq_len: int | None, headroom: float, fix: str | None, space: str | Path | None,
               workers: int | None, resimulate: int, progress: bool, address: str | None = None) -> Sweep:
    """Check the inputs (in the order the CLI always has), enumerate, price, re-simulate, rank."""
    from dataclasses import replace

    from parsim.study.enumerate import default_gbs
    from parsim.study.space import build_space
    from parsim.study.sweep import run_sweep

    model = load_model(model)
    if seq_len is not None:
        seq_len = checked_int("seq-len", seq_len, 1, "a positive integer (tokens per sequence), at most 2**53", MAX_INT)
        model = replace(model, seq_len=seq_len)
    cluster = load_cluster(cluster, profile=profile)
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0.0 <= headroom < 1.0:
        raise SpecError("headroom", headroom, "a fraction in [0, 1)")
    if workers is not None:
        workers = checked_int("workers", workers, 1, "a positive integer")
    if gbs is not None:
        gbs = checked_int("gbs", gbs, 1, "a positive integer (global batch in sequences), at most 2**53", MAX_INT)
    plans = build_space(space_file=space, fix=fix, gbs=gbs)
    if plans.gbs is None:
        plans = plans.narrowed({"gbs": (default_gbs(cluster),)})
    check_sweep_size(model, cluster, plans)
    result = run_sweep(model, cluster, plans, headroom=headroom, resimulate_top=resimulate, workers=workers,
                       progress=progress, address=address)
    if result.num_plans == 0:
        raise SpecError("space", fix or space or "defaults",
                        f"constraints that leave at least one valid plan for {model.name} on "
                        f"{cluster.num_devices} devices (dp*tp*pp must equal the device count, "
                        f"gbs divisible by dp*mbs, tp dividing heads={model.heads})")
    return Sweep(model, cluster, result)


# A sweep holds every candidate plan as int64 columns while it filters them (~200 bytes each
# with numpy's intermediates): 5,000,000 candidates is ~1 GiB. Override: $PARSIM_MAX_SWEEP_PLANS.
DEFAULT_MAX_SWEEP_PLANS = 5_000_000
MAX_SWEEP_PLANS_ENV = "PARSIM_MAX_SWEEP_PLANS"
# A sweep factorises the device count, and the fast path lays out each plan's data-parallel group
# rank by rank (``fast.comm.dp_group_ranks``, priced by the nodes it spans): 1,010,101,010 devices
# of a tiny model ran out of memory building one such group (fuzz seed 73); 2**20 devices, ten
# times the largest GPU clusters built, sweep the tiny model in 6 s.
MAX_SWEEP_DEVICES = 2**20
# The fast path walks some plans layer by layer (ZeRO-2 reduce-scatters, parsim.fast.timing): candidate
# plans x layers at most 2e9 (~seconds in its compiled kernel).
MAX_SWEEP_LAYER_STEPS = 2_000_000_000


def check_sweep_size(model: ModelSpec, cluster: ClusterSpec, plans) -> int:
    """The number of candidate plans, or a SpecError before they are built when there are too many."""
    import os

    from parsim.study.enumerate import count_candidates
    if cluster.num_devices > MAX_SWEEP_DEVICES:
        raise SpecError("cluster", f"{cluster.name}:{cluster.num_devices}",
                        f"at most 2**20 = {MAX_SWEEP_DEVICES:,} devices for a sweep (it lays out each plan's "
                        "data-parallel groups rank by rank); "
                        "simulate one plan with `parsim simulate` instead")
    raw = os.environ.get(MAX_SWEEP_PLANS_ENV, "").strip() or DEFAULT_MAX_SWEEP_PLANS
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if limit < 1:
        raise SpecError(MAX_SWEEP_PLANS_ENV, raw, "a positive integer (candidate plans a sweep may build)")
    n = count_candidates(model, cluster, plans)
    if n * model.layers > MAX_SWEEP_LAYER_STEPS:
        raise SpecError("model.layers", model.layers, (
            f"a sweep walks some plans layer by layer: {n:,} candidate plans x {model.layers:,} layers is above "
            f"{MAX_SWEEP_LAYER_STEPS:,}; narrow the sweep with --fix, or simulate one plan with `parsim simulate`"))
    if n > limit:
        raise SpecError("space", f"{cluster.num_devices} devices", (
            f"a sweep of at most {limit:,} candidate plans (this one would build {n:,}, ~{n * 200 / 2**30:.3g} GiB): "
            f"narrow it with --fix (e.g. \"tp=8 mbs=1\") or --space, or raise the limit with {MAX_SWEEP_PLANS_ENV}=N"))
    return n


def sweep(model: ModelLike, cluster: ClusterLike, *, profile: str | Path | None = None, gbs: int | None = None,
          seq_len: int | None = None, headroom: float = 0.1, fix: str | None = None,
          space: str | Path | None = None, resimulate: int = 10, workers: int | None = None,
          out: str | Path | None = None, progress: bool = False, address: str | None = None) -> Sweep:
    """Every valid plan for ``model`` on ``cluster`` through the fast path, the ``resimulate``
    best fitting ones re-run in SimPy, ranked (``parsim sweep``).

    ``gbs``: global batch in sequences [one per device]; ``seq_len``: tokens per sequence [the
    model's]; ``headroom``: fraction of device memory kept free (a plan fits if its peak <=
    capacity * (1 - headroom)); ``fix``: "k=v ..." holding plan keys (lists: mbs=1,2);
    ``space``: YAML mapping plan keys to lists; ``workers``: processes for the re-simulation
    [one per core]; ``address``: a Dask scheduler to re-simulate on instead (``study.workers``);
    ``out``: also write every plan to this .csv or .parquet; ``progress``: bars on stderr."""
    resimulate = checked_int("resimulate", resimulate, 0, "a non-negative integer")
    if out and not str(out).endswith((".csv", ".parquet")):
        raise SpecError("out", out, "a path ending in .csv or .parquet")
    if out:
        from parsim.specs.files import check_output_path
        check_output_path(out, "out")            # before the sweep, not after it
    found = _run_sweep(model, cluster, profile=profile, gbs=gbs, seq_len=seq_len, headroom=headroom, fix=fix,
                       space=space, workers=workers, resimulate=resimulate, progress=progress, address=address)
    if out:
        found.write(out)
    return found


def recommend(model: ModelLike, cluster: ClusterLike, *, top: int = 3, resimulate: int | None = None,
              profile: str | Path | None = None, gbs: int | None = None, seq_len: int | None = None,
              headroom: float = 0.1, fix: str | None = None, space: str | Path | None = None,
              workers: int | None = None, progress: bool = False, address: str | None = None) -> "Recommendation":
    """The ``top`` best plans and why: memory fit, bubble, exposed communication and the rule
    of thumb for the cluster (``parsim recommend``). Runs a sweep (arguments as ``sweep``) with
    the ``resimulate`` [``top``] best plans re-run in SimPy; ``.to_dict()`` is the command's JSON."""
    from parsim.study.recommend import recommend as advise
    top = checked_int("top", top, 1, "a positive integer")
    resimulate = top if resimulate is None else checked_int("resimulate", resimulate, 0, "a non-negative integer")
    found = _run_sweep(model, cluster, profile=profile, gbs=gbs, seq_len=seq_len, headroom=headroom, fix=fix,
                       space=space, workers=workers, resimulate=resimulate, progress=progress, address=address)
    return advise(found.model, found.cluster, found.result, top=top)


def partition(model: ModelLike | Callable, plan: PlanLike, cluster: ClusterLike, *,
              profile: str | Path | None = None, memory_limit: float | None = None,
              graph: str = "auto", reference_model: Callable | None | str = "executor") -> "PartitionResult":
    """Cut ``model`` (also ``pkg.module:factory`` or a factory returning (module, example inputs))
    into ``pp * vpp`` stages that balance time under ``memory_limit`` bytes per device [the
    device capacity] (Merak's partitioner, ``parsim partition``). ``graph``: auto, traced or
    analytic; ``reference_model(spec, batch_size)`` builds the torch module a ModelSpec is traced
    as [the executor's decoder when torch is installed]. ``.partition`` is the plan's ``partition=`` value; times in seconds per microbatch."""
    from parsim.partition import partition as cut
    from parsim.partition import resolve_source
    from parsim.specs import parse_plan
    spec = resolve_source(model).spec
    if spec is not None:
        check_partition_size(spec, parse_plan(plan))
    if reference_model == "executor":
        reference_model = executor_reference_model()
    return cut(model, plan, load_cluster(cluster, profile=profile), memory_limit=memory_limit, graph=graph,
               reference_model=reference_model)


# The partitioner's tables grow with cut points^2 x stages: measured here, 500 layers x 16 stages
# took 35 s and 1.3 GB, 2,000 layers x 4 stages 37 s and 2.1 GB.
MAX_PARTITION_WORK = 4_000_000


def check_partition_size(model: ModelSpec, plan) -> None:
    """Refuse, before any graph is built, a model whose partitioning would take minutes and GBs."""
    work = model.layers ** 2 * plan.pp * plan.vpp
    if work > MAX_PARTITION_WORK:
        raise SpecError("model.layers", model.layers, (
            f"a model the partitioner can cut: layers^2 x stages is {work:,} here, at most {MAX_PARTITION_WORK:,} "
            f"(~30 s and ~1 GiB); for {plan.pp * plan.vpp} stages, at most "
            f"{int((MAX_PARTITION_WORK / (plan.pp * plan.vpp)) ** 0.5):,} layers; use partition=balanced "
            "or cut a smaller model"))


def executor_reference_model() -> Callable | None:
    """The executor's decoder, which a ModelSpec is traced as (None without torch: analytic)."""
    if importlib.util.find_spec("torch") is None:
        return None
    from parsim.executor.model import reference_model
    return reference_model

