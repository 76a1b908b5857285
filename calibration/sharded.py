"""What FSDP2 costs beyond its collectives: its sharded parameters under the optimizer, its units.

Under ZeRO-2/3 the executor shards every parameter with FSDP2 (``executor.zero.apply_fsdp``), so
its AdamW (``executor.optimizer``: ~10 tensor ops per parameter, looped in Python) runs on
DTensors: every op goes through DTensor's dispatch (sharding propagation, unwrapping and
re-wrapping the local shard) before the local kernel runs, a host cost per op that does not
depend on the tensor's size (the PyTorch DTensor design, ``torch.distributed.tensor``). It is
measured here as it is priced (``costs.timing.optimizer_time``, ``sharded``): the same AdamW
over the same local shards, once as DTensors sharded over the job's ranks and once as plain
tensors, and the difference per parameter tensor.

Around each of its collectives FSDP2 also works on the host per unit (PyTorch FSDP2,
``torch/distributed/fsdp/_fully_shard``: its pre-/post-forward and backward hooks unshard and
reshard the unit's parameters, swap the DTensor and plain views, build the sharded gradient),
beside the collective and the copies its bytes cost (``costs.fsdp2.fsdp_unit_time`` prices those
from the streaming rate). ``measure_fsdp_units`` times it where it is alone: a stack of tiny
units under ``fully_shard`` and plain, every rank at once, with each collective's wall taken
out; ``fsdp_unit_host_s`` keeps the seconds per unit around an all-gather and around a
reduce-scatter. On this project's 2-vCPU VM: 0.54-0.56 ms and 0.17-0.20 ms over three runs
(2026-11-28), against a deep model's 5 ms layer: the executor's ZeRO-3 forward spent ~1.5 ms
a unit beyond what the simulator priced (``studies/validation_cpu/fsdp_unit_split.py``).
"""
from __future__ import annotations

import time

# (tensors, local elements per rank): a few small sets, so the per-tensor host cost dominates
SETS = ((16, 4096), (64, 4096), (128, 1024))
SAMPLES = 5


def measure_dtensor_optimizer(world: int, device, dist, torch) -> list[tuple[int, float, float]]:
    """(tensors, DTensor step seconds, plain step seconds) per set: medians of ``SAMPLES`` steps,
    every rank stepping at once (after a barrier), as FSDP2's ranks do."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from parsim.executor.optimizer import make_adamw

    mesh = init_device_mesh(device.type, (world,))
    out = []
    for tensors, local in SETS:
        full = [torch.randn(local * world // 64, 64, device=device) for _ in range(tensors)]
        sharded = [torch.nn.Parameter(distribute_tensor(t, mesh, [Shard(0)])) for t in full]
        for p in sharded:
            p.grad = distribute_tensor(torch.randn_like(full[0]), mesh, [Shard(0)])
        plain = [torch.nn.Parameter(p.to_local().clone()) for p in sharded]
        for p in plain:
            p.grad = torch.randn_like(p)
        medians = []
        for params in (sharded, plain):
            opt = make_adamw(params)
            opt.step()                    # the moments' first allocation
            times = []
            for _ in range(SAMPLES):
                dist.barrier()
                t0 = time.perf_counter()
                opt.step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - t0)
            medians.append(sorted(times)[len(times) // 2])
        out.append((tensors, medians[0], medians[1]))
    return out


def dtensor_per_tensor_s(rank_results: list[dict]) -> float | None:
    """Seconds a DTensor parameter adds to one AdamW step over a plain one: the median over
    ranks and sets of (DTensor - plain) / tensors, >= 0; None where no job measured it."""
    diffs = sorted((d - p) / n for r in rank_results for n, d, p in r.get("dtensor_optimizer", []))
    if not diffs:
        return None
    return max(0.0, diffs[len(diffs) // 2])


# FSDP2's own host work per unit, around its collectives (``measure_fsdp_units``): a stack of tiny
# Linear units, so the bytes FSDP2 copies and communicates are negligible and what is left beside
# the timed collectives is its per-unit bookkeeping
FSDP_UNITS, FSDP_WIDTH, FSDP_ROWS = 16, 32, 8
FSDP_SAMPLES = 7


def _timed_comms(walls: list[float]):
    """FSDP2's default all-gather and reduce-scatter (``executor.zero.fsdp_comm_hooks``), each
    call's wall time (the wait for its peers included) appended to ``walls``."""
    from parsim.executor.zero import fsdp_comm_hooks

    def timed(_kind, _tensor, _async_op, launch, _buffers):
        t0 = time.perf_counter()
        work = launch()
        if work is not None:
            work.wait()
        walls.append(time.perf_counter() - t0)
        return work

    return fsdp_comm_hooks(timed)


def measure_fsdp_units(world: int, device, dist, torch) -> list[tuple[float, float, float, float]]:
    """Per sample, seconds: (forward under FSDP2 less its collectives' wall, plain forward,
    backward under FSDP2 less its collectives' wall, plain backward) of ``FSDP_UNITS`` tiny
    units, each its own FSDP2 unit (``fully_shard``, ``reshard_after_forward=True``: ZeRO-3 as
    ``executor.zero.apply_fsdp`` builds it). A sharded and a plain pass alternate within every
    sample, every rank at once (after a barrier), so a slow phase moves both alike."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    walls: list[float] = []
    models = []
    for sharded in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(FSDP_WIDTH, FSDP_WIDTH) for _ in range(FSDP_UNITS)]).to(device)
        if sharded:
            gather, scatter = _timed_comms(walls)
            for unit in model:
                fully_shard(unit, mesh=mesh, reshard_after_forward=True)
                unit.set_custom_all_gather(gather)
                unit.set_custom_reduce_scatter(scatter)
            fully_shard(model, mesh=mesh, reshard_after_forward=True)
        models.append(model)
    x = torch.randn(FSDP_ROWS, FSDP_WIDTH, device=device)

    def passes(model) -> tuple[float, float]:
        dist.barrier()
        walls.clear()
        t0 = time.perf_counter()
        loss = model(x).sum()
        t1 = time.perf_counter()
        forward_comm = sum(walls)
        loss.backward()
        t2 = time.perf_counter()
        return t1 - t0 - forward_comm, t2 - t1 - (sum(walls) - forward_comm)

    for model in models:            # warm-up: FSDP2's lazy init, the gradients' first allocation
        passes(model)
        passes(model)
    out = []
    for _ in range(FSDP_SAMPLES):
        (fs, bs), (fp, bp) = passes(models[0]), passes(models[1])
        out.append((fs, fp, bs, bp))
    return out


def fsdp_unit_host_s(rank_results: list[dict]) -> tuple[float, float] | None:
    """(seconds FSDP2 adds per unit around an all-gather, around a reduce-scatter) beyond the
    collectives and the bytes its copies move (``costs.fsdp2.fsdp_unit_time``): the forward's
    extra per unit (one all-gather each: copy-in and copy-out of tiny shards, unsharding and
    resharding the parameters, its hooks), and the backward's extra per unit (one all-gather
    and one reduce-scatter each) less the forward's. Medians over ranks and samples, >= 0;
    None where no job measured it."""
    samples = [s for r in rank_results for s in r.get("fsdp_units", [])]
    if not samples:
        return None
    forward = sorted((fs - fp) / FSDP_UNITS for fs, fp, _, _ in samples)
    backward = sorted((bs - bp) / FSDP_UNITS for _, _, bs, bp in samples)
    gather = max(0.0, forward[len(forward) // 2])
    return gather, max(0.0, backward[len(backward) // 2] - gather)


def measure_fsdp2(world: int, device, dist, torch) -> dict[str, list]:
    """What FSDP2 costs a DP pair beyond its collectives and the bytes it moves: the DTensor
    optimizer step per tensor and the host work per unit (the rank result's keys)."""
    return {"dtensor_optimizer": measure_dtensor_optimizer(world, device, dist, torch),
            "fsdp_units": measure_fsdp_units(world, device, dist, torch)}
