"""What stepping FSDP2's sharded parameters costs the optimizer beyond their local shards.

Under ZeRO-2/3 the executor shards every parameter with FSDP2 (``executor.zero.apply_fsdp``), so
its AdamW (``executor.optimizer``: ~10 tensor ops per parameter, looped in Python) runs on
DTensors: every op goes through DTensor's dispatch (sharding propagation, unwrapping and
re-wrapping the local shard) before the local kernel runs, a host cost per op that does not
depend on the tensor's size (the PyTorch DTensor design, ``torch.distributed.tensor``). It is
measured here as it is priced (``costs.timing.optimizer_time``, ``sharded``): the same AdamW
over the same local shards, once as DTensors sharded over the job's ranks and once as plain
tensors, and the difference per parameter tensor.
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
