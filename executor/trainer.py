"""The training loop of one rank: build, run the steps, measure, checkpoint.

One step: zero grads -> barrier (common start) -> the rank's Schedule IR actions (forward and
backward of every microbatch, with their pipeline messages and TP collectives, and the DP
buckets launched as gradients become final) -> finish gradients (DP buckets, SP-replicated
parameters over TP, tied embedding copies) -> fp16 unscale/overflow check -> optimizer step.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from functools import partial
from typing import Callable

import torch
import torch.distributed as dist

from parsim.costs.placement import stages_of_rank
from parsim.specs import ModelSpec, Plan, stage_layers

from .build import Training, build_training, stage_first_layers
from .config import ExecutorConfig, FaultInjection
from .data import make_source, rank_microbatches
from .memory import MemoryTracker
from .parallel_dims import ParallelDims
from .pp_parallel import allreduce_tied_embedding_grads
from .results import RankResult, host_clock, memory_step_of, timed_steps
from .layer_probe import probe_layer
from .timeline import NullMemory, StepRecorder
from .tp_parallel import allreduce_sequence_parallel_grads


def train_rank(spec: ModelSpec, plan: Plan, config: ExecutorConfig, dims: ParallelDims,
               progress: Callable[[int], None] = lambda step: None) -> RankResult:
    recorder = StepRecorder(dims.rank, dims.device)
    restore = None
    if config.resume_dir:
        from .checkpoint import load_checkpoint   # DCP and DTensor: imported only when used
        stages = stages_of_rank(plan, dims.pp_rank)
        restore = load_checkpoint(config.resume_dir, spec, plan, stages, stage_first_layers(spec, plan),
                                  stage_layers(spec, plan))
    training = build_training(spec, plan, dims, recorder, config.seed, restore)
    source = make_source(spec, config.seed, config.data_file)
    first = restore.step if restore is not None else 0
    result = RankResult(rank=dims.rank, coords=dims.coords, clock_host=host_clock())
    result.memory_step = memory_step_of(first, config.steps - 1, config.warmup) if config.track_memory else -1
    timed = set(timed_steps(list(range(first, config.steps)), config.warmup, result.memory_step))
    for step in range(first, config.steps):
        progress(step)
        if config.layer_probe and step in timed:       # right before every timed step ...
            result.layer_probes.append(probe_layer(*config.layer_probe, dims.device))
        microbatches = rank_microbatches(source, step, plan, dims.dp_rank, dims.device)
        _arm_fault(training, config.inject_fault, dims.rank, step)
        track = step == result.memory_step
        seconds, events, losses, finite, memory = run_step(training, spec, plan, dims, recorder, microbatches,
                                                           seed=config.seed, step=step, track_memory=track)
        result.steps.append(step)
        result.step_times.append(seconds)
        result.step_origins.append(None if recorder.clock.cuda else recorder.clock.origin)
        result.microbatch_losses.append(losses)
        result.skipped.append(not finite)
        result.events[step] = events
        if memory is not None:
            result.peak_memory_bytes, result.memory_breakdown = memory
        if config.collect_grads and step == first:
            from .checkpoint import gather_full_gradients
            result.grads = gather_full_gradients(training.chunks, spec, dims)
        if config.save_dir and step + 1 == config.save_at:
            from .checkpoint import save_checkpoint
            save_checkpoint(config.save_dir, step + 1, training.chunks, training.optimizer, training.scaler, spec,
                            plan, dims)
        if config.layer_probe and step == max(timed):   # ... and after the last
            result.layer_probes.append(probe_layer(*config.layer_probe, dims.device))
    if config.collect_params:
        from .checkpoint import gather_canonical
        result.params = gather_canonical(training.chunks, training.optimizer, spec, plan, dims,
                                         with_optimizer=False)[0]
    return result


def run_step(training: Training, spec: ModelSpec, plan: Plan, dims: ParallelDims, recorder: StepRecorder,
             microbatches, *, seed: int, step: int, track_memory: bool):
    """One training step; returns (seconds, events, microbatch losses, finite, (peak, breakdown) or None)."""
    # Dropout masks: a function of (seed, step, pipeline rank, replica), equal on TP peers.
    torch.manual_seed(seed * 1_000_003 + step * 10_007 + dims.pp_rank * 101 + dims.dp_rank)
    for chunk in training.chunks.values():
        chunk.train()
    zero_gradients(training)
    params = training.parameters()
    tracker = MemoryTracker() if track_memory else None
    if tracker is not None and dims.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dims.device)
    dist.barrier(group=dims.world_group)
    with tracker if tracker is not None else contextlib.nullcontext():
        if tracker is not None:
            tracker.classify(params, "params")
            if training.dp_gradients is not None:
                tracker.classify(training.dp_gradients.buffers(), "grads")
            tracker.classify([p.grad for p in params], "grads")   # kept from the last step (zero_gradients)
            tracker.classify([t for s in training.optimizer.state.values() for t in s.values()
                              if isinstance(t, torch.Tensor)], "optimizer")
        recorder.memory = tracker if tracker is not None else NullMemory()
        recorder.begin_step()
        multiplier = training.scaler.multiplier() / plan.num_microbatches
        losses = training.runtime.run(microbatches, loss_multiplier=multiplier)
        finish_gradients(training, spec, plan, dims, recorder)
        finite = training.scaler.unscale_and_check(params, dims.world_group)
        # a straggler's optimizer step is slow too, as the simulator's slowdown has it (sim/dp.py)
        with recorder.compute("optimizer", "optimizer", category="other"), training.runtime.compute_slowdown():
            if finite:
                training.optimizer.step()
        training.scaler.update(finite)
        seconds, events = recorder.end_step()
        recorder.memory = NullMemory()
    memory = None
    if tracker is not None:
        breakdown = tracker.breakdown()
        peak = tracker.peak_total
        if dims.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(dims.device)
        memory = (int(peak), {k: int(v) for k, v in breakdown.items()})
    return seconds, events, losses, finite, memory


def zero_gradients(training: Training) -> None:
    """Gradients live for the whole step, as Megatron-LM's persistent main-grad buffer: the DP
    path zeroes its flat buckets (``zero_grad_buffer``); without DP, existing ``.grad`` tensors
    are zeroed in place (only the first step creates them). Freeing them instead
    (``set_to_none``) would let a GPipe step's first backward run without gradients, a peak the
    simulator does not model (``costs.memory``: gradients are held from the step's start).
    FSDP (ZeRO-2/3) owns its sharded gradients and starts every step from none."""
    if training.dp_gradients is None and not training.fsdp:
        with torch.no_grad():
            for p in training.parameters():
                if p.grad is not None:
                    p.grad.zero_()
        return
    training.optimizer.zero_grad(set_to_none=True)
    if training.dp_gradients is not None:
        training.dp_gradients.begin_step()


def finish_gradients(training: Training, spec: ModelSpec, plan: Plan, dims: ParallelDims, recorder) -> None:
    chunks = list(training.chunks.values())
    if training.dp_gradients is not None:
        training.dp_gradients.finish()
    if plan.sp and plan.tp > 1:
        allreduce_sequence_parallel_grads(chunks, dims.tp_group, recorder)
    if spec.tied_embeddings and plan.pp > 1:
        allreduce_tied_embedding_grads(training.chunks, plan.pp * plan.vpp, dims.embedding_group, recorder)
    recorder.memory.classify([p.grad for p in training.parameters()], "grads")


def _arm_fault(training: Training, fault: FaultInjection | None, rank: int, step: int) -> None:
    """Misbehave after this rank's first action of the faulty step (crash, kill, hang), or be
    a straggler from that step on (slow)."""
    if fault is not None and fault.kind == "slow":
        slow = fault.rank == rank and step >= fault.step
        training.runtime.compute_slowdown = partial(compute_slowdown, fault.factor) if slow else contextlib.nullcontext
        return
    if fault is None or fault.rank != rank or fault.step != step or fault.kind == "absent":
        training.runtime.after_action = lambda action: None
        return

    def misbehave(action) -> None:
        if fault.kind == "crash":
            raise RuntimeError(f"injected fault: rank {rank} crashed at step {step} after {action}")
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "freeze":
            os.kill(os.getpid(), signal.SIGSTOP)
        while True:   # hang
            time.sleep(3600)

    training.runtime.after_action = misbehave


@contextlib.contextmanager
def compute_slowdown(factor: float):
    """Make the compute inside this block take ``factor`` x as long: after it, sleep
    (factor - 1) x the CPU time this thread spent in it. CPU time (``time.thread_time``) counts
    this rank's own computing only: the gloo collectives it waits for run on gloo's threads and
    block this one without CPU time, so communication is not stretched. Sleeping leaves the core
    free, as a slow accelerator leaves its host idle. One thread per rank (``processes``)."""
    start = time.thread_time()
    yield
    busy = time.thread_time() - start
    if factor > 1.0 and busy > 0:
        time.sleep((factor - 1.0) * busy)
