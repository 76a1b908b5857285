"""What one simulation of a plan would play, priced with the cost model: the counts that
``parsim.specs.bounds`` weighs against its limit, plus the data-parallel gradient buckets,
which only the cost model can count (``comm.dp_buckets`` cuts each device's gradients into
``plan.dp_bucket_bytes`` pieces; the engine plays one reduction per bucket and device, so a
model with a 10**12-token vocabulary makes ~10**6 of them)."""
from __future__ import annotations

import math

from parsim.specs import ClusterSpec, ModelSpec, Plan
from parsim.specs.bounds import WorkEstimate, check_work, estimate_work

from .memory import plan_state_bytes
from .params import stage_params


def gradient_buckets(model: ModelSpec, plan: Plan, mode: str = "representative", replicas: int | None = None) -> int:
    """DP gradient buckets over the simulated devices in one step (0 without data parallelism);
    ``replicas``: devices simulated per pipeline rank (``bounds.estimate_work``)."""
    if plan.dp == 1:
        return 0
    per_param = plan_state_bytes(plan).grad
    per_pipeline = sum(math.ceil(p * per_param / plan.dp_bucket_bytes) for p in stage_params(model, plan))
    if replicas is None:
        replicas = plan.dp * plan.tp if mode == "full" else 1
    return per_pipeline * replicas


def simulation_work(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, mode: str = "representative",
                    detail: bool = False, replicas: int | None = None) -> WorkEstimate:
    return estimate_work(model, cluster, plan, mode=mode, detail=detail, replicas=replicas,
                         dp_buckets=gradient_buckets(model, plan, mode, replicas))


def check_simulation(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, mode: str = "representative",
                     detail: bool = False, limit: int | None = None, replicas: int | None = None) -> WorkEstimate:
    """``simulation_work``, or the SpecError of ``bounds.check_work`` above the limit."""
    return check_work(model, cluster, plan, mode=mode, detail=detail, limit=limit, replicas=replicas,
                      dp_buckets=gradient_buckets(model, plan, mode, replicas))
