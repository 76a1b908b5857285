"""The SimPy engine: one process per simulated device, walking its Schedule-IR actions.

``simulate(model, cluster, plan)`` plays one training step. Each device process (``device.device``) runs its
pipeline rank's actions in order; an action waits for its input (activations of the previous stage for F, gradients
of the next stage for B/I), sent (``Simulation.send``) over the sender's NVLink port (same node) or NIC; after the
rank's last backward of each stage its gradients are synchronised over DP (``dp``; ZeRO-2 and ZeRO-3 reduce-scatter
them in every backward instead, ``actions``), then the optimizer steps.

Speed: an action whose inside touches nothing shared takes a single ``env.timeout`` of its duration (and of the wait
for its input, when that input's arrival is already known), priced once per distinct (stage, kind, slowdown) by
``compute.action_cost`` and reused for every microbatch; the weight-gradient readiness times of the last backward
are timeouts at precomputed offsets; links are FIFO reservations (``network``). Only actions with something to
interleave inside (TP collectives that wait for peers or share a link, ZeRO-3 gathers) are stepped segment by
segment (``actions``).

CPU hosts (calibrated profiles with a contention table): ranks share the host's cores (``costs.host.HostModel``).
When no action is stepped, actions and optimizer steps are jobs of a ``ProcessorSharing`` host whose speed follows
how many ranks compute at that instant; otherwise every rank computes at a mean-field slowdown
(``HostModel.settle``, iterated by ``simulate``). With more ranks than cores a job also holds its pipeline
messages' CPU (``HostModel.message_seconds``); a send's call holds its rank (``HostModel.send_hold``). Collectives
run while a rank computes take ``comm_interference`` x the overlap from its compute, paid before its next action
(``Device.ledger``). GPUs: no sharing; the interference is the stack's NCCL-on-SM slowdown (``costs.stack``).

Modes: ``representative`` simulates one device per pipeline rank (DP rank 0, TP rank 0: DP replicas and TP peers do
identical work; DESIGN.md), collectives costed for the full groups, slowdowns of its simulated ranks applied to the
peers each stands for. ``full`` plays every device, collectives waiting for all members, per-rank compute
``slowdown`` factors (straggler what-ifs), one device simulated per class of identical ranks (``symmetry``: indices
no slowdown or link tells apart) and copied to its class with the rank-by-rank numbers (a class with one TP member
takes representative mode's one-timeout actions: ~1e-13 relative from the stepped sums);
``simulate(symmetric=False)`` plays every rank by itself. Degraded links (``link_slowdown``, {global rank: factor}):
every transfer over the NIC of such a rank takes ``factor`` x longer: its pipeline sends and receives over the NIC,
and every inter-node collective of a group it belongs to (a ring runs at its slowest link's pace: Patarasuk & Yuan
2009, bandwidth-optimal all-reduce). Intra-node links are not affected.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import simpy

from parsim.costs import (embedding_params, head_params, layer_params, p2p_bytes, p2p_holds_sender, stage_params,
                          plan_state_bytes, zero3_gather_bytes_per_layer, zero3_reduce_scatter_bytes_per_layer)
from parsim.costs.fsdp2 import uses_fsdp2
from parsim.costs.host import ComputeLedger, ComputeScale, HostModel, ProcessorSharing, lockstep, rank_cache_bytes
from parsim.costs.optimizer import (layer_from_host_s, layer_shard_bytes, rank_tensor_sizes, rank_tensors,
                                   tied_embedding_sync)
from parsim.costs.placement import loop_placed, rank_of_stage, remote_messages, stages_of_rank
from parsim.costs.stack import zero_unit_time
from parsim.costs.timing import collective_time, p2p_time
from parsim.costs.zero import gathers_layers, scatters_every_backward
from parsim.schedules import OVERLAP_F_B, Action, Schedule
from parsim.specs import ClusterSpec, ModelSpec, Plan, RankLayout

from .compute import ActionCost, action_cost, overlap_cost, stage_shapes
from .device import device
from .dp import gradient_sync
from .memory import MemoryTimeline, footprints_apart, optimizer_step_bytes, reduce_scatter_copies, static_bytes, unmade_grads
from .network import Arrival, Communicator, Ports, device_ports, group_link, group_shape, link_between, ps_time
from .record import SEND_B, SEND_F, Recorder
from .symmetry import RankClasses, every_rank, full_mode_classes

MODES = ("representative", "full")


@dataclass(eq=False)
class Device:
    """One simulated device: its place in the layout, its actions and its resources."""
    rank: int
    pp_rank: int
    replica: tuple[int, int]              # (dp_rank, tp_rank)
    actions: tuple[Action, ...]           # overlapped F&B slots as ("F&", slot index, None)
    scale: ComputeScale                   # compute slowdown factors (stragglers x host contention)
    ledger: ComputeLedger                 # compute owed to collectives and side streams (``costs.host``)
    stepped: bool                         # run actions segment by segment
    ports: Ports
    tp: Communicator
    dp: Communicator
    memory: MemoryTimeline
    compute: simpy.Resource               # compute stream (sub-pipelined TP halves share it)
    tp_stream: simpy.Resource
    dp_stream: simpy.Resource             # ZeRO-3 gathers, ZeRO-2/3 reduce-scatters, in issue order
    compute_done: simpy.Event
    last_backward: dict[int, int]         # action index -> stage whose gradients it completes
    sync_order: list[int]                 # stages in the order their gradients complete
    grads_started: dict[int, simpy.Event] = field(default_factory=dict)
    sync: simpy.Process | None = None
    run: object = None                    # the stepped action whose last gradients await its send
    overlaps: tuple = ()                  # the OverlapFB items of ``actions``, by slot index
    pending_dp: list = field(default_factory=list)
    embedding: Communicator | None = None  # the tied embedding's group (first and last pipeline rank)
    costs: dict = field(default_factory=dict)             # (stage, kind) -> ActionCost
    routes: dict = field(default_factory=dict)            # stage sent to -> (port, seconds)


class Simulation:
    """Everything one simulated step shares: specs, derived costs, devices, deliveries."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, plan: Plan, schedule: Schedule, mode: str,
                 slowdown: dict[int, float], recorder: Recorder, contention: ComputeScale | None = None,
                 link_slowdown: dict[int, float] | None = None, symmetric: bool = True,
                 host_busy: float | None = None):
        self.link_slowdown = dict(link_slowdown or {})      # rank -> factor on its NIC transfers
        # share of the step the host's ranks compute (the mean-field iteration's; None: always),
        # which scales a shared host's in-situ TP premium (``CollectiveFit.shared_alpha``)
        self.host_busy = host_busy
        self.env = simpy.Environment(initial_time=0.0)
        # ranks sharing a host's cores (calibrated CPU profiles) compute slower; GPUs: identity
        self.host = HostModel(cluster, plan.world_size, lockstep(plan))
        # CPU hosts: collectives running while a rank computes take compute time from it
        self.interference = self.host.interference
        self.model, self.cluster, self.plan, self.schedule, self.mode = model, cluster, plan, schedule, mode
        self.recorder, self.layout = recorder, RankLayout(plan.dp, plan.tp, plan.pp)
        self.num_stages = plan.pp * plan.vpp
        self.shapes = stage_shapes(model, plan)
        fsdp2 = uses_fsdp2(cluster)     # ZeRO-2/3 as FSDP2 runs them (costs.fsdp2)
        # and as a rank's first backward holds them, where its FSDP2 gradient shards are made by it
        self.footprints, firsts = footprints_apart(model, plan, fsdp2, reduce_scatter_copies(cluster))
        self.first_footprints = firsts if firsts is not None else self.footprints
        # per pipeline rank: (parameter bytes released, temporaries held) while its optimizer steps
        self.step_bytes = optimizer_step_bytes(model, plan, fsdp2)
        self.state = plan_state_bytes(plan)
        self.rank_params, self.rank_optimizer_tensors = stage_params(model, plan), rank_tensors(cluster, model, plan)
        self.rank_optimizer_sizes = rank_tensor_sizes(cluster, model, plan)
        self.layer_params = layer_params(model, plan.tp)
        self.tied = tied_embedding_sync(model, plan)       # the tied embedding's gradient all-reduce
        self.edge_params = [(embedding_params(model, plan) if s == 0 else 0.0,
                             head_params(model, plan) if s == self.num_stages - 1 else 0.0)
                            for s in range(self.num_stages)]
        self.p2p_nbytes = p2p_bytes(model, plan)
        self.p2p_blocking = p2p_holds_sender(plan)     # a send holds its sender (``Stack.p2p_blocking``)
        # (stage, kind) of an action whose input crosses ranks (``costs.placement.remote_messages``) -> its late start
        # where the ranks outnumber the cores (``costs.host.message_hold``); whose output does -> its send calls' hold
        hold = self.host.message_hold
        self.input_hold = {(s, kind): hold for s in range(plan.pp * plan.vpp) for kind in ("F", "B", "I")
                           if remote_messages(plan, s, kind)[0]} if hold > 0 else {}
        self.output_hold = {(s, kind): t for s in range(plan.pp * plan.vpp) for kind in ("F", "B", "I")
                            if (t := self.host.action_send_hold(plan, [(s, kind)]))}
        self.zero3_gathers = gathers_layers(plan.zero, plan.dp)
        # ZeRO-2: every backward reduce-scatters its gradients part by part (``actions.zero2_scatters``)
        self.zero2_scatters = scatters_every_backward(plan.zero, plan.dp, plan.dp_impl == "ps")
        self.zero3_gather_bytes = zero3_gather_bytes_per_layer(model, plan)
        self.zero3_scatter_bytes = zero3_reduce_scatter_bytes_per_layer(model, plan)
        # ZeRO-2/3 as the reference executor runs them (FSDP2, profile keys; ``actions``):
        # collectives waited for in place where FSDP2 has no side streams (CPU), and the
        # copy-in / copy-out of its flat communication buffers on the compute stream
        self.zero_blocking = cluster.device.tables.zero_blocking
        self.zero_copies = fsdp2
        self.param_shard_bytes = layer_shard_bytes(model, plan)
        self.param_h2d_s = layer_from_host_s(cluster, model, plan)
        self.num_events = 0
        self.deliveries: dict[tuple, Arrival | tuple[float, float]] = {}   # sent, not yet received
        self._costs: dict[tuple, ActionCost] = {}
        self._comm: dict[tuple, float] = {}
        self._zero_units: dict[tuple, tuple[float, float, float]] = {}
        self._solo: dict[tuple, tuple[float, float, float]] = {}
        self._overlapped: dict[int, float] = {}
        # a given scale (the mean-field iteration's), else decided by ``_share_host``; GPUs: identity
        # (a shared host's: its memory-bound ops split by what fits in a rank's cache, ``ComputeScale``)
        self.contention = (ComputeScale(cache_bytes=rank_cache_bytes(cluster, plan.world_size)) if self.host.shared
                           else ComputeScale()) if contention is None else contention
        self.sharing: ProcessorSharing | None = None      # whole actions as jobs on a shared host
        self.classes = self._rank_classes(slowdown, symmetric)
        self.devices = self._build_devices(slowdown)
        if contention is None and self.host.shared:
            self._share_host(slowdown)

    # ------------------------------------------------------------------ set-up

    def _share_host(self, slowdown: dict[int, float]) -> None:
        """Ranks share the host's cores: processor sharing when no action is stepped; else the
        slowdown at all ranks computing (``simulate`` then iterates a mean-field one)."""
        world = self.plan.world_size
        if any(d.stepped for d in self.devices.values()):
            self.contention = self.host.slowdown(world)
            for d in self.devices.values():
                d.scale = self.contention.times(float(slowdown.get(d.rank, 1.0)))
        else:
            per_device = world / len(self.devices)   # identical ranks a device stands for
            self.sharing = self.host.processor_sharing(self.env, per_device)

    def _rank_classes(self, slowdown: dict[int, float], symmetric: bool) -> RankClasses:
        """The devices to simulate: representative mode's one per pipeline rank; full mode's one
        per class of identical ranks (``symmetry``), or every rank (``symmetric=False``, and
        where the rank-by-rank run is not symmetric itself: ``symmetry.exact``, shared hosts)."""
        if self.mode != "full":
            return every_rank([self.layout.rank(p, 0, 0) for p in range(self.plan.pp)])
        return full_mode_classes(self.cluster, self.plan, slowdown, self.link_slowdown, symmetric)

    def _build_devices(self, slowdown: dict[int, float]) -> dict[int, Device]:
        plan, layout, env = self.plan, self.layout, self.env
        ranks = list(self.classes.simulated)
        simulated = set(ranks)
        ports = {r: device_ports() for r in ranks}
        comms: dict[tuple, Communicator] = {}

        def communicator(name: str, group: list[int]) -> Communicator:
            key = (name, tuple(group))
            if key not in comms:
                link = group_link(self.cluster, group)
                members = tuple(r for r in group if r in simulated)
                comms[key] = Communicator(name, tuple(group), members,
                                          tuple(getattr(ports[m], link) for m in sorted(members)), link,
                                          group_shape(self.cluster, group), self._nic_factor(link, group))
            return comms[key]

        devices = {}
        contention = self.contention
        for r in ranks:
            p, d, t = layout.coords(r)
            tp = communicator("tp", [layout.rank(p, d, x) for x in range(plan.tp)])
            dp = communicator("dp", [layout.rank(p, x, t) for x in range(plan.dp)])
            actions, overlaps = _device_actions(self.schedule.actions[p])
            last_bwd = {}
            for i, (kind, stage, _) in enumerate(actions):
                if kind in ("B", "W"):
                    last_bwd[stage] = i
                elif kind == "F&" and overlaps[stage].backward.kind == "B":
                    last_bwd[overlaps[stage].backward.stage] = i
            self.recorder.add_rank(r)
            tied = self.tied is not None and p in (self.tied.first, self.tied.last)
            devices[r] = Device(
                rank=r, pp_rank=p, replica=(d, t), actions=actions, overlaps=overlaps, scale=contention.times(float(slowdown.get(r, 1.0))),
                ledger=ComputeLedger(self.interference),
                stepped=self._needs_steps(r, tp, dp), ports=ports[r], tp=tp, dp=dp,
                memory=MemoryTimeline.starting_with(static_bytes(self.model, plan, p, self.zero_copies),
                                                    unmade_grads(self.model, plan, p, self.zero_copies)),
                compute=simpy.Resource(env, 1), tp_stream=simpy.Resource(env, 1), dp_stream=simpy.Resource(env, 1),
                compute_done=env.event(), last_backward={i: s for s, i in last_bwd.items()},
                sync_order=sorted(last_bwd, key=last_bwd.get),
                embedding=communicator("embedding", [layout.rank(x, d, t) for x in (self.tied.first, self.tied.last)])
                if tied else None)
        return devices

    def _nic_factor(self, link: str, ranks) -> float:
        """Time factor of transfers over ``link`` among ``ranks``: the slowest degraded NIC."""
        if link != "nic" or not self.link_slowdown:
            return 1.0
        return max(self.link_slowdown.get(r, 1.0) for r in ranks)

    def _needs_steps(self, rank: int, tp: Communicator, dp: Communicator) -> bool:
        """Step through actions when something inside them meets other processes."""
        plan = self.plan
        if self.zero3_gathers:
            return True
        if plan.tp == 1:
            return False
        if len(tp.members) > 1:
            return True                     # TP collectives wait for peers simulated apart (full mode)
        # TP collectives share their link with this device's pipeline sends or DP traffic
        p, d, t = self.layout.coords(rank)
        wrap = plan.vpp > 1                 # interleaving sends from the last rank to the first
        neighbours = [q % plan.pp for q in (p - 1, p + 1) if plan.pp > 1 and (wrap or 0 <= q < plan.pp)]
        if not loop_placed(plan):           # the ranks holding the stages next to this rank's
            last = plan.pp * plan.vpp - 1
            neighbours = sorted({rank_of_stage(plan, x) for s in stages_of_rank(plan, p) for x in (s - 1, s + 1)
                                 if 0 <= x <= last} - {p})
        others = {link_between(self.cluster, rank, self.layout.rank(q, d, t)) for q in neighbours}
        if plan.dp > 1:
            others.add(dp.link)
        return tp.link in others

    def start(self) -> None:
        for dev in self.devices.values():
            if self.plan.dp > 1 and not (self.zero3_gathers or self.zero2_scatters):
                dev.grads_started = {s: self.env.event() for s in dev.sync_order}
                dev.sync = self.env.process(gradient_sync(self.env, self, dev))
            self.env.process(device(self.env, self, dev))

    # ------------------------------------------------------------------ costs

    def cost(self, dev: Device, stage: int, kind: str) -> ActionCost:
        c = dev.costs.get((stage, kind))
        if c is None:
            key = (stage, kind, dev.scale, dev.tp.shape, dev.tp.link_factor)
            c = self._costs.get(key)
            if c is None:
                c = self._costs[key] = self._price(dev, stage, kind, dev.scale)
            dev.costs[(stage, kind)] = c
        return c

    def _price(self, dev: Device, stage, kind: str, scale: ComputeScale) -> ActionCost:
        """An action's cost; an overlapped slot's ``stage`` is (forward stage, backward stage) and
        its kind ``F&`` + the backward's kind."""
        if kind.startswith("F&"):
            f_stage, b_stage = stage
            return overlap_cost(self._price(dev, f_stage, "F", scale), self._price(dev, b_stage, kind[2:], scale),
                                self.shapes[b_stage], self.layer_params, self.edge_params[b_stage])
        if stage == 0 and kind in ("I", "W"):
            # no input gradient on the first stage: its I runs nothing, its W the whole backward
            # (torch 2.13's PipelineStage; ``costs.split_backward``)
            full = self._price(dev, 0, "B", scale)
            if kind == "W":
                return replace(full, kind="W")
            return replace(full, kind="I", prologue=(), halves=((),), layers=(), epilogue=(), placed=(),
                           duration=0.0, exposed_tp=0.0, flops=0.0, grads_ready=())
        return action_cost(self.model, self.cluster, self.plan, self.shapes[stage], kind,
                           lambda op, nbytes, block=None: self.comm_time(dev.tp, op, nbytes, in_situ=True,
                                                                         block_s=block, tp=True), self.layer_params,
                           self.edge_params[stage], scale)

    def solo_seconds(self, dev: Device, stage: int, kind: str) -> tuple[float, float, float]:
        """(fixed, GEMM, memory-bound) seconds of an action computing alone on the host: the
        action priced with each kind's compute doubled in turn gives that kind's share; the CPU
        its pipeline messages take from a host with fewer cores than ranks joins the GEMM share."""
        key = (stage, kind, dev.scale, dev.tp.shape, dev.tp.link_factor)
        out = self._solo.get(key)
        if out is None:
            base, g, m = self.cost(dev, stage, kind).duration, dev.scale.gemm, dev.scale.membound
            gemm = self._price(dev, stage, kind, replace(dev.scale, gemm=2 * g)).duration - base
            membound = self._price(dev, stage, kind, replace(dev.scale, membound=2 * m)).duration - base
            # its pipeline messages' CPU, shared as compute is (``HostModel.message_seconds``)
            halves = tuple(zip(stage, ("F", kind[2:]))) if kind.startswith("F&") else ((stage, kind),)
            messages = self.host.action_message_seconds(self.plan, halves, lambda _: self.p2p_nbytes)
            out = self._solo[key] = (max(base - gemm - membound, 0.0), gemm + messages, membound)
        return out

    def comm_time(self, comm: Communicator, op: str, nbytes: float, in_situ: bool = False,
                  block_s: float | None = None, tp: bool = False) -> float:
        """``collective_time`` memoised; ``in_situ`` for the synchronous TP collectives (with
        the plan's ranks per node sharing the host, after ``block_s`` of compute; ``tp``: a TP
        collective, whose shared premium follows the step's computing share, ``host_busy``) and
        blocking ZeRO ones."""
        key = (comm.shape, op, nbytes, in_situ, comm.link_factor, block_s, tp)
        t = self._comm.get(key)
        if t is None:
            host = self.host.ranks_on_host if in_situ else None
            t = collective_time(self.cluster, op, nbytes, list(comm.ranks), in_situ, host, block_s,
                                self.host_busy if in_situ and tp else None)
            t = self._comm[key] = t * comm.link_factor if comm.link_factor != 1.0 else t
        return t

    def zero_unit(self, comm: Communicator, op: str, nbytes: float) -> tuple[float, float, float]:
        """``costs.stack.zero_unit_time`` of one ZeRO unit's collective over ``comm``, memoised
        (every layer of every action asks it)."""
        key = (comm.shape, op, nbytes, comm.link_factor)
        out = self._zero_units.get(key)
        if out is None:
            out = self._zero_units[key] = zero_unit_time(
                self.cluster, op, nbytes, self.plan.dp, lambda in_situ: self.comm_time(comm, op, nbytes, in_situ=in_situ))
        return out

    def ps_time(self, comm: Communicator, nbytes: float) -> float:
        t = ps_time(self.cluster, nbytes, list(comm.ranks))
        return t * comm.link_factor if comm.link_factor != 1.0 else t

    def overlapped_tp(self, cost: ActionCost) -> float:
        """Seconds of an action's TP collectives that its compute covers (placed actions)."""
        key = id(cost)
        out = self._overlapped.get(key)
        if out is None:
            comm = sum(p.end - p.start for p in cost.placed if p.segment.stream != "compute")
            out = self._overlapped[key] = max(comm - cost.exposed_tp, 0.0)
        return out

    # ------------------------------------------------------------------ pipeline p2p

    def send(self, dev: Device, key: tuple, to_stage: int, microbatch: int) -> float:
        """Send an action's output (activations or input gradients) to the stage that needs
        it: the transfer is queued on the sender's port; a receiver already waiting gets one
        event at the arrival, else the arrival time is left for it (no event at all). Returns
        the arrival time (what a blocking stack's sender waits for)."""
        route = dev.routes.get(to_stage)
        if route is None:
            dst = self.layout.rank(rank_of_stage(self.plan, to_stage), *dev.replica)
            duration = p2p_time(self.cluster, self.p2p_nbytes, dev.rank, dst) if dst != dev.rank else 0.0
            link = link_between(self.cluster, dev.rank, dst)
            if link == "nic" and self.link_slowdown:
                duration *= self._nic_factor("nic", (dev.rank, dst))
            port = None if dst == dev.rank else getattr(dev.ports, link)
            route = dev.routes[to_stage] = (port, duration)
        port, duration = route
        now = self.env.now
        # a stage handing over to another stage on the same device (the turn of a V) sends nothing
        start = port.reserve(now, duration) if port is not None else now
        k = (dev.replica, key)
        waiting = self.deliveries.pop(k, None)
        if waiting is None:
            self.deliveries[k] = (start + duration, start)
        else:
            waiting.arrive(start + duration - now, start)
        if self.recorder.keep_events and duration > 0:
            self.recorder.rows.append((dev.rank, key[1], "pp", "send", microbatch, -1, start, start + duration,
                                       self.p2p_nbytes, 0.0, SEND_F if key[0] == "act" else SEND_B))
        return start + duration


def _device_actions(order) -> tuple[tuple, tuple]:
    """A rank's actions as (kind, stage, microbatch) triples for the device loop, each overlapped
    F&B slot as ("F&", its index in the second list, None)."""
    overlaps = [item for item in order if item.kind == OVERLAP_F_B]
    if not overlaps:
        return tuple(order), ()
    out, k = [], 0
    for item in order:
        if item.kind == OVERLAP_F_B:
            out.append(("F&", k, None))
            k += 1
        else:
            out.append(item)
    return tuple(out), tuple(overlaps)
