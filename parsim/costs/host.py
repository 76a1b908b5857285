"""Ranks that share one host: how they slow each other down. Identity on GPUs.

On a calibrated CPU profile the ranks of a plan are processes on the same cores and the same
memory bandwidth. Four measured effects (``parsim calibrate``; ``specs.CalibratedTables``):

* **contention**: with ``n`` ranks computing at once each GEMM second stretches to ``g(n)``
  seconds and each memory-bound second from DRAM to ``m(n)`` (``host_contention``,
  ``dram_share``);
* **interference**: a collective is CPU work too (gloo's threads, the loopback TCP stack),
  so one that runs while its rank computes takes ``comm_interference`` x the overlap from
  that compute (``ComputeLedger``);
* **message CPU**: with more ranks than cores, a pipeline message takes CPU seconds from the
  ranks that compute (gloo's send and its receiver's wake-up and copy run on the host's cores;
  measured per message, ``message_cpu``); and at any count of ranks a send's call holds its
  rank a while, wall time beyond that CPU (``send_hold``);
* **processor sharing**: a rank idle in a pipeline bubble leaves its core to the others, so a
  job's speed follows how many ranks compute at each instant (``sharing.ProcessorSharing``:
  egalitarian processor sharing, Kleinrock, "Queueing Systems Vol. 2", 1976, Sec. 4.4, with
  the measured sharing law); where that cannot be played out instant by instant, a
  mean-field fixed point on the average number of ranks computing (``HostModel.settle``).

A GPU owns its device: every factor is 1; interference is what NCCL's kernels take from the
compute they overlap (``costs.stack.comm_compute_slowdown``; 0 unless the stack states it).
``HostModel`` is what the SimPy engine, the partitioner's replay and the fast path (solo times) ask.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from parsim.specs import ClusterSpec
from parsim.specs.tables import RankCurve

from .ops import Op
from .placement import remote_messages
from .sharing import Clock, ProcessorSharing, SharingLaw
from .stack import comm_compute_slowdown


@dataclass(frozen=True)
class ComputeScale:
    """Factors on a rank's compute time: GEMMs and attention, memory-bound ops (slowed more
    than GEMMs where ranks share a host's memory bandwidth), the optimizer step
    (``host_contention``'s "optimizer"). ``cache_bytes``: a rank's share of the last-level cache
    (``rank_cache_bytes``), which splits a memory-bound op between the two (``dram_weight``)."""
    gemm: float = 1.0
    membound: float = 1.0
    optimizer: float = 1.0
    cache_bytes: float | None = None

    def of(self, op: Op, pass_: str = "fwd") -> float:
        w = dram_weight(op, pass_, self.cache_bytes)
        return (1.0 - w) * self.gemm + w * self.membound

    def times(self, factor: float) -> "ComputeScale":
        return ComputeScale(self.gemm * factor, self.membound * factor, self.optimizer * factor, self.cache_bytes)


def dram_share(nbytes: float, cache_bytes: float | None) -> float:
    """The share of a memory-bound op's time that contends for the host's memory bandwidth when
    ranks compute at once, by the bytes it moves in one pass (``costs.ops``) against a rank's
    share of the last-level cache: 0 up to half of it (its tensors stay in cache: the GEMM
    factor), 1 from twice it (all from DRAM: the streaming add's ``contention_membound``),
    log-linear between. A 2-rank streaming add on this project's 2-vCPU AMD VM (32 MiB L3 for
    both: 16 MiB a rank) read 1.0-1.1x up to 2 MiB tensors (6 MiB moved), 1.3x at 4, 2.4-3.1x at
    8 (alone still partly in cache), 1.6-1.8x from 16 on (``studies/validation_cpu/heldout/
    stream_sizes.txt``); the ramp's ends (not fitted) give 1.0 / 1.22 / 1.6 / 1.75. In [0, 1]."""
    if cache_bytes is None or cache_bytes <= 0:
        return 1.0
    return min(math.log2(nbytes / (0.5 * cache_bytes)) / 2.0, 1.0) if nbytes > 0.5 * cache_bytes else 0.0


def dram_weight(op: Op, pass_: str, cache_bytes: float | None) -> float:
    """The share of ``op``'s time in ``pass_`` that takes the memory-bound contention, the rest
    the GEMM's (``ComputeScale.of``; the partitioner's shared-host replay, ``partition.spec_graph.
    pass_times``): a forward (or its re-run) by ``dram_share``, as its chain's tensors were just
    written; a backward 1, as it reads activations saved a whole forward earlier, from DRAM."""
    if op.kind != "membound":
        return 0.0
    return dram_share(op.fwd_bytes, cache_bytes) if pass_ == "fwd" else 1.0


def cache_share(tables, on_host: float) -> float | None:
    """Bytes of last-level cache each of ``on_host`` ranks on one host has (``CalibratedTables.
    last_level_cache`` over them); None without one (GPU profiles). ``calibration.layer_terms``
    splits the layer probe's memory-bound time with it as the engine does."""
    return tables.last_level_cache / max(on_host, 1) if tables.last_level_cache else None


def rank_cache_bytes(cluster: ClusterSpec, ranks: int) -> float | None:
    """``cache_share`` of a plan's ``ranks`` on its hosts (``devices_per_node`` at most on one)."""
    return cache_share(cluster.device.tables, _on_host(cluster, ranks))


def lockstep(plan: Any) -> bool:
    """Do the plan's ranks on a host run op by op in step? A TP group's collectives (inside every
    layer) and ZeRO-3's parameter gathers (one per unit) hold its ranks together, so a
    memory-bound op of one rank meets the same op on the others; DP replicas (one gradient sync
    a step or a microbatch) and pipeline stages drift apart within a step, so one rank's
    memory-bound op mostly meets the other's GEMMs (``host_contention``'s ``lockstep``)."""
    return plan.tp > 1 or (plan.zero >= 3 and plan.dp > 1)


def host_contention(cluster: ClusterSpec, ranks: float, kind: str = "gemm", in_step: bool = True) -> float:
    """Compute slowdown when ``ranks`` processes of one plan compute at once on a host's cores.

    Calibrated CPU profiles carry ``contention`` ({concurrent ranks: per-rank GEMM slowdown}),
    ``contention_membound`` (a streaming add of 3 x 16 MiB, from DRAM: ``dram_share``) and
    ``contention_optimizer`` (the executor's AdamW step, ``calibration.compute.
    optimizer_step_callable``: bounded by a core's issue rate as much as by the bandwidth,
    1.15-1.35x at 2 ranks on this project's 2-vCPU AMD VM where the add read 1.1-1.95x); ``kind``
    picks "gemm", "membound" (falls back to the GEMM table) or "optimizer" (to the memory-bound
    one). Linear between measured counts (``ranks`` may be a fraction: ``HostModel.settle``);
    past the largest it scales with ranks per core (processor sharing). GPUs and uncalibrated
    profiles: 1 (each rank owns its device).

    ``in_step`` (``lockstep`` says it of a plan): the streaming probe runs the same op on every
    rank at once, the slowdown of ranks in step. Ranks that run independently (``in_step=False``)
    take the GEMM's slowdown for their memory-bound ops up to one rank per core, as measured where
    it can be told apart: in the executor's own traces of 2-rank pipeline plans a rank's compute
    action ran 1.003x (median over 16 held-out runs) as long with the other rank computing as
    without (``studies/validation_cpu/heldout/trace_contention.txt``), where the probe priced
    1.07x; and the 2-rank DP plans of 21 kept held-out runs, priced 3.4 % slow (signed median)
    with the probe's slowdown on every plan, read +0.5 % with this rule
    (``lockstep_contention.txt``). Past the cores the measured curve holds (ranks time-share the
    cores; nothing measured tells them apart there)."""
    tables = cluster.device.tables
    curve = ((tables.contention_optimizer if kind == "optimizer" else None)
             or (tables.contention_membound if kind in ("membound", "optimizer") else None) or tables.contention)
    on_host = _on_host(cluster, ranks)
    if kind == "membound" and not in_step and curve is not tables.contention and tables.cores:
        curve = _independent(curve, tables.contention, tables.cores)
    return curve_slowdown(curve, on_host)


def _independent(membound: RankCurve, gemm: RankCurve | None, cores: int) -> RankCurve:
    """``membound`` with its slowdown at up to ``cores`` ranks replaced by the GEMM's there."""
    return RankCurve(tuple((k, curve_slowdown(gemm, int(k)) if int(k) <= cores else v) for k, v in membound.values))


def curve_slowdown(curve: RankCurve | None, on_host: float) -> float:
    """A contention curve at ``on_host`` ranks computing at once on one host: linear between
    measured counts, growing with ranks past the largest (processor sharing); a measured
    slowdown below 1 (noise) is 1; no curve, or one rank: 1. ``host_contention`` and
    ``calibration.layer_terms`` (the memory-bound share of the layer's slowdown) read it."""
    if not curve or on_host <= 1:
        return 1.0
    return max(_per_ranks(curve, on_host, 1.0, beyond="scale"), 1.0)


def comm_interference(cluster: ClusterSpec, ranks: float) -> float:
    """Seconds of compute a rank loses per second of collective that runs while it computes.

    Calibrated CPU profiles carry ``comm_interference``: {ranks: measured (T_both - T_compute)
    / T_comm} with ``ranks`` ranks computing while all-reducing 4 MiB buffers in the background
    (``calibration.comm``), linear between counts, held beyond the largest. GPUs: the NCCL
    kernels' share of the SMs under the device's stack (``costs.stack.comm_compute_slowdown``;
    0 without one, and for uncalibrated CPU profiles). Dimensionless, >= 0."""
    curve = cluster.device.tables.comm_interference
    if not curve:
        return comm_compute_slowdown(cluster)
    on_host = _on_host(cluster, ranks)
    if on_host <= 1:
        return 0.0
    return max(_per_ranks(curve, on_host, 0.0, beyond="hold"), 0.0)


def message_cpu(cluster: ClusterSpec, ranks: float, nbytes: float = 0.0) -> tuple[float, float]:
    """(send, receive) CPU seconds of one pipeline message of ``nbytes`` when ``ranks`` ranks
    share the host.

    Calibrated CPU profiles carry ``p2p_send_cpu`` / ``p2p_recv_cpu`` (the fixed part) and
    ``p2p_cpu_per_byte`` (the copies: seconds per byte of one message, half on each side, the
    sender copying into the socket and the receiver out of it): {ranks: value}, measured on a
    line of ``ranks`` ranks that pass an activation on after each block of compute, at two
    message sizes (``calibration.p2p_cpu``). They count only where the ranks outnumber the
    host's cores (the profile's ``cores``): with a core per rank that CPU runs while its rank
    would wait anyway (the rest is in the measured send-receive latency); with fewer cores it is
    taken from the ranks that compute. Linear between counts, held beyond. Else (GPUs): (0, 0)."""
    tables = cluster.device.tables
    on_host = _beyond_cores(cluster, ranks)
    if on_host is None:
        return 0.0, 0.0
    send, recv, per_byte = (max(_per_ranks(c, on_host, 0.0, beyond="hold"), 0.0) if c else 0.0
                            for c in (tables.p2p_send_cpu, tables.p2p_recv_cpu, tables.p2p_cpu_per_byte))
    copy = 0.5 * per_byte * max(float(nbytes), 0.0)
    return send + copy, recv + copy


def message_hold(cluster: ClusterSpec, ranks: float) -> float:
    """Seconds an action that starts on a pipeline message from another rank starts late, beyond
    the transfer, when ``ranks`` ranks share the host (wall time, no CPU: the rank is not
    computing meanwhile, so the others get its core).

    With more ranks than cores a receive completes on gloo's thread, which must first be given a
    core, then wakes its rank, which must be given one too; under Linux's fair scheduler (EEVDF
    since 6.6) each may wait out a running rank's slice (0.75 ms x (1 + log2(CPUs)) per wait).
    Calibrated CPU profiles carry ``p2p_hold``: {ranks: seconds}, each receive's return less
    max(its call, the matching send's call) on the line of ``calibration.p2p_cpu``, less the same
    where the ranks fit on the cores (``calibration.tables.message_hold_curve``). On this
    project's 2-vCPU AMD VM the executor's 4-rank interleaved pipeline started each such action
    1.7-3.2 ms after its input was sent, 0.25 ms on 2 ranks (``studies/validation_cpu/
    oversubscribed_pipeline.txt``). Counted only where the ranks outnumber the profile's
    ``cores``; linear between measured counts, held beyond the largest. Else (GPUs): 0."""
    tables = cluster.device.tables
    on_host = _beyond_cores(cluster, ranks)
    if on_host is None or not tables.p2p_hold:
        return 0.0
    return max(_per_ranks(tables.p2p_hold, on_host, 0.0, beyond="hold"), 0.0)


def send_hold(cluster: ClusterSpec, ranks: float) -> float:
    """Seconds a pipeline send's call holds its rank's thread (wall time) when ``ranks`` ranks
    share the host, beyond the CPU ``message_cpu`` charges for it: the rank computes on after the
    call returns. gloo's ``isend`` writes the message in the calling thread when it can and waits
    on the pair's lock while the pair's I/O thread holds it; with more ranks than cores that
    thread may wait for a core. Measured as 0.23-0.32 ms a 128 KiB send on 2 ranks (nearly all
    the copy's CPU, which nothing else charges where a rank has its core) and 0.95-1.03 ms on 4
    over 2 cores, 0.17-0.20 ms of it CPU (``studies/validation_cpu/send_call.txt``, a Zen 4 VM,
    2026-12-02). Calibrated CPU profiles carry ``p2p_send_hold``: {ranks: seconds}
    (``calibration.tables.send_hold_curve``), linear between counts, held beyond the largest, at
    every count of ranks. Else (GPUs: a send is a kernel launched on its own stream): 0."""
    curve = cluster.device.tables.p2p_send_hold
    if not curve:
        return 0.0
    return max(_per_ranks(curve, _on_host(cluster, ranks), 0.0, beyond="hold"), 0.0)


def _on_host(cluster: ClusterSpec, ranks: float) -> float:
    """How many of ``ranks`` ranks share one host (``devices_per_node`` of them at most)."""
    return min(float(ranks), float(cluster.devices_per_node))


def _beyond_cores(cluster: ClusterSpec, ranks: float) -> float | None:
    """``_on_host`` where those ranks outnumber the calibrated host's ``cores``, else None (a
    core per rank, a GPU, an uncalibrated profile): the pipeline-message costs count only then."""
    on_host, cores = _on_host(cluster, ranks), cluster.device.tables.cores
    return on_host if cores and on_host > cores else None


def _per_ranks(curve: RankCurve, ranks: float, at_one: float, beyond: str) -> float:
    """A per-rank-count curve at ``ranks`` (may be fractional): linear between measured
    counts (``at_one`` at 1 rank); past the largest, ``beyond`` = "scale" (grows with ranks:
    processor sharing) or "hold" (the last value)."""
    points = sorted({1: at_one, **{k: float(v) for k, v in curve.values}}.items())
    for (k0, v0), (k1, v1) in zip(points, points[1:]):
        if ranks <= k1:
            return v0 + (v1 - v0) * (ranks - k0) / (k1 - k0)
    k, v = points[-1]
    return v * ranks / k if beyond == "scale" else v


@dataclass(frozen=True)
class HostModel:
    """The host the ``ranks`` ranks of one plan run on (``devices_per_node`` share one)."""
    cluster: ClusterSpec
    ranks: int
    in_step: bool = True           # the ranks run op by op in step (``lockstep``)
    # slowdown by ranks computing: the processor-sharing law asks it at every job start and end
    _slowdowns: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def slowdown(self, computing: float) -> ComputeScale:
        """(GEMM, memory-bound, optimizer) slowdown with ``computing`` ranks computing at once."""
        scale = self._slowdowns.get(computing)
        if scale is None:
            scale = self._slowdowns[computing] = ComputeScale(
                *(host_contention(self.cluster, computing, kind, self.in_step) for kind in ("gemm", "membound", "optimizer")),
                rank_cache_bytes(self.cluster, self.ranks))
        return scale

    @property
    def shared(self) -> bool:
        """Do the ranks slow each other down (a calibrated CPU host)? False on GPUs. Read from
        the measured curves whether or not the ranks run in step."""
        return dataclasses.replace(self, in_step=True).slowdown(self.ranks) != ComputeScale()

    @property
    def interference(self) -> float:
        """``comm_interference`` at the plan's ranks (0 on GPUs)."""
        return comm_interference(self.cluster, self.ranks)

    def message_seconds(self, received: int, sent: int, nbytes: float = 0.0) -> float:
        """CPU seconds an action's pipeline messages (``costs.placement.remote_messages``) of
        ``nbytes`` each take from the host's cores (``message_cpu``; 0 on GPUs and with a core per
        rank). Charged as GEMM-like work of the action's processor-sharing job (the SimPy
        engine's whole actions, the partitioner's replay); actions played segment by segment (TP
        peers, ZeRO-3) take the mean-field slowdown instead, which leaves it out."""
        send, recv = message_cpu(self.cluster, self.ranks, nbytes)
        return received * recv + sent * send

    @property
    def message_hold(self) -> float:
        """``message_hold`` at the plan's ranks (0 on GPUs and with a core per rank)."""
        return message_hold(self.cluster, self.ranks)

    @property
    def send_hold(self) -> float:
        """``send_hold`` at the plan's ranks (0 on GPUs)."""
        return send_hold(self.cluster, self.ranks)

    def action_send_hold(self, plan: Any, leaves: Any) -> float:
        """Seconds one action's send calls hold its rank after it (``leaves``: (virtual stage,
        kind) pairs, as ``action_message_seconds``): ``send_hold`` per output that goes to another
        rank (``costs.placement.remote_messages``)."""
        call = self.send_hold
        return call * sum(remote_messages(plan, stage, kind)[1] for stage, kind in leaves) if call > 0 else 0.0

    def action_message_seconds(self, plan: Any, leaves: Any, boundary_bytes: Callable[[int], float]) -> float:
        """``message_seconds`` of one action's passes (``leaves``: (virtual stage, kind) pairs;
        an overlapped F&B slot has two): F receives boundary s - 1's activations and sends
        boundary s's, B and I the other way; ``boundary_bytes(k)`` is what crosses boundary k
        (stage k to k + 1)."""
        total = 0.0
        for stage, kind in leaves:
            received, sent = remote_messages(plan, stage, kind)
            inward, outward = (stage - 1, stage) if kind == "F" else (stage, stage - 1)
            if received:
                total += self.message_seconds(received, 0, boundary_bytes(inward))
            if sent:
                total += self.message_seconds(0, sent, boundary_bytes(outward))
        return total

    @property
    def ranks_on_host(self) -> int:
        """Ranks of the plan on one host, for in-situ collective prices that depend on it."""
        return min(self.ranks, self.cluster.devices_per_node)

    def sharing(self, ranks_per_job: float) -> SharingLaw:
        """The sharing law of a host whose jobs each stand for ``ranks_per_job`` identical
        ranks: n jobs computing at once -> their (GEMM, memory-bound, optimizer) slowdown at
        n * ranks_per_job ranks (``slowdown``)."""
        def law(n: int) -> tuple[float, float, float]:
            s = self.slowdown(n * ranks_per_job)
            return s.gemm, s.membound, s.optimizer
        return law

    def processor_sharing(self, clock: "Clock", ranks_per_job: float) -> "ProcessorSharing":
        """Jobs on this host played out instant by instant on ``clock`` (a SimPy environment)."""
        return ProcessorSharing(clock, self.sharing(ranks_per_job))

    def settle(self, busy_s: float, step_s: float, now: ComputeScale) -> ComputeScale | None:
        """One step of the mean-field fixed point: ranks slow each other down only while they
        compute at once, so the slowdown is the one at the average number of ranks computing,
        ``busy_s`` (rank-seconds of compute in a step, all ranks) / ``step_s``. Returns the
        next scale to try, damped halfway (the busy fraction itself grows with the slowdown),
        or None once the target is within 1% of ``now`` (or the step is empty)."""
        if step_s <= 0:
            return None
        target = self.slowdown(max(busy_s / step_s, 1.0))
        if all(abs(t - n) <= 0.01 * n for t, n in ((target.gemm, now.gemm), (target.membound, now.membound),
                                                     (target.optimizer, now.optimizer))):
            return None
        return ComputeScale(0.5 * (now.gemm + target.gemm), 0.5 * (now.membound + target.membound),
                            0.5 * (now.optimizer + target.optimizer), target.cache_bytes)


# ----------------------------------------------------------------------------- owed compute

@dataclass(eq=False)
class ComputeLedger:
    """One rank's compute owed to work that ran beside it, paid before its next compute:
    ``interference`` x the compute a collective overlapped (CPU hosts), and work a side
    stream leaves to the compute (FSDP2's copies on GPUs). Keeps the rank's recent compute
    intervals to find the overlap."""
    interference: float = 0.0
    busy_log: list = field(default_factory=list)
    busy_since: float | None = None      # start of the compute running now
    debt: float = 0.0                    # seconds owed

    def busy_between(self, t0: float, t1: float) -> float:
        """Seconds this rank computed in [t0, t1] (recent intervals only)."""
        total = sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in self.busy_log)
        if self.busy_since is not None:
            total += max(0.0, t1 - max(t0, self.busy_since))
        return total

    def computed(self, start: float, end: float) -> None:
        self.busy_since = None
        self.busy_log.append((start, end))
        if len(self.busy_log) > 64:
            del self.busy_log[:32]

    def collective(self, start: float, end: float) -> None:
        """A collective of this rank ran over [start, end]: the compute it overlapped is
        delayed by ``interference`` x the overlap."""
        if self.interference > 0 and end > start:
            self.debt += self.interference * self.busy_between(start, end)

    def owe(self, seconds: float) -> None:
        self.debt += seconds

    def pay(self) -> float:
        owed, self.debt = self.debt, 0.0
        return owed
