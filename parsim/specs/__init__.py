"""Specs: what is trained (ModelSpec), on what (ClusterSpec), and how (Plan)."""
from .cluster import DTYPES, ClusterSpec, DeviceProfile, GemmEfficiency, LinkProfile, NetworkProfile
from .collectives import CollectiveFit, CollectiveTables
from .errors import SpecError, SpecWarning
from .layout import RankLayout, stage_layers
from .model import MODEL_PRESETS, ModelSpec
from .parse import (cluster_from_dict, device_from_dict, known_profiles, load_cluster, load_model, load_profile_dict,
                    model_from_dict, model_from_hf_config, parse_plan, plan_from_dict, profile_tables, profiles_dir,
                    with_profile_tables)
from .stack import STACKS, Stack, get_stack, plan_stack, plan_stacks
from .plan import ALL_SCHEDULES, DEFAULT_DP_BUCKET_BYTES, OFFLOADS, RECOMPUTES, SCHEDULES, UNTIMED_SCHEDULES, Plan
from .tables import (AttentionTable, CalibratedTables, GemmTable, GemmWaves, LayerComposition, LayerProbe,
                     OptimizerLevels, RankCurve)
from .validate import plan_mask, validate

__all__ = [
    "ClusterSpec", "DeviceProfile", "GemmEfficiency", "LinkProfile", "NetworkProfile", "DTYPES",
    "CalibratedTables", "CollectiveFit", "CollectiveTables", "AttentionTable", "GemmTable", "GemmWaves",
    "LayerComposition", "LayerProbe", "OptimizerLevels", "RankCurve",
    "SpecError", "SpecWarning", "RankLayout", "MODEL_PRESETS", "ModelSpec", "Plan",
    "SCHEDULES", "UNTIMED_SCHEDULES", "ALL_SCHEDULES", "OFFLOADS", "RECOMPUTES", "DEFAULT_DP_BUCKET_BYTES",
    "cluster_from_dict", "device_from_dict", "profile_tables", "with_profile_tables", "known_profiles",
    "load_cluster", "load_model", "load_profile_dict",
    "model_from_dict", "model_from_hf_config", "parse_plan", "plan_from_dict", "profiles_dir",
    "plan_mask", "stage_layers", "validate",
    "STACKS", "Stack", "get_stack", "plan_stack", "plan_stacks",
]
