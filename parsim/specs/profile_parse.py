"""A profile's or cluster YAML's mapping -> ClusterSpec, every number checked on the way in.

Each value is checked for its type, finiteness and range, and a bad one is a SpecError naming
where it sits (``profile.network.intra_node.bandwidth``), the value and what is allowed: a
bandwidth of 0 would divide by zero, a negative one make negative delays, a NaN peak turn every
output into NaN, and ``devices_per_node: .inf`` overflow (issue 23). SI units throughout:
FLOP/s, bytes, bytes/s, seconds.
"""
from __future__ import annotations

import numbers
from typing import Any

from .cluster import ClusterSpec, DeviceProfile, GemmEfficiency, LinkProfile, NetworkProfile
from .collectives import CollectiveTables
from .errors import SpecError, checked_int
from .plan import MAX_INT
from .stack import get_stack, stacks_from_dict
from .tables import CalibratedTables

# Magnitudes a device or network number may have: far beyond any machine (an H100 is ~1e15
# FLOP/s, 8e10 bytes, 3e12 bytes/s, latencies ~1e-6 s) yet small enough that the products and
# quotients the cost model forms stay finite in float64 (max ~1.8e308)
_LARGEST = 1e30
_SMALLEST = 1e-30


def _real(where: str, raw: Any, allowed: str) -> float:
    """A finite real number (int, float or numpy scalar; not a bool) as a float."""
    if isinstance(raw, bool) or not isinstance(raw, numbers.Real):
        raise SpecError(where, raw, allowed)
    if isinstance(raw, numbers.Integral) and abs(int(raw)) > _LARGEST:
        raise SpecError(where, raw, allowed)
    value = float(raw)
    if not abs(value) <= _LARGEST:          # NaN and inf fail too
        raise SpecError(where, raw, allowed)
    return value


def positive(where: str, raw: Any, unit: str = "") -> float:
    """A finite number > 0 (what a rate, a capacity or an efficiency divides by)."""
    allowed = f"a finite number > 0{unit}, between {_SMALLEST:g} and {_LARGEST:g}"
    value = _real(where, raw, allowed)
    if not _SMALLEST <= value:
        raise SpecError(where, raw, allowed)
    return value


def non_negative(where: str, raw: Any, unit: str = "") -> float:
    """A finite number >= 0 (a latency, an overhead)."""
    allowed = f"a finite number >= 0{unit}, at most {_LARGEST:g}"
    value = _real(where, raw, allowed)
    if value < 0:
        raise SpecError(where, raw, allowed)
    return value


def fraction(where: str, raw: Any) -> float:
    """A share of something: 0 < value <= 1."""
    value = _real(where, raw, "a fraction in (0, 1]")
    if not 0 < value <= 1:
        raise SpecError(where, raw, "a fraction in (0, 1]")
    return value


def count(where: str, raw: Any) -> int:
    """A positive integer up to 2**53 (an integral float such as 8.0 is taken as 8)."""
    return checked_int(where, raw, 1, f"a positive integer up to 2**53 = {MAX_INT:,}", MAX_INT)


def section(where: str, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise SpecError(where, raw, "a mapping (a YAML section of key: value lines)")
    return raw


def required(where: str, data: dict[str, Any], key: str, what: str) -> Any:
    if key not in data:
        raise SpecError(f"{where}.{key}", None, f"required: {what}")
    return data[key]


def cluster_from_dict(data: dict[str, Any], num_devices: int, where: str = "profile") -> ClusterSpec:
    """A profile (or a cluster YAML: ``where="cluster"``) over ``num_devices`` devices."""
    data = section(where, data)
    name = data.get("name")
    if isinstance(name, (bool, list, dict)):
        raise SpecError(f"{where}.name", name, "a string")
    device = device_from_dict(required(where, data, "device", "the device section"), str(data.get("name", "device")),
                              f"{where}.device")
    network = _network(f"{where}.network", required(where, data, "network", "the network section"))
    per_node = count(f"{where}.devices_per_node", data.get("devices_per_node", 8))
    return ClusterSpec(name=device.name if name is None else str(name), device=device, network=network,
                       devices_per_node=per_node,
                       num_devices=count(f"{where}.num_devices", num_devices))


def device_from_dict(dev: dict[str, Any], default_name: str = "device",
                     where: str = "profile.device") -> DeviceProfile:
    """A profile's ``device`` section; a SpecError names the first bad value."""
    dev = section(where, dev)
    peaks = section(f"{where}.peak_flops", required(where, dev, "peak_flops", "peak FLOP/s per dtype"))
    if not peaks:
        raise SpecError(f"{where}.peak_flops", peaks, "at least one dtype: FLOP/s entry (e.g. bf16: 9.894e+14)")
    gemm = section(f"{where}.gemm", dev.get("gemm", {}))
    for key in gemm:
        if key not in ("max_efficiency", "half_dim"):
            raise SpecError(f"{where}.gemm.{key}", gemm[key], "unknown key; allowed: max_efficiency, half_dim")
    optional = {k: read(f"{where}.{k}", dev[k]) for k, read in _DEVICE_OPTIONAL.items() if k in dev}
    name = dev.get("name", default_name)
    return DeviceProfile(
        name=str(name),
        peak_flops={str(k): positive(f"{where}.peak_flops.{k}", v, " FLOP/s") for k, v in peaks.items()},
        memory_bytes=positive(f"{where}.memory_bytes", required(where, dev, "memory_bytes", "bytes"), " bytes"),
        memory_bandwidth=positive(f"{where}.memory_bandwidth",
                                  required(where, dev, "memory_bandwidth", "bytes/s"), " bytes/s"),
        gemm=GemmEfficiency(**{k: _gemm_value(where, k, v) for k, v in gemm.items()}),
        **optional,
        tables=CalibratedTables.from_dict(dev.get("extra", {})),
        **_stack_fields(where, dev),
    )


def _stack_fields(where: str, dev: dict[str, Any]) -> dict[str, Any]:
    """The profile's ``default_stack`` and per-GPU stack numbers (``specs.stack``): known
    stack names and keys, finite non-negative numbers (efficiencies, which divide, > 0)."""
    raw = dev.get("stacks")
    if raw is not None:
        for name, values in section(f"{where}.stacks", raw).items():
            for key, v in (values.items() if isinstance(values, dict) else ()):
                if isinstance(v, bool) or not isinstance(v, numbers.Real):
                    continue                    # stacks_from_dict names the field and what is allowed
                (positive if str(key).endswith("_efficiency") else non_negative)(f"{where}.stacks.{name}.{key}", v)
    out: dict[str, Any] = {"stacks": stacks_from_dict(raw, f"{where}.stacks")}
    if "default_stack" in dev:
        out["default_stack"] = get_stack(dev["default_stack"], f"{where}.default_stack").name
    return out


def _gemm_value(where: str, key: str, raw: Any) -> float:
    if key == "max_efficiency":
        return positive(f"{where}.gemm.max_efficiency", raw)
    return non_negative(f"{where}.gemm.half_dim", raw)


_DEVICE_OPTIONAL = {
    "membound_efficiency": positive,
    "attention_efficiency": positive,
    "cudnn_attention_efficiency": positive,
    "kernel_overhead_s": lambda w, v: non_negative(w, v, " s"),
    "host_flops": lambda w, v: positive(w, v, " FLOP/s"),
    "host_memory_bandwidth": lambda w, v: positive(w, v, " bytes/s"),
    "usable_memory_fraction": fraction,
    "power_w": lambda w, v: non_negative(w, v, " W"),
    "power_source": lambda w, v: str(v),
}


def _network(where: str, raw: Any) -> NetworkProfile:
    net = section(where, raw)
    links = {k: _link(f"{where}.{k}", required(where, net, k, "a link section with bandwidth and latency"))
             for k in ("intra_node", "inter_node", "host_link")}
    return NetworkProfile(**links, nics_per_node=count(f"{where}.nics_per_node", net.get("nics_per_node", 1)),
                          collectives=CollectiveTables.from_dict(net.get("collectives")))


def _link(where: str, raw: Any) -> LinkProfile:
    d = section(where, raw)
    return LinkProfile(
        bandwidth=positive(f"{where}.bandwidth", required(where, d, "bandwidth", "bytes/s"), " bytes/s"),
        latency=non_negative(f"{where}.latency", required(where, d, "latency", "seconds"), " s"))
