"""Parsing of models, clusters, profiles and plans from the forms DESIGN.md names.

* model: preset name, YAML keyed by ModelSpec field names, or a Hugging Face config.json
* cluster: ``PRESET:NDEVICES`` (e.g. ``a100-80g:1024``) or a YAML file
* profile: a calibration profile YAML (device + network numbers)
* plan: a ``k=v`` string (``"dp=8 tp=8 pp=16 schedule=1f1b partition=5,7,7,5"``) or YAML
"""
from __future__ import annotations

import json
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .cluster import ClusterSpec, DeviceProfile, GemmEfficiency, LinkProfile, NetworkProfile
from .collectives import CollectiveTables
from .errors import SpecError
from .model import MODEL_PRESETS, ModelSpec
from .plan import Plan
from .stack import get_stack, stacks_from_dict
from .tables import CalibratedTables


# ----------------------------------------------------------------------------- models

def load_model(source: str | Path | ModelSpec) -> ModelSpec:
    if isinstance(source, ModelSpec):
        return source
    text = str(source)
    if text in MODEL_PRESETS:
        return MODEL_PRESETS[text]
    path = Path(text)
    if not path.exists():
        raise SpecError("model", text, f"a preset ({', '.join(sorted(MODEL_PRESETS))}), a YAML file or a HF config.json path")
    data = _read_mapping(path, "model")
    if path.suffix == ".json" or "num_hidden_layers" in data or "n_layer" in data:
        return model_from_hf_config(data, name=path.stem if path.stem != "config" else path.parent.name)
    return model_from_dict(data, default_name=path.stem)


def model_from_dict(data: dict[str, Any], default_name: str = "custom") -> ModelSpec:
    allowed = set(ModelSpec.field_names())
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SpecError("model." + unknown[0], data[unknown[0]], f"unknown key; allowed keys: {', '.join(ModelSpec.field_names())}")
    data = dict(data)
    data.setdefault("name", default_name)
    for req in ("layers", "hidden", "heads"):
        if req not in data:
            raise SpecError("model." + req, None, "required (a positive integer)")
    return ModelSpec(**data)


def model_from_hf_config(cfg: dict[str, Any], name: str = "hf-model") -> ModelSpec:
    """Map a Hugging Face config (Llama/Mistral/GPT-2/GPT-NeoX style keys) to a ModelSpec."""
    def get(*keys, default=None):
        for k in keys:
            if k in cfg and cfg[k] is not None:
                return cfg[k]
        return default

    layers = get("num_hidden_layers", "n_layer", "num_layers")
    hidden = get("hidden_size", "n_embd", "d_model")
    heads = get("num_attention_heads", "n_head")
    if layers is None or hidden is None or heads is None:
        raise SpecError("model", name, "a HF config with num_hidden_layers/hidden_size/num_attention_heads (or n_layer/n_embd/n_head)")
    act = str(get("hidden_act", "activation_function", default="gelu")).lower()
    model_type = str(get("model_type", default="")).lower()
    swiglu = act in ("silu", "swish", "swiglu") or model_type in ("llama", "mistral", "qwen2", "mixtral")
    ffn = get("intermediate_size", "n_inner", "ffn_dim")
    return ModelSpec(
        name=str(get("_name_or_path", default=name) or name),
        layers=int(layers), hidden=int(hidden), heads=int(heads),
        kv_heads=int(get("num_key_value_heads", default=heads)),
        ffn_hidden=int(ffn) if ffn else None,
        vocab=int(get("vocab_size", default=51200)),
        seq_len=int(get("max_position_embeddings", "n_positions", "seq_length", default=2048)),
        activation="swiglu" if swiglu else "gelu",
        norm="rmsnorm" if ("rms_norm_eps" in cfg or swiglu) else "layernorm",
        position="rope" if ("rope_theta" in cfg or swiglu) else "learned",
        tied_embeddings=bool(get("tie_word_embeddings", default=not swiglu)),
        dropout=float(get("attention_dropout", "attn_pdrop", default=0.0) or 0.0) > 0,
        flash_attention=swiglu,
        bias=bool(get("attention_bias", "bias", default=not swiglu)),
    )


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
        if path.suffix in (".yaml", ".yml") and path.exists():
            data = _read_mapping(path, "cluster")
            if "num_devices" not in data:
                raise SpecError("cluster.num_devices", None, "required in a cluster YAML (a positive integer)")
            cluster = cluster_from_dict(data, num_devices=data["num_devices"])
        else:
            if ":" not in text:
                raise SpecError("cluster", text, f"PRESET:NDEVICES (presets: {', '.join(known_profiles())}) or a YAML file")
            preset, _, count = text.rpartition(":")
            try:
                n = int(count)
            except ValueError:
                raise SpecError("cluster", text, "PRESET:NDEVICES with NDEVICES a positive integer") from None
            if n < 1:
                raise SpecError("cluster", text, "PRESET:NDEVICES with NDEVICES a positive integer")
            cluster = cluster_from_dict(load_profile_dict(preset), num_devices=n)
    if profile is not None:
        prof = cluster_from_dict(load_profile_dict(profile), num_devices=cluster.num_devices)
        cluster = ClusterSpec(name=prof.name, device=prof.device, network=prof.network,
                              devices_per_node=prof.devices_per_node, num_devices=cluster.num_devices)
    return cluster


def load_profile_dict(source: str | Path) -> dict[str, Any]:
    text = str(source)
    path = Path(text)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = profiles_dir() / f"{text}.yaml"
        if not path.exists():
            raise SpecError("profile", text, f"a preset ({', '.join(known_profiles())}) or a profile YAML path")
    return _read_mapping(path, "profile")


def cluster_from_dict(data: dict[str, Any], num_devices: int) -> ClusterSpec:
    try:
        device = device_from_dict(data["device"], str(data.get("name", "device")))
        net = data["network"]
        network = NetworkProfile(
            intra_node=_link(net["intra_node"]),
            inter_node=_link(net["inter_node"]),
            host_link=_link(net["host_link"]),
            nics_per_node=int(net.get("nics_per_node", 1)),
            collectives=CollectiveTables.from_dict(net.get("collectives")),
        )
        return ClusterSpec(name=str(data.get("name", device.name)), device=device, network=network,
                           devices_per_node=int(data.get("devices_per_node", 8)), num_devices=int(num_devices))
    except SpecError:
        raise
    except KeyError as e:
        raise SpecError(f"profile.{e.args[0]}", None, "required key missing in the profile") from None
    except (TypeError, ValueError) as e:
        raise SpecError("profile", data.get("name", "?"), f"malformed number or section ({e})") from None


def device_from_dict(dev: dict[str, Any], default_name: str = "device") -> DeviceProfile:
    """A profile's ``device`` section (KeyError / TypeError / ValueError when malformed:
    ``cluster_from_dict`` turns them into a SpecError)."""
    gemm = GemmEfficiency(**{k: float(v) for k, v in dev.get("gemm", {}).items()})
    tables = CalibratedTables.from_dict(dev.get("extra", {}))
    return DeviceProfile(
        name=str(dev.get("name", default_name)),
        peak_flops={k: float(v) for k, v in dev["peak_flops"].items()},
        memory_bytes=float(dev["memory_bytes"]),
        memory_bandwidth=float(dev["memory_bandwidth"]),
        gemm=gemm,
        **{k: float(dev[k]) for k in ("membound_efficiency", "attention_efficiency", "kernel_overhead_s",
                                       "host_flops", "host_memory_bandwidth", "usable_memory_fraction",
                                       "power_w") if k in dev},
        **({"power_source": str(dev["power_source"])} if "power_source" in dev else {}),
        tables=tables,
        **_stack_fields(dev),
    )


def _stack_fields(dev: dict[str, Any]) -> dict[str, Any]:
    """The profile's ``default_stack`` and per-GPU stack numbers (``specs.stack``)."""
    out: dict[str, Any] = {"stacks": stacks_from_dict(dev.get("stacks"))}
    if "default_stack" in dev:
        out["default_stack"] = get_stack(dev["default_stack"], "profile.device.default_stack").name
    return out


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


def _link(d: dict[str, Any]) -> LinkProfile:
    return LinkProfile(bandwidth=float(d["bandwidth"]), latency=float(d["latency"]))


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
        if not path.exists():
            raise SpecError("plan", text, "an existing YAML file or a 'k=v k=v' string")
        return plan_from_dict(_read_mapping(path, "plan"))
    pairs: dict[str, str] = {}
    for token in text.split():
        if "=" not in token:
            raise SpecError("plan", token, "space-separated key=value pairs, e.g. 'dp=2 tp=2 pp=2 schedule=1f1b'")
        k, _, v = token.partition("=")
        pairs[k.strip()] = v.strip()
    return plan_from_dict(pairs)


def plan_from_dict(data: dict[str, Any]) -> Plan:
    kwargs: dict[str, Any] = {}
    for key, raw in data.items():
        if key not in _PLAN_FIELDS:
            raise SpecError(key, raw, f"unknown plan key; allowed keys: {', '.join(_PLAN_FIELDS)}")
        kwargs[key] = _coerce(key, raw)
    return Plan(**kwargs)


def _coerce(key: str, raw: Any) -> Any:
    int_keys = ("dp", "tp", "pp", "vpp", "mbs", "gbs", "zero", "dp_bucket_bytes")
    bool_keys = ("sp", "dp_overlap", "shifted_critical_path")
    list_keys = ("partition", "recompute_layers")
    if key in int_keys:
        if isinstance(raw, bool):
            raise SpecError(key, raw, "an integer")
        try:
            return int(raw) if isinstance(raw, int) or str(raw).lstrip("-").isdigit() else _bad_int(key, raw)
        except ValueError:
            _bad_int(key, raw)
    if key in bool_keys:
        if isinstance(raw, bool):
            return raw
        w = str(raw).lower()
        if w not in _BOOL_WORDS:
            raise SpecError(key, raw, "true or false")
        return _BOOL_WORDS[w]
    if key in list_keys:
        if key == "partition" and str(raw) == "balanced":
            return None
        items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
        try:
            return tuple(int(x) for x in items)
        except (TypeError, ValueError):
            raise SpecError(key, raw, "'balanced' or a comma-separated list of integers, one per stage" if key == "partition"
                            else "a comma-separated list of integers, one per stage") from None
    return str(raw)


def _bad_int(key: str, raw: Any):
    raise SpecError(key, raw, "an integer")


def _read_mapping(path: Path, what: str) -> dict[str, Any]:
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, json.JSONDecodeError, yaml.YAMLError) as e:
        raise SpecError(what, str(path), f"a readable {'JSON' if path.suffix == '.json' else 'YAML'} file ({e.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise SpecError(what, str(path), "a file holding a mapping of keys to values")
    return data
