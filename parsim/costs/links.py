"""Which link a transfer leaves a device on: its port on the node's NVLink / NVSwitch fabric
between devices of one node, its share of the node's NICs otherwise (NVIDIA DGX A100 / H100
white papers); devices are numbered node by node (``ClusterSpec.node_of``). ``pcie`` is the
device's host link (ZeRO-Offload). ``costs.timing`` prices each link; the SimPy engine queues
transfers on per-device ports named after them (``sim.network``); the fast path asks whether
two groups share one (``fast.comm``).
"""
from __future__ import annotations

from parsim.specs import ClusterSpec

LINKS = ("nvlink", "nic", "pcie")


def nic_share(cluster: ClusterSpec) -> float:
    """Inter-node bytes/s one device sends at while every device of its node sends at once
    (DP and TP groups run in lockstep; a pipeline stage spanning a node sends from all its
    ranks together): its share of the node's NICs, and never more than one NIC. Every
    inter-node price (collectives, pipeline sends, parameter server) reads it."""
    net = cluster.network
    return min(net.inter_node_bandwidth_per_device(cluster.devices_per_node), net.inter_node.bandwidth)


def link_between(cluster: ClusterSpec, src: int, dst: int) -> str:
    """The link a point-to-point send from global rank ``src`` to ``dst`` leaves on."""
    return "nvlink" if cluster.node_of(src) == cluster.node_of(dst) else "nic"


def group_link(cluster: ClusterSpec, ranks: list[int]) -> str:
    """The link a collective over these global ranks uses: NVLink inside one node, else the NICs."""
    return "nvlink" if len({cluster.node_of(r) for r in ranks}) == 1 else "nic"
