"""What every API function shares: the input types and how they are parsed and validated."""
from __future__ import annotations

from pathlib import Path

from parsim.specs import ClusterSpec, ModelSpec, Plan, load_cluster, load_model, parse_plan
from parsim.specs import validate as validate_plan

ModelLike = str | Path | ModelSpec        # preset name, model YAML or HF config.json, or a spec
ClusterLike = str | Path | ClusterSpec    # "PRESET:NDEVICES", cluster YAML, or a spec
PlanLike = str | Path | dict | Plan       # "k=v ..." string, plan YAML, dict, or a Plan


def load_specs(model: ModelLike, cluster: ClusterLike, plan: PlanLike,
               profile: str | Path | None = None) -> tuple[ModelSpec, ClusterSpec, Plan, list[str]]:
    """Parse model, cluster (with ``profile``) and plan and validate them together: the specs
    and the warnings (a plan that runs but is unusual). Raises SpecError on bad input."""
    model = load_model(model)
    cluster = load_cluster(cluster, profile=profile)
    plan = parse_plan(plan)
    return model, cluster, plan, validate_plan(model, cluster, plan)

