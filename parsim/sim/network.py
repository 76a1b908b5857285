"""Links, and the collectives and pipeline sends that use them.

Every simulated device has three link ports: ``nvlink`` (its port on the node's
NVLink/NVSwitch fabric; NVSwitch is non-blocking, so the per-device port is the bottleneck,
and per-device bandwidth is what ``timing.collective_time`` and ``timing.p2p_time`` assume:
NVIDIA DGX A100 / H100 white papers), ``nic`` (its inter-node port: its share of the node's
NICs, as ``collective_time`` prices it) and ``pcie`` (its host link, for ZeRO-Offload).

A port carries one transfer at a time at full speed, first come first served: a
``simpy.Resource(capacity=1)``. Because every transfer's duration is known when it is
queued, the port is kept as its *reservation*: a transfer queued at ``now`` starts at
``max(now, free_at)`` and moves ``free_at`` to its end — the start times a capacity-1 FIFO
Resource gives, with one SimPy event per transfer instead of a request, a hold and a release
(tests/test_sim_network.py checks the two agree). A collective over several ports starts
when all of them are free and holds them all (the same as asking a Resource for each at one
instant: nobody who queued later can use a port in the gap).

A transfer holds the *sending* device's port (every member sends in a collective), so a DP
bucket and a pipeline send leaving one device over one link wait for each other, while
different devices do not. Ports are per device so that simulating one representative device
per pipeline rank and simulating every device give the same answer.

A ``Communicator`` is one process group (TP or DP). In ``full`` mode it has every member's
process; a collective starts when all members have called it (NCCL matches the calls of one
communicator in issue order) and their ports are free. In ``representative`` mode its one
simulated member stands for the group, and the collective is costed for the full group.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import simpy
from simpy.core import NORMAL

from parsim.costs.links import LINKS, group_link, link_between  # noqa: F401  (the engine's names for them)
from parsim.costs.timing import parameter_server_time
from parsim.specs import ClusterSpec


class Port:
    """One device's port on one link: FIFO, one transfer at a time (capacity-1 Resource
    semantics, kept as the time it is next free)."""
    __slots__ = ("name", "free_at")

    def __init__(self, name: str) -> None:
        self.name = name
        self.free_at = 0.0

    def reserve(self, now: float, duration: float) -> float:
        """Queue a transfer of ``duration`` seconds at ``now``; return its start."""
        start = now if now > self.free_at else self.free_at
        self.free_at = start + duration
        return start


def reserve_all(ports, now: float, duration: float) -> float:
    """Queue one transfer that needs every port in ``ports`` at once; return its start."""
    start = max(now, *(p.free_at for p in ports))
    for p in ports:
        p.free_at = start + duration
    return start


@dataclass
class Ports:
    """One device's link ports."""
    nvlink: Port
    nic: Port
    pcie: Port


def device_ports() -> Ports:
    return Ports(*(Port(name) for name in LINKS))


class Arrival(simpy.Event):
    """An event that is made to happen at a known later time (as ``simpy.Timeout`` does), for
    a waiter that may have started waiting before the time was known."""

    def arrive(self, delay: float, value: object = None) -> None:
        self._ok = True
        self._value = value
        self.env.schedule(self, NORMAL, delay)


def group_shape(cluster: ClusterSpec, ranks: list[int]) -> tuple[int, int]:
    """(members, nodes spanned): all that ``collective_time`` depends on besides the op and size."""
    return len(ranks), len({cluster.node_of(r) for r in ranks})


@dataclass
class _Rendezvous:
    done: Arrival
    arrived: int = 0
    start: float = 0.0
    logs: list = field(default_factory=list)


@dataclass
class Communicator:
    """A process group: its full membership (for costs) and its simulated members (for barriers)."""
    name: str                              # "tp" | "dp"
    ranks: tuple[int, ...]                 # every member's global rank
    members: tuple[int, ...]               # the members simulated in this run
    ports: tuple[Port, ...]                # the simulated members' ports on this group's link
    link: str
    shape: tuple[int, int] = (1, 1)        # (members, nodes spanned): what collective_time depends on
    _seq: dict[int, int] = field(default_factory=dict)
    _pending: dict[int, _Rendezvous] = field(default_factory=dict)


def collective(env: simpy.Environment, comm: Communicator, member: int, duration: float):
    """One collective call by ``member`` (a generator: ``start = yield from collective(...)``);
    the caller resumes when it ends. Returns the time the transfer started."""
    if len(comm.members) == 1:
        if duration <= 0:
            return env.now
        start = comm.ports[0].reserve(env.now, duration)
        yield env.timeout(start + duration - env.now)
        return start
    seq = comm._seq.get(member, 0)
    comm._seq[member] = seq + 1
    rv = comm._pending.get(seq)
    if rv is None:
        rv = comm._pending[seq] = _Rendezvous(Arrival(env))
    rv.arrived += 1
    if rv.arrived == len(comm.members):          # the last member to call starts it
        del comm._pending[seq]
        rv.start = reserve_all(comm.ports, env.now, duration) if duration > 0 else env.now
        rv.done.arrive(rv.start + max(duration, 0.0) - env.now)
    yield rv.done
    return rv.start


def issue(env: simpy.Environment, comm: Communicator, member: int, duration: float, log=None):
    """Queue a collective and return at once (NCCL ops are asynchronous: DDP issues a bucket's
    all-reduce when the bucket fills and goes on). Returns its end time when that is known
    now, else an event that fires at its end; ``log(rank, start, end)`` is called for every
    member once the start is known."""
    if len(comm.members) == 1:
        start = comm.ports[0].reserve(env.now, duration) if duration > 0 else env.now
        if log is not None:
            log(member, start, start + max(duration, 0.0))
        return start + max(duration, 0.0)
    seq = comm._seq.get(member, 0)
    comm._seq[member] = seq + 1
    rv = comm._pending.get(seq)
    if rv is None:
        rv = comm._pending[seq] = _Rendezvous(Arrival(env))
    rv.arrived += 1
    rv.logs.append((member, log))
    if rv.arrived == len(comm.members):
        del comm._pending[seq]
        rv.start = reserve_all(comm.ports, env.now, duration) if duration > 0 else env.now
        end = rv.start + max(duration, 0.0)
        rv.done.arrive(end - env.now, rv.start)
        for m, lg in rv.logs:
            if lg is not None:
                lg(m, rv.start, end)
    return rv.done


def until(env: simpy.Environment, end):
    """Wait for what ``issue`` returned (a generator)."""
    if isinstance(end, simpy.Event):
        if not end.processed:
            yield end
    elif end > env.now:
        yield env.timeout(end - env.now)


def transfer(env: simpy.Environment, port: Port, duration: float):
    """A transfer of known duration over one port (a generator returning its start time)."""
    start = port.reserve(env.now, duration)
    yield env.timeout(start + duration - env.now)
    return start


def ps_time(cluster: ClusterSpec, nbytes: float, ranks: list[int]) -> float:
    """Parameter server / single-process DataParallel: see ``costs.timing.parameter_server_time``."""
    return parameter_server_time(cluster, nbytes, ranks)
