"""ClusterSpec: device profile + network profile + node shape + device count.

Profiles are YAML files under ``calibration/profiles/`` (datasheet GPUs and measured
machines). Every number is SI: FLOP/s, bytes, bytes/s, seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .collectives import CollectiveTables
from .errors import SpecError
from .stack import PROFILE_DEFAULT_STACK, Stack
from .tables import CalibratedTables

DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class GemmEfficiency:
    """Achieved fraction of peak for a GEMM of shape (m, n, k).

    eff = max_efficiency * prod_d d / (d + half_dim)   for d in (m, n, k)

    A saturating curve per dimension: a dimension equal to ``half_dim`` halves the
    efficiency (roofline-style occupancy model, cf. NVIDIA "Matrix Multiplication
    Background" user guide: small dims under-fill the SMs / tensor-core tiles).
    """

    max_efficiency: float = 0.8
    half_dim: float = 64.0

    def efficiency(self, m: float, n: float, k: float) -> float:
        h = self.half_dim
        return self.max_efficiency * (m / (m + h)) * (n / (n + h)) * (k / (k + h))


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    peak_flops: dict[str, float]          # dtype -> dense FLOP/s
    memory_bytes: float                   # device memory capacity, bytes
    memory_bandwidth: float               # bytes/s (HBM or DRAM)
    gemm: GemmEfficiency = field(default_factory=GemmEfficiency)
    membound_efficiency: float = 0.7      # achieved fraction of memory_bandwidth for elementwise ops
    attention_efficiency: float = 0.5     # fused (flash) attention: fraction of peak FLOP/s
    cudnn_attention_efficiency: float = 0.0  # cuDNN fused attention where it outruns flash (0: not stated)
    kernel_overhead_s: float = 5e-6       # launch / framework overhead per op, seconds
    host_flops: float = 1e12              # CPU FLOP/s for offloaded optimizer steps
    host_memory_bandwidth: float = 1e11   # CPU DRAM bytes/s for offloaded optimizer steps
    usable_memory_fraction: float = 1.0   # memory the framework can use (allocator/context reserve)
    power_w: float = 0.0                  # device power under load, watts (0: unknown); datasheet TDP = upper bound
    power_source: str = ""                # where power_w comes from
    tables: CalibratedTables = field(default_factory=CalibratedTables)   # what a calibration measured
    default_stack: str = PROFILE_DEFAULT_STACK  # the stack a plan with stack=auto runs (``specs.stack``)
    stacks: dict[str, Stack] = field(default_factory=dict)  # this GPU's numbers per stack (over the presets)
    stack: Stack | None = None            # the stack applied (``costs.stack.apply_stack``); None: not yet

    def flops(self, dtype: str) -> float:
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise SpecError("dtype", dtype, f"profile {self.name} has peak FLOP/s for {sorted(self.peak_flops)}") from None


@dataclass(frozen=True)
class LinkProfile:
    bandwidth: float  # bytes/s, one direction, per device
    latency: float    # seconds per message (alpha)


@dataclass(frozen=True)
class NetworkProfile:
    intra_node: LinkProfile              # NVLink/NVSwitch (per GPU)
    inter_node: LinkProfile              # per-NIC InfiniBand/Ethernet
    host_link: LinkProfile               # PCIe device <-> host
    nics_per_node: int = 1
    collectives: CollectiveTables = field(default_factory=CollectiveTables)  # calibrated alpha-beta per op/group size

    def inter_node_bandwidth_per_device(self, devices_per_node: int) -> float:
        """Inter-node bytes/s one device gets when all devices of a node talk at once."""
        return self.inter_node.bandwidth * self.nics_per_node / devices_per_node


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    device: DeviceProfile
    network: NetworkProfile
    devices_per_node: int
    num_devices: int

    def __post_init__(self) -> None:
        if not isinstance(self.num_devices, int) or self.num_devices <= 0:
            raise SpecError("cluster.num_devices", self.num_devices, "a positive integer")
        if not isinstance(self.devices_per_node, int) or self.devices_per_node <= 0:
            raise SpecError("cluster.devices_per_node", self.devices_per_node, "a positive integer")

    @property
    def num_nodes(self) -> int:
        return -(-self.num_devices // self.devices_per_node)

    def node_of(self, rank: int) -> int:
        return rank // self.devices_per_node
