"""The calibration's real-layer probe, re-taken inside an executor launch.

``parsim calibrate`` times one real transformer layer (the executor's own ``Block``, tp=1) alone
and with every rank stepping it at once (``layer_probe``, ``contention_layer`` in the profile),
and the simulator's compute prices are anchored to those two numbers. On a shared machine they
drift: on this project's 2-vCPU VM the same layer ran 20-40% slower for minutes at a time, and
the slowdown of two concurrent ranks ranged 1.06x-1.4x over one evening; the layer alone flips
between ~33 and ~50 ms forward within seconds. ``parsim validate`` therefore has the executor
probe the same layer again right before every timed step and after the last
(``ExecutorConfig.layer_probe``, ``trainer.train_rank``), so the prediction can be re-anchored
to the machine as it was while the step ran (``parsim.study.validate``) and the drift is
reported beside the error.

One probe, on every rank of the launch (a collective call; it takes ~1-2 s):

1. rank 0 alone (the others wait in a barrier, which does not spin): ``PROBE_STEPS`` forward
   and backward passes of the layer after one warm-up, each pass timed -> median forward and
   backward seconds, as ``calibration.compute.bench_layer`` measures them (both time
   ``layer_step``, defined here);
2. every rank at once: the same number of forward + backward steps -> the median over ranks
   of the seconds per step, as ``calibration.comm._alternating_rounds`` measures the concurrent side.

The layer is built for the probe and dropped after it, so nothing of it is live while a plan
runs (its memory is not the plan's)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .weights import initialised_stage

# timed passes per phase (after one warm-up): ~0.3 s alone for the cpu-small layer on this VM
PROBE_STEPS = 4
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def layer_step(spec, mbs: int, dtype: str, device: torch.device) -> tuple[Callable[[], torch.Tensor],
                                                                          Callable[[], None], torch.nn.Module]:
    """(forward, backward, module) of one real transformer layer: the executor's own ``Block``
    (``parsim.executor.model``, a one-layer stage, tp=1) on an (mbs, seq, hidden) input.
    ``forward()`` runs the layer and keeps its output; ``backward()`` back-propagates a fixed
    output gradient through it. Gradients are not zeroed, so every backward accumulates into
    ``.grad`` as a microbatch of a step with gradient accumulation does. The calibration times
    it (``calibration.compute.bench_layer``, ``calibration.comm``) and so does ``probe_layer``."""
    dt = TORCH_DTYPES[dtype]
    stage = initialised_stage(spec, 0, 1, False, False, seed=0).to(device=device, dtype=dt)
    x = torch.randn(mbs, spec.seq_len, spec.hidden, dtype=dt, device=device).requires_grad_(True)
    dy = torch.randn(mbs, spec.seq_len, spec.hidden, dtype=dt, device=device)
    held: list[torch.Tensor] = []

    def forward() -> torch.Tensor:
        held[:] = [stage(x)]
        return held[0]

    def backward() -> None:
        held.pop().backward(dy)

    return forward, backward, stage


@dataclass(frozen=True)
class LayerProbe:
    """One probe's result (seconds): rank 0 alone, forward and backward of one layer; every
    rank at once, forward + backward per step (median over ranks)."""
    solo_fwd_s: float
    solo_bwd_s: float
    concurrent_s: float
    world: int

    def to_dict(self) -> dict[str, float]:
        return {"solo_fwd_s": self.solo_fwd_s, "solo_bwd_s": self.solo_bwd_s,
                "concurrent_s": self.concurrent_s, "world": self.world}


def probe_layer(model, mbs: int, dtype: str, device: torch.device) -> LayerProbe | None:
    """Run the probe on every rank of the default group; the result on rank 0, None elsewhere."""
    from parsim.specs import load_model

    forward, backward, module = layer_step(load_model(model), mbs, dtype, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(fn) -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    try:
        dist.barrier()
        fwd, bwd = [], []
        if dist.get_rank() == 0:
            for i in range(PROBE_STEPS + 1):
                f, b = timed(forward), timed(backward)
                if i:
                    fwd.append(f)
                    bwd.append(b)
        dist.barrier()
        steps = [timed(lambda: (forward(), backward())) for _ in range(PROBE_STEPS + 1)][1:]
        # on the launch's device: NCCL groups have no CPU backend
        mine = torch.tensor([statistics.median(steps)], dtype=torch.float64, device=device)
        every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
    finally:
        del forward, backward, module
    if dist.get_rank() != 0:
        return None
    return LayerProbe(solo_fwd_s=statistics.median(fwd), solo_bwd_s=statistics.median(bwd),
                      concurrent_s=statistics.median(float(t) for t in every), world=dist.get_world_size())


def probe_now(model, mbs: int, dtype: str, world: int, probes: int = 3,
              timeout_s: float = 60.0) -> list[dict[str, float]]:
    """``probes`` probes (``probe_layer``, as dicts) taken in a launch of ``world`` CPU ranks of
    their own, started as the executor starts its ranks (gloo, one thread each, the host memory
    policy ``PARSIM_HOST_MEMORY`` says): the machine as it runs now, before a plan is predicted.
    ``parsim demo`` re-anchors a profile kept from an earlier run with them
    (``calibration.anchor.anchored_profile``): a shared VM's speed moves by tens of percent
    between runs minutes apart. Three probes of cpu-small's layer on 2 ranks: 2.4-3.4 s in all.
    The probes as rank 0 returns them (solo and concurrent seconds, ``LayerProbe.to_dict``)."""
    from .processes import free_port, launched_from_a_script, run_ranks

    start = "exec" if launched_from_a_script() else None
    ranks = run_ranks(_probe_rank, (free_port(), world, model, mbs, dtype, probes, timeout_s), world, grace_s=0.0,
                      start=start)
    return ranks[0]


def _probe_rank(rank: int, port: int, world: int, model, mbs: int, dtype: str, probes: int,
                timeout_s: float) -> list[dict]:
    import datetime

    from .host_alloc import apply_host_memory_policy

    torch.set_num_threads(1)
    apply_host_memory_policy()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        taken = [probe_layer(model, mbs, dtype, torch.device("cpu")) for _ in range(probes)]
    finally:
        dist.destroy_process_group()
    return [p.to_dict() for p in taken if p is not None]
