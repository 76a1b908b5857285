"""Data parallelism at the end of a step: gradient sync, optimizer step, parameter update.

* ``allreduce`` with ZeRO-0: DDP-style buckets of ``plan.dp_bucket_bytes`` (PyTorch DDP, Li
  et al. 2020, Sec. 3.2.3), filled in the order backward produces gradients and all-reduced
  as soon as the last microbatch's backward completes them (``dp_overlap``), else after the
  rank's last backward; then the AdamW step on the device.
* ZeRO-1: the buckets are reduce-scattered, each rank steps its 1/dp shard, then the
  updated parameters are all-gathered in buckets (Rajbhandari et al. 2020, Sec. 5.1; Megatron-LM
  distributed optimizer).
* ZeRO-2: gradients were reduce-scattered layer by layer in every microbatch's backward
  (``actions.zero2_scatters``; Sec. 5.2: a 1/dp gradient shard cannot accumulate over
  microbatches otherwise); each rank steps its shard, then the parameters are all-gathered in
  buckets once per step, as for ZeRO-1 (parameters stay replicated through the step).
* ZeRO-3: gradients were reduce-scattered layer by layer in every backward (``actions``);
  only the sharded step remains.
* Tied embeddings over a pipeline: after the DP sync, the first and the last pipeline rank
  all-reduce the word embedding's gradient (``costs.optimizer.tied_embedding_sync``).
* ZeRO-Offload (``offload``): each reduced gradient shard goes to the host over PCIe as its
  bucket finishes (ZeRO-1; ZeRO-2/3: the accumulated shard, before the step), the optimizer
  steps on the CPU, the parameter shard comes back over PCIe (Ren et al. 2021, Sec. 4).
* Memory: the step holds its temporaries for its length, after FSDP2's ZeRO-2 frees the
  gathered parameters (``costs.memory.optimizer_step_bytes``).
* ``dp_impl=ps`` (parameter server / single-process ``torch.nn.DataParallel``): the buckets'
  gradients are gathered to one device, which steps and broadcasts the parameters back; the
  server's link carries (n - 1) copies each way (``network.ps_time``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import simpy

from parsim.costs import dp_buckets
from parsim.costs.optimizer import bucket_to_host, optimizer_step
from parsim.costs.comm import zero1_gradient_op
from parsim.costs.zero import gathers_after_step, reduce_scatters_buckets

from .actions import fsdp2_gathers
from .memory import OTHER, PARAMS
from .network import collective, issue, transfer, until

if TYPE_CHECKING:
    from .engine import Device, Simulation


def bucket_events(parts: list[tuple[simpy.Event, float]], bytes_per_param: float, bucket_bytes: int
                  ) -> list[tuple[simpy.Event, float]]:
    """(event that completes the bucket, bucket bytes) for gradients arriving as ``parts`` =
    [(ready event, parameters)] in order (``costs.dp_buckets`` sizes)."""
    total = sum(n for _, n in parts) * bytes_per_param
    out = []
    edge, filled, j = 0.0, 0.0, -1
    for size in dp_buckets(total, bucket_bytes):
        edge += size
        while j + 1 < len(parts) and filled < edge * (1 - 1e-12):
            j += 1
            filled += parts[j][1] * bytes_per_param
        out.append((parts[j][0], size))
    return out


def gradient_sync(env: simpy.Environment, sim: "Simulation", dev: "Device"):
    """The DP gradient reduction of one device, stage by stage in the order their last
    backward runs. Each ``dev.grads_started[stage]`` fires with [(ready event, params)].

    The buckets run one at a time on the DP communicator's stream (NCCL serialises the ops of
    one communicator), each asking for the link when the stream reaches it: a pipeline send
    (another communicator) that asks meanwhile goes between two buckets instead of waiting
    for all of them."""
    plan, rec = sim.plan, sim.recorder
    gb = sim.state.grad
    ps = plan.dp_impl == "ps"
    op = zero1_gradient_op(plan) if reduce_scatters_buckets(plan.zero) else "all_reduce"
    kind = "ps_gather" if ps else ("dp_allreduce" if op == "all_reduce" else "dp_reducescatter")
    copies = []
    for stage in dev.sync_order:
        parts = yield dev.grads_started[stage]
        if not plan.dp_overlap:
            yield dev.compute_done
        for ready, nbytes in bucket_events(parts, gb, plan.dp_bucket_bytes):
            if not ready.processed:
                yield ready
            seconds = sim.ps_time(dev.dp, nbytes) if ps else sim.comm_time(dev.dp, op, nbytes)
            start = yield from collective(env, dev.dp, dev.rank, seconds)
            rec.event(dev.rank, stage, "dp", kind, -1, -1, start, env.now, nbytes=nbytes)
            dev.ledger.collective(start, env.now)
            if plan.offload != "none":
                # ZeRO-Offload: the reduced shard goes to the host as soon as it is there
                copies.append(env.process(_to_host(env, sim, dev, stage, nbytes, env.now)))
    if copies:
        yield env.all_of(copies)


def _to_host(env: simpy.Environment, sim: "Simulation", dev: "Device", stage: int, bucket: float, after):
    """ZeRO-Offload: a reduced gradient bucket's shard goes to the host once the bucket is done."""
    yield from until(env, after)
    nbytes, seconds = bucket_to_host(sim.cluster, sim.plan, bucket)
    start = yield from transfer(env, dev.ports.pcie, seconds)
    sim.recorder.event(dev.rank, stage, "host", "offload_d2h", -1, -1, start, env.now, nbytes=nbytes)


def _owed_then(env: simpy.Environment, sim: "Simulation", dev: "Device", seconds: float):
    """An event at the end of the compute the device owes to collectives that ran beside it
    (``Device.ledger``, paid here), then ``seconds`` of optimizer step on it: a job among the
    ranks sharing the host's cores, else a timeout."""
    if sim.sharing is not None:
        return sim.sharing.run(dev.ledger.pay(), 0.0, 0.0, seconds)
    return env.timeout(dev.ledger.pay() + seconds)


def finish_step(env: simpy.Environment, sim: "Simulation", dev: "Device"):
    """After the device's last action: wait for its gradients, step the optimizer, update
    the parameters. Sets ``recorder.finish[rank]``."""
    plan, rec, rank = sim.plan, sim.recorder, dev.rank
    sb = sim.state
    waited = env.now
    pending = ([dev.sync] if dev.sync is not None else []) + dev.pending_dp
    if pending:
        yield env.all_of(pending)
    if dev.embedding is not None:       # the tied embedding's two copies sum their gradients
        nbytes = sim.tied.elements * sb.grad
        start = yield from collective(env, dev.embedding, rank, sim.comm_time(dev.embedding, "all_reduce", nbytes))
        rec.event(rank, -1, "dp", "dp_allreduce", -1, -1, start, env.now, nbytes=nbytes, name="tied embedding grads")
        dev.ledger.collective(start, env.now)
    rec.expose(rank, "dp", env.now - waited)
    pp_rank = dev.pp_rank
    n = sim.rank_params[pp_rank]
    opt = optimizer_step(sim.cluster, plan, n, sim.rank_optimizer_tensors[pp_rank], sim.rank_optimizer_sizes[pp_rank])
    released, temporaries = sim.step_bytes[pp_rank]
    if released:
        dev.memory.change(env.now, PARAMS, -released)
    if temporaries:
        dev.memory.change(env.now, OTHER, temporaries)
    if opt.on_host:
        if dev.ledger.debt:
            # the compute the last backward owes to the collectives beside it, paid as before an
            # optimizer step on the device: the step's compute is not done before it
            yield _owed_then(env, sim, dev, 0.0)
        if opt.grads_to_host:
            start = yield from transfer(env, dev.ports.pcie, opt.grads_to_host_s)
            rec.event(rank, -1, "host", "offload_d2h", -1, -1, start, env.now, nbytes=opt.grads_to_host_bytes)
        start = env.now
        yield env.timeout(opt.step_s)
        rec.event(rank, -1, "host", "optimizer", -1, -1, start, env.now, name="optimizer (host)")
        start = yield from transfer(env, dev.ports.pcie, opt.params_from_host_s)
        rec.event(rank, -1, "host", "offload_h2d", -1, -1, start, env.now, nbytes=opt.params_from_host_bytes)
    else:
        start = env.now
        # on a shared host AdamW slows down as measured for it (``host_contention``'s
        # "optimizer"; after the compute that collectives overlapping the last backward took:
        # ``ledger``)
        yield _owed_then(env, sim, dev, opt.step_s * dev.scale.optimizer)
        rec.compute(rank, -1, "optimizer", -1, start, env.now, name="optimizer")
    if temporaries:
        dev.memory.change(env.now, OTHER, -temporaries)
    waited = env.now

    def log(kind: str, nbytes: float):
        return lambda r, start, end: rec.event(r, -1, "dp", kind, -1, -1, start, end, nbytes=nbytes)

    if plan.dp > 1 and plan.dp_impl == "ps":
        nbytes = n * sb.param
        yield from until(env, issue(env, dev.dp, rank, sim.ps_time(dev.dp, nbytes), log("ps_broadcast", nbytes)))
    elif plan.dp > 1 and plan.zero == 2 and sim.zero_copies:
        yield from fsdp2_gathers(env, sim, dev)      # FSDP2: unit by unit, as its first forward does
    elif plan.dp > 1 and gathers_after_step(plan.zero):
        # this device's pipeline sends are over: nothing else can ask for its link, so the
        # buckets can be queued at once
        last = env.now
        for nbytes in dp_buckets(n * sb.param, plan.dp_bucket_bytes):
            last = issue(env, dev.dp, rank, sim.comm_time(dev.dp, "all_gather", nbytes), log("dp_allgather", nbytes))
        yield from until(env, last)
    rec.expose(rank, "dp", env.now - waited)
    rec.finish[rank] = env.now

