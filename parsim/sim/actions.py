"""Stepping through one action segment by segment, where its inside must interleave with
other processes: TP collectives that wait for their peers (``full`` mode) or share a link
with other traffic, and ZeRO-3 parameter gathers (prefetched one layer ahead) and gradient
reduce-scatters (Rajbhandari et al. 2020, Sec. 7; DeepSpeed ``stage3`` prefetching).
ZeRO-2's per-microbatch gradient reduce-scatters (``zero2_scatters``) run beside any action,
stepped or not.

Actions with nothing to interleave take one ``env.timeout`` of their precomputed duration
(``device.start_whole``); this module is the slow, exact path for the rest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import simpy

from parsim.costs.placement import stages_of_rank
from parsim.specs import stage_layers

from .compute import ActionCost, Segment, segment_key, uncovered
from .network import collective, transfer, until

if TYPE_CHECKING:
    from .engine import Device, Simulation


@dataclass
class ActionRun:
    """Book-keeping of one stepped action."""
    sim: "Simulation"
    dev: "Device"
    cost: ActionCost
    microbatch: int
    grad_events: dict = field(default_factory=dict)       # trigger key -> Event (last backward of a stage)
    remaining: dict = field(default_factory=dict)         # segment key -> compute segments still to run
    gathers: dict = field(default_factory=dict)           # layer -> gather Process (ZeRO-3)
    layer_order: list = field(default_factory=list)
    comm: list = field(default_factory=list)              # TP intervals (s)
    cover: list = field(default_factory=list)             # compute intervals (s)
    left: int = 0                                         # compute segments still to run
    final: list = field(default_factory=list)             # gradient events completed by the last segment

    def __post_init__(self) -> None:
        for chain in (self.cost.prologue, *self.cost.halves, self.cost.epilogue):
            for s in chain:
                if s.stream == "compute":
                    k = segment_key(s)
                    self.remaining[k] = self.remaining.get(k, 0) + 1
                    self.left += 1
        # the layers in the order the chains visit them (an overlapped slot: the forward's, then
        # the backward's; sub-pipelined halves visit the same layers)
        seen = dict.fromkeys(s.layer for chain in self.cost.halves for s in chain if s.layer >= 0)
        self.layer_order = list(seen)

    def release_final_gradients(self) -> None:
        """Fire the gradient events the action's last segment completed, after its pipeline send
        (the order the one-timeout path gives them)."""
        for ev in self.final:
            ev.succeed()


def run_stepped(env: simpy.Environment, run: ActionRun):
    """The action's segments as SimPy events: prologue, the layers (with sub-pipelined TP, per
    layer two concurrent halves that join at the layer's end), epilogue; under ZeRO-3 wrapped in
    the stage's root unit's gather and reduce-scatter (``_root_unit_params``)."""
    cost = run.cost
    root = _root_unit_params(run)
    if root:
        # the root unit (embedding / final norm + head) is gathered before anything runs: FSDP's
        # root pre-forward and pre-backward hooks; ZeRO-3 partitions every parameter
        # (Rajbhandari et al. 2020, Sec. 5.3), not only the transformer layers'
        h2d = run.sim.param_h2d_s * root / run.sim.layer_params if run.sim.layer_params else 0.0
        yield env.process(zero3_collective(env, run.sim, run.dev, "all_gather", root * run.sim.state.param,
                                           "zero_allgather", cost.stage, run.microbatch, -1, h2d=h2d))
    yield from _walk(env, run, cost.prologue, None)
    if len(cost.halves) == 1:
        yield from _walk(env, run, cost.halves[0], None)
    else:
        for group in cost.layers:
            yield env.all_of([env.process(_walk(env, run, chain, h)) for h, chain in enumerate(group)])
    yield from _walk(env, run, cost.epilogue, None)
    scattered = _root_unit_params(run, backward_only=True)
    if scattered:
        # ... and its gradients reduce-scattered once the whole backward is done (FSDP's root
        # post-backward, after the embedding's backward on the first stage)
        scatter = env.process(zero3_collective(env, run.sim, run.dev, "reduce_scatter", scattered * run.sim.state.grad,
                                               "zero_reducescatter", cost.stage, run.microbatch, -1))
        run.dev.pending_dp.append(scatter)
        if run.sim.zero_blocking:
            waited = env.now
            yield scatter
            run.sim.recorder.expose(run.dev.rank, "dp", env.now - waited)
    run.sim.recorder.expose(run.dev.rank, "tp", uncovered(run.comm, run.cover))


def _root_unit_params(run: ActionRun, backward_only: bool = False) -> float:
    """ZeRO-3: parameters of the stage's root unit (its embedding and / or final norm + head;
    0 on a stage with neither) that a forward or backward gathers (``backward_only``: that a
    backward reduce-scatters after it); an overlapped slot gathers both stages' and scatters
    its backward's (but an I's). A split backward: I gathers the unit (the head's input gradient
    needs its weight), W reduce-scatters its gradients after it; on the first stage I runs
    nothing and W is the whole backward, so W does both (``_first_stage_split``). 0 without
    ZeRO-3."""
    kind, sim = run.cost.kind, run.sim
    if not sim.zero3_gathers:
        return 0.0
    own = float(sum(sim.edge_params[run.cost.stage]))
    if kind in ("F", "B"):
        return 0.0 if backward_only and kind == "F" else own
    if kind.startswith("F&"):       # overlapped: the forward's unit and the backward's, as alone
        b_kind = kind[2:]
        if b_kind == "I" and run.cost.stage == 0:      # the first stage's I runs nothing
            own = 0.0
        if backward_only:
            return own if b_kind != "I" else 0.0
        return own + float(sum(sim.edge_params[run.cost.f_stage]))
    if kind == "I":
        return 0.0 if backward_only or _first_stage_split(run) else own
    if kind == "W":
        return own if backward_only or _first_stage_split(run) else 0.0
    return 0.0


def _first_stage_split(run: ActionRun) -> bool:
    """A split backward's action on the first stage: no input gradient there, so its I runs
    nothing and its W the whole backward (``engine.Simulation._price``, torch 2.13's
    PipelineStage)."""
    return run.cost.stage == 0 and run.cost.kind in ("I", "W")


def _walk(env: simpy.Environment, run: ActionRun, chain: tuple[Segment, ...], half: int | None):
    sim, dev, rec = run.sim, run.dev, run.sim.recorder
    stage, mb = run.cost.stage, run.microbatch
    # a weight-gradient pass needs no weights but the first stage's, which is the whole backward
    zero3 = sim.zero3_gathers and (run.cost.kind != "W" or _first_stage_split(run))
    layer = None
    for s in chain:
        if zero3 and s.layer >= 0 and s.layer != layer:
            layer = s.layer
            yield from _enter_layer(env, run, layer)
        if s.stream == "compute":
            if half is None:
                start = dev.ledger.busy_since = env.now
                yield env.timeout(s.duration)
            else:
                with dev.compute.request() as req:
                    yield req
                    start = dev.ledger.busy_since = env.now
                    yield env.timeout(s.duration)
            run.cover.append((start, env.now))
            if sim.interference > 0:
                dev.ledger.computed(start, env.now)
            if rec.detail:
                rec.event(dev.rank, stage, "compute", s.kind, mb, s.layer, start, env.now, flops=s.flops, name=s.name)
            scatter = _segment_done(env, run, s)
            if scatter is not None and sim.zero_blocking:
                waited = env.now
                yield scatter               # no side stream: the layer's reduce-scatter runs in place
                rec.expose(dev.rank, "dp", env.now - waited)
        else:
            req = dev.tp_stream.request() if half is not None else None
            if req is not None:
                yield req
            asked = env.now
            start = yield from collective(env, dev.tp, dev.rank, s.duration)
            run.comm.append((asked, env.now))
            if half is not None:        # sub-pipelined: the other half computes meanwhile
                dev.ledger.collective(start, env.now)
            if rec.detail:
                rec.event(dev.rank, stage, "tp", s.kind, mb, s.layer, start, env.now, nbytes=s.nbytes, name=s.name)
            if req is not None:
                dev.tp_stream.release(req)


def _segment_done(env: simpy.Environment, run: ActionRun, s: Segment):
    """Book-keeping after a compute segment; returns the ZeRO-3 reduce-scatter it started, if any."""
    key = segment_key(s)
    run.remaining[key] -= 1
    run.left -= 1
    if run.remaining[key]:
        return None
    ev = run.grad_events.get(key)
    if ev is not None:
        if run.left:
            ev.succeed()
        else:
            run.final.append(ev)
    if run.sim.zero3_gathers and s.layer >= 0 and run.cost.weight_grads and s.kind != "F":
        # the layer's weight gradients are complete (in an overlapped slot, its backward's
        # layers): reduce-scatter them over DP
        nbytes = run.sim.zero3_scatter_bytes
        scatter = env.process(zero3_collective(
            env, run.sim, run.dev, "reduce_scatter", nbytes, "zero_reducescatter", run.cost.stage, run.microbatch, s.layer))
        run.dev.pending_dp.append(scatter)
        return scatter
    return None


def _enter_layer(env: simpy.Environment, run: ActionRun, layer: int):
    """ZeRO-3: make sure this layer's parameters are (being) gathered, prefetch the next
    layer's, and wait for this one's."""
    i = run.layer_order.index(layer)
    ahead = 1 if run.sim.zero_blocking else 2         # prefetch the next layer's unless blocking
    for target in run.layer_order[i:i + ahead]:
        if target not in run.gathers:
            run.gathers[target] = env.process(zero3_collective(
                env, run.sim, run.dev, "all_gather", run.sim.zero3_gather_bytes, "zero_allgather",
                run.cost.stage, run.microbatch, target, h2d=run.sim.param_h2d_s))
    gather = run.gathers[layer]
    if not gather.processed:
        waited = env.now
        yield gather
        run.sim.recorder.expose(run.dev.rank, "dp", env.now - waited)


def zero3_collective(env: simpy.Environment, sim: "Simulation", dev: "Device", op: str, nbytes: float, kind: str,
                     stage: int, mb: int, layer: int, h2d: float = 0.0):
    """One ZeRO-3 collective of one layer on the device's DP stream (with parameter offload,
    the layer's parameter shard first comes over PCIe: ZeRO-Infinity, Rajbhandari et al. 2021),
    at the share of NCCL bandwidth the stack's ZeRO collectives reach (``costs.stack.zero_comm_factor``)."""
    rec = sim.recorder
    with dev.dp_stream.request() as req:
        yield req
        if h2d > 0:
            start = yield from transfer(env, dev.ports.pcie, h2d)
            rec.event(dev.rank, stage, "host", "offload_h2d", mb, layer, start, env.now, nbytes=sim.param_shard_bytes)
        # the unit's rule (``costs.stack.zero_unit_time``): FSDP2's copies and host work around
        # the call; blocking (no side stream), the call priced in situ like TP's
        before, seconds, after = sim.zero_unit(dev.dp, op, nbytes)
        if before:
            yield from fsdp_copy(env, sim, dev, before, nbytes, "fsdp_copy_in", stage, mb, layer)
        start = yield from collective(env, dev.dp, dev.rank, seconds)
        rec.event(dev.rank, stage, "dp", kind, mb, layer, start, env.now, nbytes=nbytes)
        dev.ledger.collective(start, env.now)
        if after:
            yield from fsdp_copy(env, sim, dev, after, nbytes, "fsdp_copy_out", stage, mb, layer)


def fsdp_copy(env: simpy.Environment, sim: "Simulation", dev: "Device", seconds: float, nbytes: float, kind: str,
              stage: int, mb: int, layer: int):
    """FSDP2's work before (``copy-in``) or after (``copy-out``) a unit's collective of
    ``nbytes``: its copies into and out of the flat buffers and its host work, ``seconds`` as
    ``costs.fsdp2.fsdp_unit_time`` prices them solo (Zhao et al. 2023, Sec. 4.2 on the
    flat-parameter layout), at the device's memory-bound slowdown; then the collective
    (copy-in) or the layer (copy-out) goes on. With side streams (GPUs) it is compute the
    device owes (``Device.ledger``)."""
    seconds *= dev.scale.membound
    if not sim.zero_blocking:       # a side stream runs the collective: the compute pays later
        dev.ledger.owe(seconds)
        return
    start = env.now
    yield env.timeout(seconds)
    sim.recorder.event(dev.rank, stage, "compute", kind, mb, layer, start, env.now, nbytes=nbytes)


def zero2_scatters(env: simpy.Environment, sim: "Simulation", dev: "Device", stage: int, mb: int, parts, ready):
    """ZeRO-2 (P_os+g; Rajbhandari et al. 2020 Sec. 5.2, DeepSpeed stage 2, FSDP with the
    parameters kept gathered across gradient accumulation): in every microbatch's backward (W for
    split backward) each layer's gradients, and the head's and the embedding's, are
    reduce-scattered over DP as soon as backward completes them, on the DP stream, and
    accumulate as the rank's 1/dp shard. ``parts``: the action's ``GradPart``s; ``ready``: when
    each is complete (an event, or a time)."""
    grad = sim.state.grad
    for gp, when in zip(parts, ready):
        yield from until(env, when)
        layer = gp.key if isinstance(gp.key, int) else -1
        yield from zero3_collective(env, sim, dev, "reduce_scatter", gp.params * grad, "zero_reducescatter",
                                    stage, mb, layer)


def fsdp2_gathers(env: simpy.Environment, sim: "Simulation", dev: "Device"):
    """ZeRO-2 run as FSDP2 (the reference executor, ``executor.zero``:
    ``reshard_after_forward=False``): the step's first forward all-gathers the parameters unit
    by unit -- every layer of the rank's stages, then each stage's root unit (its embedding and
    / or final norm + head) -- in situ, with FSDP2's copies and host work (``zero3_collective``),
    once a step. Priced after the optimizer step, where a DeepSpeed-style ZeRO-2 gathers its
    buckets: one step among many pays the same seconds."""
    layers = stage_layers(sim.model, sim.plan)
    for stage in stages_of_rank(sim.plan, dev.pp_rank):
        root = sum(sim.edge_params[stage]) * sim.state.param
        units = [(layer, sim.zero3_gather_bytes) for layer in range(layers[stage])] + ([(-1, root)] if root else [])
        for layer, nbytes in units:
            yield from zero3_collective(env, sim, dev, "all_gather", nbytes, "zero_allgather", stage, -1, layer)
