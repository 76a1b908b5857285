"""Many plans: ``sweep`` (every valid plan, ranked), ``recommend`` (the best and why) and
``partition`` (stage cuts of one model)."""
from __future__ import annotations

import importlib.util

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parsim.specs import ClusterSpec, ModelSpec, SpecError, load_cluster, load_model

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
               seq_len: int | None, headroom: float, fix: str | None, space: str | Path | None, workers: int,
               resimulate: int, progress: bool) -> Sweep:
    """Check the inputs (in the order the CLI always has), enumerate, price, re-simulate, rank."""
    from dataclasses import replace

    from parsim.study.enumerate import default_gbs
    from parsim.study.space import build_space
    from parsim.study.sweep import run_sweep

    model = load_model(model)
    if seq_len is not None:
        if seq_len < 1:
            raise SpecError("seq-len", seq_len, "a positive integer (tokens per sequence)")
        model = replace(model, seq_len=seq_len)
    cluster = load_cluster(cluster, profile=profile)
    if not 0.0 <= headroom < 1.0:
        raise SpecError("headroom", headroom, "a fraction in [0, 1)")
    if workers < 1:
        raise SpecError("workers", workers, "a positive integer")
    if gbs is not None and gbs < 1:
        raise SpecError("gbs", gbs, "a positive integer (global batch in sequences)")
    plans = build_space(space_file=space, fix=fix, gbs=gbs)
    if plans.gbs is None:
        plans = plans.narrowed({"gbs": (default_gbs(cluster),)})
    result = run_sweep(model, cluster, plans, headroom=headroom, resimulate_top=resimulate, workers=workers,
                       progress=progress)
    if result.num_plans == 0:
        raise SpecError("space", fix or space or "defaults",
                        f"constraints that leave at least one valid plan for {model.name} on "
                        f"{cluster.num_devices} devices (dp*tp*pp must equal the device count, "
                        f"gbs divisible by dp*mbs, tp dividing heads={model.heads})")
    return Sweep(model, cluster, result)


def sweep(model: ModelLike, cluster: ClusterLike, *, profile: str | Path | None = None, gbs: int | None = None,
          seq_len: int | None = None, headroom: float = 0.1, fix: str | None = None,
          space: str | Path | None = None, resimulate: int = 10, workers: int = 1, out: str | Path | None = None,
          progress: bool = False) -> Sweep:
    """Every valid plan for ``model`` on ``cluster`` through the fast path, the ``resimulate``
    best fitting ones re-run in SimPy, ranked (``parsim sweep``).

    ``gbs``: global batch in sequences [one per device]; ``seq_len``: tokens per sequence [the
    model's]; ``headroom``: fraction of device memory kept free (a plan fits if its peak <=
    capacity * (1 - headroom)); ``fix``: "k=v ..." holding plan keys (lists: mbs=1,2);
    ``space``: YAML mapping plan keys to lists; ``workers``: processes for the re-simulation;
    ``out``: also write every plan to this .csv or .parquet; ``progress``: bars on stderr."""
    if resimulate < 0:
        raise SpecError("resimulate", resimulate, "a non-negative integer")
    if out and not str(out).endswith((".csv", ".parquet")):
        raise SpecError("out", out, "a path ending in .csv or .parquet")
    found = _run_sweep(model, cluster, profile=profile, gbs=gbs, seq_len=seq_len, headroom=headroom, fix=fix,
                       space=space, workers=workers, resimulate=resimulate, progress=progress)
    if out:
        found.write(out)
    return found


def recommend(model: ModelLike, cluster: ClusterLike, *, top: int = 3, resimulate: int | None = None,
              profile: str | Path | None = None, gbs: int | None = None, seq_len: int | None = None,
              headroom: float = 0.1, fix: str | None = None, space: str | Path | None = None, workers: int = 1,
              progress: bool = False) -> "Recommendation":
    """The ``top`` best plans and why: memory fit, bubble, exposed communication and the rule
    of thumb for the cluster (``parsim recommend``). Runs a sweep (arguments as ``sweep``) with
    the ``resimulate`` [``top``] best plans re-run in SimPy; ``.to_dict()`` is the command's JSON."""
    from parsim.study.recommend import recommend as advise
    if top < 1:
        raise SpecError("top", top, "a positive integer")
    resimulate = top if resimulate is None else resimulate
    if resimulate < 0:
        raise SpecError("resimulate", resimulate, "a non-negative integer")
    found = _run_sweep(model, cluster, profile=profile, gbs=gbs, seq_len=seq_len, headroom=headroom, fix=fix,
                       space=space, workers=workers, resimulate=resimulate, progress=progress)
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
    if reference_model == "executor":
        reference_model = executor_reference_model()
    return cut(model, plan, load_cluster(cluster, profile=profile), memory_limit=memory_limit, graph=graph,
               reference_model=reference_model)


def executor_reference_model() -> Callable | None:
    """The executor's decoder, which a ModelSpec is traced as (None without torch: analytic)."""
    if importlib.util.find_spec("torch") is None:
        return None
    from parsim.executor.model import reference_model
    return reference_model

