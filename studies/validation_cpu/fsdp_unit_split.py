"""Where a ZeRO-3 (FSDP2) step's time goes, layer by layer, on 2 gloo ranks.

The executor's own stage of a model (default cpu-small: all its layers, embedding and head) runs
forward + backward on every rank at once, plain and under ``apply_fsdp`` (ZeRO-3:
``reshard_after_forward=True``, as ``parsim execute`` builds it). Hooks registered before and
after FSDP2's own on every layer split each layer's forward into

* unshard: FSDP2's pre-forward (copy-in, the all-gather, copy-out, its bookkeeping),
* compute: the layer itself,
* reshard: FSDP2's post-forward (freeing the gathered parameters),

and the script prints, per launch, the medians over steps of the per-layer means and of the whole
forward and backward, next to what the calibrated profile prices for one unit's unshard (the
in-situ all-gather of the layer's parameters, FSDP2's copy-in and copy-out and its host work:
``parsim.sim.actions.zero3_collective``, ``costs.fsdp2.fsdp_unit_time``).

    .venv/bin/python studies/validation_cpu/fsdp_unit_split.py [--model M] [--mbs N] [--profile P]
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS, WARMUP, LAUNCHES = 8, 2, 2


def rank_main(rank: int, world: int, port: int, zero: int, model_name: str, mbs: int) -> list[float] | None:
    """One rank's step loop; rank 0 returns the medians (unshard, compute, reshard, forward,
    backward; seconds)."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    from parsim.executor.model import StageModule
    from parsim.executor.weights import init_stage
    from parsim.executor.zero import apply_fsdp
    from parsim.specs import load_model

    model = load_model(model_name)
    stage = StageModule(model, 0, model.layers, True, True)
    init_stage(stage, seed=0)
    if zero:
        apply_fsdp(stage, init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))["dp"], reshard_after_forward=True)
    stamps: dict[tuple[int, int], float] = {}
    for name, block in stage.layers.items():
        i = int(name)

        def at(k, i=i):
            return lambda *_: stamps.__setitem__((i, k), time.perf_counter())
        block.register_forward_pre_hook(at(0), prepend=True)     # before FSDP2's pre-forward
        block.register_forward_pre_hook(at(1))                   # after it
        block.register_forward_hook(at(2), prepend=True)         # before FSDP2's post-forward
        block.register_forward_hook(at(3))                       # after it
    tokens = torch.randint(0, model.vocab, (mbs, model.seq_len))
    rows = []
    for step in range(STEPS):
        dist.barrier()
        t0 = time.perf_counter()
        loss = stage(tokens, tokens)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if step >= WARMUP:
            split = [statistics.fmean(stamps[(i, k + 1)] - stamps[(i, k)] for i in range(model.layers)) for k in range(3)]
            rows.append((*split, t1 - t0, t2 - t1))
    dist.destroy_process_group()
    return [statistics.median(r[k] for r in rows) for k in range(5)] if rank == 0 else None


def launch(zero: int, model: str, mbs: int) -> list[float]:
    from parsim.executor.processes import free_port, run_ranks

    return run_ranks(rank_main, (2, free_port(), zero, model, mbs), 2)[0]


def priced_unit_ms(profile: str, model: str) -> tuple[float, float, float]:
    """(all-gather in situ, FSDP2's work before it, after it) the simulator charges one layer
    unit's unshard, ms."""
    from parsim.costs import layer_params, state_bytes
    from parsim.costs.timing import collective_time, fsdp_unit_time
    from parsim.specs import load_cluster, load_model

    cluster = load_cluster("cpu:2", profile=profile)
    nbytes = layer_params(load_model(model), 1) * state_bytes("fp32").param
    gather = collective_time(cluster, "all_gather", nbytes, [0, 1], in_situ=True)
    before, after = fsdp_unit_time(cluster.device, "all_gather", nbytes, 2)
    return gather * 1e3, before * 1e3, after * 1e3


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cpu-small")
    ap.add_argument("--mbs", type=int, default=1)
    ap.add_argument("--profile", default=str(ROOT / "calibration/profiles/cpu-calibrated.yaml"))
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    gather, before, after = priced_unit_ms(args.profile, args.model)
    print(f"{args.model} on 2 gloo ranks, fp32, mbs={args.mbs}; median over {STEPS - WARMUP} steps of the per-layer "
          f"means; ms")
    print(f"priced per unit and forward ({Path(args.profile).name}): copy-in + host {before:.2f} + all-gather in situ "
          f"{gather:.2f} + copy-out {after:.2f} = {before + gather + after:.2f}")
    print(f"{'launch':>6} {'plan':>8} {'unshard':>8} {'compute':>8} {'reshard':>8} {'forward':>8} {'backward':>9}")
    for n in range(LAUNCHES):
        for zero in (0, 3):
            u, c, r, f, b = (x * 1e3 for x in launch(zero, args.model, args.mbs))
            print(f"{n + 1:>6} {'zero=' + str(zero):>8} {u:8.2f} {c:8.2f} {r:8.2f} {f:8.1f} {b:9.1f}")
    print(f"load average (1, 5, 15 min) {tuple(round(x, 2) for x in os.getloadavg())} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
