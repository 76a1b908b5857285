"""Specs: what is trained (ModelSpec), on what (ClusterSpec), and how (Plan)."""
from .cluster import DTYPES, ClusterSpec, DeviceProfile, GemmEfficiency, LinkProfile, NetworkProfile
from .errors import SpecError, SpecWarning
from .layout import RankLayout, stage_layers
from .model import MODEL_PRESETS, ModelSpec
from .parse import (cluster_from_dict, known_profiles, load_cluster, load_model, load_profile_dict,
                    model_from_dict, model_from_hf_config, parse_plan, plan_from_dict, profiles_dir)
from .plan import ALL_SCHEDULES, DEFAULT_DP_BUCKET_BYTES, OFFLOADS, RECOMPUTES, SCHEDULES, UNTIMED_SCHEDULES, Plan
from .validate import plan_mask, validate

__all__ = [
    "ClusterSpec", "DeviceProfile", "GemmEfficiency", "LinkProfile", "NetworkProfile", "DTYPES",
    "SpecError", "SpecWarning", "RankLayout", "MODEL_PRESETS", "ModelSpec", "Plan",
    "SCHEDULES", "UNTIMED_SCHEDULES", "ALL_SCHEDULES", "OFFLOADS", "RECOMPUTES", "DEFAULT_DP_BUCKET_BYTES",
    "cluster_from_dict", "known_profiles", "load_cluster", "load_model", "load_profile_dict",
    "model_from_dict", "model_from_hf_config", "parse_plan", "plan_from_dict", "profiles_dir",
    "plan_mask", "stage_layers", "validate",
]
