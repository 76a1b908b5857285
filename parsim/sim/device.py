"""One simulated device: a SimPy process that walks its pipeline rank's actions.

As in SimPy's own examples, ``device`` is a generator: for each action it waits for the
action's input (``input_start``: the previous stage's activations for F, the next stage's
gradients for B/I), computes (``start_whole`` / ``end_whole``: one
``env.timeout``, or one job on a host whose cores the ranks share; ``compute_stepped``:
segment by segment, ``actions``), then sends its output on (``Simulation.send``). The host model (``costs.host``) supplies how long the
compute takes: the device's ``scale``, the shared host's processor sharing, and the compute it
owes to collectives that ran beside it (``Device.ledger``), paid before its next action.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import simpy

from .actions import ActionRun, run_stepped, zero2_scatters
from .compute import ActionCost
from .dp import finish_step
from .memory import ACTIVATIONS, OTHER
from .network import Arrival
from .record import ACTION, RECV_B, RECV_F

if TYPE_CHECKING:
    from .engine import Device, Simulation


def device(env: simpy.Environment, sim: "Simulation", dev: "Device"):
    """One device: its actions in schedule order, then the end of its step.

    This loop runs once per action of the step (10^5 times for the 1T benchmark), so it keeps
    its lookups in locals, skips the zero-byte memory changes, and runs a whole action's
    compute through plain functions (a generator per action would cost ~10% of a run).
    Memory (``costs.memory.StageFootprint``): a forward holds its activations until its B (or W)
    ends; a backward pass holds what it needs while it runs; an I leaves its output gradients
    (``kept``) until its W ends."""
    rec, mem, rank, ledger = sim.recorder, dev.memory, dev.rank, dev.ledger
    footprints, keep, last_stage = sim.footprints, rec.keep_events, sim.num_stages - 1
    interfered, detail, blocking, output_hold = sim.interference > 0, rec.detail, sim.p2p_blocking, sim.output_hold
    for idx, (kind, stage, mb) in enumerate(dev.actions):
        if kind == "F&":
            yield from overlapped(env, sim, dev, idx, dev.overlaps[stage])
            continue
        forward = kind == "F"
        # input: activations of the previous stage (F), gradients of the next stage (B, I)
        now = env.now
        begin = input_start(sim, dev, kind, stage, mb, now)
        if begin.__class__ is Arrival:             # not sent yet: wait for the sender
            yield begin
            begin = input_start(sim, dev, kind, stage, mb, now, waited=begin)
        start = begin + ledger.pay() if ledger.debt else begin    # compute owed to collectives first
        cost = dev.costs.get((stage, kind)) or sim.cost(dev, stage, kind)
        fp = sim.first_footprints[stage] if mem.unmade and not forward else footprints[stage]
        during = 0.0 if forward else fp.backward if kind == "B" else fp.during(kind)
        if forward:
            mem.change(start, ACTIVATIONS, fp.activations)
        else:
            if during:
                mem.change(start, OTHER, during)
            if mem.unmade:      # after ``during``, which may take them off again
                mem.make_grads(start)
        if fp.gathered_params:
            mem.change(start, OTHER, fp.gathered_params)
        end = yield from compute(env, sim, dev, cost, idx, mb, begin, start, interfered, detail)
        if fp.gathered_params:
            mem.change(end, OTHER, -fp.gathered_params)
        if during > 0:
            mem.change(end, OTHER, -during)
        if not forward:
            release(mem, end, kind, fp)
        if during < 0:          # gradient states taken off (``costs.unmade_grads``): back after the release
            mem.change(end, OTHER, -during)
        rec.busy[rank] += end - begin
        if keep:
            rec.rows.append((rank, stage, "compute", kind, mb, -1, begin, end, 0.0, cost.flops, ACTION))
        # output: to the next stage (F) or the previous one (B, I)
        sent = end
        if forward and stage < last_stage:
            sent = sim.send(dev, ("act", stage, mb), stage + 1, mb)
        elif (kind == "B" or kind == "I") and stage > 0:
            sent = sim.send(dev, ("grad", stage, mb), stage - 1, mb)
        if dev.run is not None:
            dev.run.release_final_gradients()
            dev.run = None
        if output_hold and (stage, kind) in output_hold:     # its send calls (``HostModel.action_send_hold``)
            yield from hold(env, sim, rank, env.now + output_hold[stage, kind])
        if blocking and sent > env.now:
            yield from hold(env, sim, rank, sent)
    dev.compute_done.succeed(env.now)
    yield from finish_step(env, sim, dev)


def hold(env: simpy.Environment, sim: "Simulation", rank: int, sent: float):
    """A blocking stack's sender waits until its send is through (``costs.p2p_holds_sender``), or
    any sender until its send's call returns (``costs.host.send_hold``): exposed pipeline time."""
    sim.recorder.expose(rank, "pp", sent - env.now)
    yield env.timeout(sent - env.now)


def release(mem, end: float, kind: str, fp) -> None:
    """Activations a backward pass frees (B, W: the microbatch's; W also the output gradients
    its I left) or leaves (I: its output gradients) at its end."""
    if kind == "B":
        mem.change(end, ACTIVATIONS, -fp.activations)
    elif kind == "I":
        if fp.kept:
            mem.change(end, ACTIVATIONS, fp.kept)
    else:
        mem.change(end, ACTIVATIONS, -(fp.activations + fp.kept))


def compute(env: simpy.Environment, sim: "Simulation", dev: "Device", cost: ActionCost, idx: int, mb: int,
            begin: float, start: float, interfered: bool, detail: bool):
    """An action's compute from ``start``: stepped, or one timeout (or host job); then, without
    a side stream, its ZeRO reduce-scatters. Returns its end; a stepped action's run is left in
    ``dev.run`` for the caller to release its last gradients after its send."""
    issued = len(dev.pending_dp)
    if dev.stepped:
        run = yield from compute_stepped(env, sim, dev, cost, idx, mb, start)
    else:
        run = None
        if interfered:
            dev.ledger.busy_since = begin
        if sim.sharing is not None and start > env.now:
            yield env.timeout(start - env.now)   # a job of the shared host starts when it starts
        done, stretch = start_whole(env, sim, dev, cost, idx, mb, start)
        yield done
        if interfered or detail:
            end_whole(env, sim, dev, cost, mb, begin, start, stretch)
        elif cost.exposed_tp:
            sim.recorder.exposed[dev.rank]["tp"] += cost.exposed_tp
    if sim.zero_blocking and len(dev.pending_dp) > issued:
        # the action's ZeRO reduce-scatters are waited for before it ends (no side stream)
        if run is not None:
            run.release_final_gradients()
            run = None
        waited = env.now
        yield env.all_of(dev.pending_dp[issued:])
        sim.recorder.expose(dev.rank, "dp", env.now - waited)
    dev.run = run
    return env.now


def overlapped(env: simpy.Environment, sim: "Simulation", dev: "Device", idx: int, slot):
    """DualPipe's overlapped F&B slot (``compute.overlap_cost``): it starts when the forward's
    activations and the backward's gradients are both in, holds the forward's activations from
    its start and the backward's working set while it runs, then sends both outputs."""
    f, b = slot.forward, slot.backward
    now = env.now
    begin = now
    for a in (f, b):
        arrived = input_start(sim, dev, a.kind, a.stage, a.microbatch, now)
        if arrived.__class__ is Arrival:
            yield arrived
            arrived = input_start(sim, dev, a.kind, a.stage, a.microbatch, now, waited=arrived)
        begin = max(begin, arrived)
    ledger, mem = dev.ledger, dev.memory
    start = begin + ledger.pay() if ledger.debt else begin
    key = (f.stage, b.stage)
    cost = dev.costs.get((key, "F&" + b.kind)) or sim.cost(dev, key, "F&" + b.kind)
    ffp, bfp = sim.footprints[f.stage], (sim.first_footprints if mem.unmade else sim.footprints)[b.stage]
    during = bfp.during(b.kind) + max(ffp.gathered_params, bfp.gathered_params)
    mem.change(start, ACTIVATIONS, ffp.activations)
    if during:
        mem.change(start, OTHER, during)
    if mem.unmade:
        mem.make_grads(start)
    end = yield from compute(env, sim, dev, cost, idx, b.microbatch, begin, start, sim.interference > 0,
                             sim.recorder.detail)
    if during > 0:
        mem.change(end, OTHER, -during)
    release(mem, end, b.kind, bfp)
    if during < 0:
        mem.change(end, OTHER, -during)
    sim.recorder.busy[dev.rank] += end - begin
    if sim.recorder.keep_events:
        flops = {0: 0.0, 1: 0.0}
        for p in cost.placed:
            flops[p.half] += p.segment.flops
        for h, a in enumerate((f, b)):
            sim.recorder.rows.append((dev.rank, a.stage, "compute", a.kind, a.microbatch, -1, begin, end, 0.0,
                                      flops[h], ACTION))
    if f.stage < sim.num_stages - 1:
        sim.send(dev, ("act", f.stage, f.microbatch), f.stage + 1, f.microbatch)
    if b.stage > 0:
        sim.send(dev, ("grad", b.stage, b.microbatch), b.stage - 1, b.microbatch)
    if dev.run is not None:
        dev.run.release_final_gradients()
        dev.run = None
    call = sim.output_hold.get((f.stage, "F"), 0.0) + sim.output_hold.get((b.stage, b.kind), 0.0)
    if call:
        yield from hold(env, sim, dev.rank, env.now + call)


def input_start(sim: "Simulation", dev: "Device", kind: str, stage: int, mb: int, now: float,
                waited: Arrival | None = None):
    """When an action asked for at ``now`` can start (seconds): when its input (the previous
    stage's activations for F, the next stage's gradients for B/I) arrives, never before
    ``now``; or, when the input is not sent yet, the ``Arrival`` event the sender will fire
    (call again with it as ``waited`` once it has). A wait that is not over is not yielded:
    the caller folds it into the action's own timeout. Time blocked on a transfer already on
    the wire is exposed PP time; so is, from another rank on a host whose cores the ranks
    outnumber, the wait for a core after the arrival (``Simulation.input_hold``)."""
    if waited is None:
        if kind == "F":
            if stage == 0:
                return now
            key = (dev.replica, ("act", stage - 1, mb))
        elif (kind == "B" or kind == "I") and stage < sim.num_stages - 1:
            key = (dev.replica, ("grad", stage + 1, mb))
        else:
            return now
        sent = sim.deliveries.pop(key, None)
        if sent is None:
            sent = sim.deliveries[key] = Arrival(sim.env)
            return sent
        arrival, on_wire = sent
    else:
        arrival, on_wire = sim.env.now, waited.value
    start, on_wire = max(now, arrival), max(now, on_wire)
    if sim.input_hold:
        start += sim.input_hold.get((stage, kind), 0.0)
    if start > on_wire:                    # blocked while the transfer was on the wire
        rec = sim.recorder
        rec.exposed[dev.rank]["pp"] += start - on_wire
        if rec.keep_events:
            rec.rows.append((dev.rank, stage, "pp", "recv", mb, -1, on_wire, start, sim.p2p_nbytes, 0.0,
                             RECV_F if kind == "F" else RECV_B))
    return start


def start_whole(env: simpy.Environment, sim: "Simulation", dev: "Device", cost: ActionCost, idx: int, mb: int,
                start: float):
    """Start an action with nothing shared inside: returns (the event at its end, the stretch
    of its inside offsets). One timeout of its duration, the wait for its input folded in;
    or, on a host whose cores the ranks share, one processor-sharing job
    (``costs.sharing.ProcessorSharing``) whose inside stretches by the sharing at its start. Its
    gradients' readiness and its ZeRO-2 reduce-scatters hang on the inside offsets."""
    now, stage, kind = env.now, cost.stage, cost.kind
    if sim.sharing is not None:
        # an overlapped slot is priced (and memoised) under its (forward, backward) stages
        solo = sim.solo_seconds(dev, (cost.f_stage, stage) if kind.startswith("F&") else stage, kind)
        stretch = sim.sharing.estimate(*solo) / cost.duration if cost.duration > 0 else 1.0
        done = sim.sharing.run(*solo)
    else:
        # the action's end is scheduled before the gradient-ready times it contains, so at
        # equal times its pipeline send queues before the DP bucket it completes
        stretch = 1.0
        done = env.timeout(start - now + cost.duration)
    if dev.sync is not None and idx in dev.last_backward:
        dev.grads_started[stage].succeed([(env.timeout(start - now + gp.offset * stretch), gp.params)
                                          for gp in cost.grads_ready])
    if sim.zero2_scatters and cost.weight_grads:
        # no side stream (blocking): the reduce-scatters follow the compute one after the other
        ready = ([done] * len(cost.grads_ready) if sim.zero_blocking else
                 [start + gp.offset * stretch for gp in cost.grads_ready])
        dev.pending_dp.append(env.process(zero2_scatters(env, sim, dev, stage, mb, cost.grads_ready, ready)))
    return done, stretch


def end_whole(env: simpy.Environment, sim: "Simulation", dev: "Device", cost: ActionCost, mb: int, begin: float,
              start: float, stretch: float) -> None:
    """After a whole action: the compute its TP collectives took on a CPU host (sub-pipelined
    halves overlap them), its exposed TP time, and its per-layer events (``detail``)."""
    if sim.interference > 0:
        dev.ledger.computed(begin, env.now)
        overlapped = sim.overlapped_tp(cost)
        if overlapped > 0:
            dev.ledger.owe(sim.interference * overlapped)
    rec = sim.recorder
    if cost.exposed_tp:
        rec.exposed[dev.rank]["tp"] += cost.exposed_tp
    if rec.detail:
        for p in cost.placed:
            s = p.segment
            rec.event(dev.rank, cost.stage, s.stream, s.kind, mb, s.layer, start + p.start * stretch,
                      start + p.end * stretch, nbytes=s.nbytes, flops=s.flops, name=s.name)


def compute_stepped(env: simpy.Environment, sim: "Simulation", dev: "Device", cost: ActionCost, idx: int, mb: int,
                    start: float):
    """An action whose inside meets other processes, segment by segment (``actions``);
    returns its ``ActionRun`` (the caller releases its last gradients after the send)."""
    now, stage = env.now, cost.stage
    if start > now:
        yield env.timeout(start - now)
    run = ActionRun(sim, dev, cost, mb)
    if dev.sync is not None and idx in dev.last_backward:
        dev.grads_started[stage].succeed([(_grad_event(env, run, gp), gp.params) for gp in cost.grads_ready])
    scatters = sim.zero2_scatters and cost.weight_grads
    if scatters and not sim.zero_blocking:
        ready = [_grad_event(env, run, gp) for gp in cost.grads_ready]
        dev.pending_dp.append(env.process(zero2_scatters(env, sim, dev, stage, mb, cost.grads_ready, ready)))
    yield from run_stepped(env, run)
    if scatters and sim.zero_blocking:
        # no side stream: the reduce-scatters run one after the other, compute waiting
        # (each FSDP2 post-backward waits for its collective); their sum follows the action
        dev.pending_dp.append(env.process(zero2_scatters(env, sim, dev, stage, mb, cost.grads_ready,
                                                         [env.now] * len(cost.grads_ready))))
    return run


def _grad_event(env: simpy.Environment, run: ActionRun, gp):
    """The event at which a gradient part of a stepped action is ready."""
    return env.timeout(0) if gp.trigger is None else run.grad_events.setdefault(gp.trigger, env.event())
