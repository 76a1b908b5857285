"""Parsing of models, clusters, profiles and plans from the forms DESIGN.md names.

* model: preset name, YAML keyed by ModelSpec field names, or a Hugging Face config.json
* cluster: ``PRESET:NDEVICES`` (e.g. ``a100-80g:1024``) or a YAML file
* profile: a calibration profile YAML (device + network numbers)
* plan: a ``k=v`` string (``"dp=8 tp=8 pp=16 schedule=1f1b partition=5,7,7,5"``) or YAML
"""
from __future__ import annotations

import math
import re
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

from .cluster import ClusterSpec
from .errors import SpecError
from .files import finite_number, path_exists, read_mapping
from .model import MODEL_PRESETS, ModelSpec
from .plan import MAX_INT, Plan
from .profile_parse import cluster_from_dict, device_from_dict
from .tables import CalibratedTables


# ----------------------------------------------------------------------------- models

def load_model(source: str | Path | ModelSpec) -> ModelSpec:
    if isinstance(source, ModelSpec):
        return source
    text = str(source)
    if text in MODEL_PRESETS:
        return MODEL_PRESETS[text]
    path = Path(text)
    if not path_exists(path):
        raise SpecError("model", text, f"a preset ({', '.join(sorted(MODEL_PRESETS))}), a YAML file or a HF config.json path")
    data = _read_mapping(path, "model")
    if path.suffix == ".json" or "num_hidden_layers" in data or "n_layer" in data:
        return model_from_hf_config(data, name=path.stem if path.stem != "config" else path.parent.name)
    return model_from_dict(data, default_name=path.stem)


def model_from_dict(data: dict[str, Any], default_name: str = "custom") -> ModelSpec:
    allowed = set(ModelSpec.field_names())
    unknown = sorted((k for k in data if k not in allowed), key=str)
    if unknown:
        raise SpecError("model." + str(unknown[0]), data[unknown[0]],
                        f"unknown key; allowed keys: {', '.join(ModelSpec.field_names())}")
    data = dict(data)
    data.setdefault("name", default_name)
    if isinstance(data["name"], (int, float)) and not isinstance(data["name"], bool):
        data["name"] = str(data["name"])     # ``name: 2024`` reads as a number in YAML
    for req in ("layers", "hidden", "heads"):
        if req not in data:
            raise SpecError("model." + req, None, "required (a positive integer)")
    return ModelSpec(**data)


def model_from_hf_config(cfg: dict[str, Any], name: str = "hf-model") -> ModelSpec:
    """Map a Hugging Face config (Llama/Mistral/GPT-2/GPT-NeoX style keys) to a ModelSpec.
    Every value read is type-checked here and named by its HF key when it is wrong."""
    hf = _HfConfig(cfg)
    layers = hf.integer("num_hidden_layers", "n_layer", "num_layers")
    hidden = hf.integer("hidden_size", "n_embd", "d_model")
    heads = hf.integer("num_attention_heads", "n_head")
    if layers is None or hidden is None or heads is None:
        raise SpecError("model", name, "a HF config with num_hidden_layers/hidden_size/num_attention_heads (or n_layer/n_embd/n_head)")
    act = hf.word("hidden_act", "activation_function", default="gelu").lower()
    model_type = hf.word("model_type", default="").lower()
    swiglu = act in ("silu", "swish", "swiglu") or model_type in ("llama", "mistral", "qwen2", "mixtral")
    ffn = hf.integer("intermediate_size", "n_inner", "ffn_dim")
    dropout = hf.fraction("attention_dropout", "attn_pdrop", default=0.0)
    return ModelSpec(
        name=hf.word("_name_or_path", default=name) or name,
        layers=layers, hidden=hidden, heads=heads,
        kv_heads=hf.integer("num_key_value_heads", default=heads),
        ffn_hidden=ffn,
        vocab=hf.integer("vocab_size", default=51200),
        seq_len=hf.integer("max_position_embeddings", "n_positions", "seq_length", default=2048),
        activation="swiglu" if swiglu else "gelu",
        norm="rmsnorm" if ("rms_norm_eps" in cfg or swiglu) else "layernorm",
        position="rope" if ("rope_theta" in cfg or swiglu) else "learned",
        tied_embeddings=hf.boolean("tie_word_embeddings", default=not swiglu),
        dropout=dropout > 0,
        flash_attention=swiglu,
        bias=hf.boolean("attention_bias", "bias", default=not swiglu),
    )


class _HfConfig:
    """Typed reads of a HF config: the first of ``keys`` present (and not null), checked."""

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg

    def _get(self, keys: tuple[str, ...]) -> tuple[str | None, Any]:
        for k in keys:
            if self.cfg.get(k) is not None:
                return k, self.cfg[k]
        return None, None

    def integer(self, *keys: str, default: int | None = None) -> int | None:
        key, v = self._get(keys)
        if key is None:
            return default
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            v = int(v)                    # 4096.0: JSON writers sometimes emit integers as floats
        if isinstance(v, bool) or not isinstance(v, int):
            raise SpecError(f"model.{key}", v, "a positive integer (in the HF config)")
        return v

    def fraction(self, *keys: str, default: float) -> float:
        key, v = self._get(keys)
        if key is None:
            return default
        if not finite_number(v) or not 0 <= v <= 1:
            raise SpecError(f"model.{key}", v, "a probability between 0 and 1 (in the HF config)")
        return float(v)

    def boolean(self, *keys: str, default: bool) -> bool:
        key, v = self._get(keys)
        if key is None:
            return default
        if not isinstance(v, bool):
            raise SpecError(f"model.{key}", v, "true or false (in the HF config)")
        return v

    def word(self, *keys: str, default: str) -> str:
        key, v = self._get(keys)
        if key is None:
            return default
        if not isinstance(v, str):
            raise SpecError(f"model.{key}", v, "a string (in the HF config)")
        return v


# ----------------------------------------------------------------------------- clusters

def profiles_dir() -> Path:
    return Path(str(resources.files("parsim.calibration").joinpath("profiles")))


def known_profiles() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.yaml"))


def load_cluster(source: str | Path | ClusterSpec, profile: str | Path | None = None) -> ClusterSpec:
    """``PRESET:N`` or a cluster YAML; ``profile`` overrides the device and network numbers."""
    if isinstance(source, ClusterSpec):
        cluster = source
    else:
        text = str(source)
        path = Path(text)
        if path.suffix in (".yaml", ".yml") and path_exists(path):
            data = _read_mapping(path, "cluster")
            if "num_devices" not in data:
                raise SpecError("cluster.num_devices", None, "required in a cluster YAML (a positive integer)")
            cluster = cluster_from_dict(data, num_devices=data["num_devices"], where="cluster")
        else:
            if ":" not in text:
                raise SpecError("cluster", text, f"PRESET:NDEVICES (presets: {', '.join(known_profiles())}) or a YAML file")
            preset, _, count = text.rpartition(":")
            try:
                n = int(count)
            except ValueError:
                raise SpecError("cluster", text, "PRESET:NDEVICES with NDEVICES a positive integer") from None
            if not 1 <= n <= MAX_INT:
                raise SpecError("cluster", text, "PRESET:NDEVICES with NDEVICES a positive integer up to 2**53")
            if not _is_profile(preset):
                raise SpecError("cluster", text, f"PRESET:NDEVICES with PRESET one of {', '.join(known_profiles())} "
                                "(or a profile YAML path), or a cluster YAML file")
            cluster = cluster_from_dict(load_profile_dict(preset), num_devices=n)
    if profile is not None:
        prof = cluster_from_dict(load_profile_dict(profile), num_devices=cluster.num_devices)
        cluster = ClusterSpec(name=prof.name, device=prof.device, network=prof.network,
                              devices_per_node=prof.devices_per_node, num_devices=cluster.num_devices)
    return cluster


def load_profile_dict(source: str | Path) -> dict[str, Any]:
    text = str(source)
    path = Path(text)
    if not (path.suffix in (".yaml", ".yml") and path_exists(path)):
        path = profiles_dir() / f"{text}.yaml"
        if not _is_profile(text):
            raise SpecError("profile", text, f"a preset ({', '.join(known_profiles())}) or a profile YAML path")
    return _read_mapping(path, "profile")


def _is_profile(text: str) -> bool:
    """A shipped profile's name or an existing profile YAML path."""
    path = Path(text)
    return (path.suffix in (".yaml", ".yml") and path_exists(path)) or (
        "/" not in text and "\0" not in text and path_exists(profiles_dir() / f"{text}.yaml"))


def profile_tables(data: dict[str, Any]) -> CalibratedTables:
    """The calibrated tables of a profile mapping (``load_profile_dict``): its ``device.extra``."""
    return CalibratedTables.from_dict((data.get("device") or {}).get("extra", {}))


def with_profile_tables(data: dict[str, Any], tables: CalibratedTables) -> dict[str, Any]:
    """A copy of the profile mapping with ``tables`` as its ``device.extra`` (the rest shared;
    no ``extra`` section where there was none and there are no tables)."""
    extra = tables.to_dict()
    if not extra and "extra" not in data["device"]:
        return {**data, "device": dict(data["device"])}
    return {**data, "device": {**data["device"], "extra": extra}}


# ----------------------------------------------------------------------------- plans

_PLAN_FIELDS = {f.name: f for f in fields(Plan)}
_BOOL_WORDS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False, "on": True, "off": False}


def parse_plan(source: str | Path | dict | Plan) -> Plan:
    """A ``k=v`` string, a YAML path, a dict, or a Plan."""
    if isinstance(source, Plan):
        return source
    if isinstance(source, dict):
        return plan_from_dict(source)
    text = str(source).strip()
    path = Path(text)
    if text.endswith((".yaml", ".yml")):
        if not path_exists(path):
            raise SpecError("plan", text, "an existing YAML file or a 'k=v k=v' string")
        return plan_from_dict(_read_mapping(path, "plan"))
    return plan_from_dict(plan_pairs(text))


def plan_pairs(text: str) -> dict[str, str]:
    """The ``key: value`` pairs of a ``k=v k=v`` plan string (each key at most once)."""
    pairs: dict[str, str] = {}
    for token in text.split():
        if "=" not in token:
            raise SpecError("plan", token, "space-separated key=value pairs, e.g. 'dp=2 tp=2 pp=2 schedule=1f1b'")
        k, _, v = token.partition("=")
        k, v = k.strip(), v.strip()
        if k in pairs:
            raise SpecError(k, v, f"given once; the plan sets {k} twice ({k}={pairs[k]} and {k}={v})")
        pairs[k] = v
    return pairs


def plan_from_dict(data: dict[str, Any]) -> Plan:
    kwargs: dict[str, Any] = {}
    for key, raw in data.items():
        if key not in _PLAN_FIELDS:
            raise SpecError(str(key), raw, f"unknown plan key; allowed keys: {', '.join(_PLAN_FIELDS)}")
        kwargs[key] = _coerce(key, raw)
    return Plan(**kwargs)


_INT_KEYS = ("dp", "tp", "pp", "vpp", "mbs", "gbs", "zero", "dp_bucket_bytes")
_BOOL_KEYS = ("sp", "dp_overlap", "shifted_critical_path")
_LIST_KEYS = ("partition", "recompute_layers")


def _coerce(key: str, raw: Any) -> Any:
    if key in _INT_KEYS:
        return _integer(key, raw, raw, "an integer")
    if key in _BOOL_KEYS:
        if isinstance(raw, bool):
            return raw
        w = str(raw).lower() if isinstance(raw, (str, int)) else None
        if w not in _BOOL_WORDS:
            raise SpecError(key, raw, "true or false")
        return _BOOL_WORDS[w]
    if key in _LIST_KEYS:
        if key == "partition" and raw == "balanced":
            return None
        allowed = ("'balanced' or a comma-separated list of integers, one per stage" if key == "partition"
                   else "a comma-separated list of integers, one per stage")
        items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",") if isinstance(raw, (str, int)) else None
        if items is None:
            raise SpecError(key, raw, allowed)
        return tuple(_integer(key, x, raw, allowed) for x in items)
    if not isinstance(raw, (str, int)) or isinstance(raw, bool):
        raise SpecError(key, raw, "a word (see the plan key table)")
    return str(raw)


_INTEGER = re.compile(r"[+-]?[0-9]+")


def _integer(key: str, raw: Any, shown: Any, allowed: str) -> int:
    """An int, or the ASCII digits of one; anything else (1.7, '2.0', True, 'four') is refused."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and _INTEGER.fullmatch(raw.strip()):
        if len(raw.strip()) > 30:    # no int() of thousands of digits: Python refuses past 4300
            raise SpecError(key, shown, f"{allowed} at most 2**53 = {MAX_INT:,} (exact in float64)")
        return int(raw)
    raise SpecError(key, shown, allowed)


def _read_mapping(path: Path, what: str) -> dict[str, Any]:
    return read_mapping(path, what)
