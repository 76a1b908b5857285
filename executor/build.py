"""Build this rank's part of the training: model chunks with every parallelism applied, in a
fixed order (torchtitan): init full weights -> ``apply_tp`` -> ``apply_ac`` ->
``apply_fsdp`` (ZeRO-2/3) or ``apply_ddp`` (DP / ZeRO-0/1) -> optimizer -> pipeline runtime.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from parsim.schedules import Schedule, build_schedule_for_plan
from parsim.schedules.ir import leaf_actions
from parsim.specs import ModelSpec, Plan, SpecError, stage_layers

from .dp_parallel import DataParallelGradients, apply_ddp
from .model import StageModule, canonical_name
from .optimizer import AUTOCAST_DTYPES, LossScaler, autocast_factory, make_adamw
from .parallel_dims import ParallelDims
from .pp_communications import PipelineP2P
from .pp_parallel import PipelineRuntime
from .recompute import apply_ac
from .tp_parallel import apply_tp
from .weights import blank_stage, fill_parameters
from .zero import ZeroOneAdamW, apply_fsdp

if TYPE_CHECKING:
    from .checkpoint import CanonicalState


@dataclass
class Training:
    schedule: Schedule
    chunks: dict[int, StageModule]        # virtual stage -> module
    optimizer: object
    dp_gradients: DataParallelGradients | None
    scaler: LossScaler
    runtime: PipelineRuntime
    fsdp: bool

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for c in self.chunks.values() for p in c.parameters()]


def stage_first_layers(model: ModelSpec, plan: Plan) -> list[int]:
    counts = stage_layers(model, plan)
    return [sum(counts[:s]) for s in range(len(counts))]


def build_chunk(model: ModelSpec, plan: Plan, stage: int, dims: ParallelDims, recorder, seed: int,
                restore: "CanonicalState | None") -> StageModule:
    counts = stage_layers(model, plan)
    num_stages = plan.pp * plan.vpp
    chunk = blank_stage(model, stage_first_layers(model, plan)[stage], counts[stage],
                        is_first=stage == 0, is_last=stage == num_stages - 1)
    # full-size initial (or restored) weights, identical on every plan
    named = [(p, canonical_name(name, model)) for name, p in chunk.named_parameters()]
    if restore is None:
        fill_parameters(named, model, seed)
    else:
        with torch.no_grad():
            for p, cname in named:
                p.copy_(restore.model[cname])
    if plan.tp > 1:
        apply_tp(chunk, dims.tp_group, plan.tp, dims.tp_rank, plan.sp, recorder,
                 subpipe=plan.tp_overlap == "subpipe")
    apply_ac(chunk, plan, stage)
    return chunk.to(dims.device)


def build_training(model: ModelSpec, plan: Plan, dims: ParallelDims, recorder, seed: int,
                   restore: "CanonicalState | None" = None) -> Training:
    schedule = build_schedule_for_plan(plan)
    split = any(a.kind in ("I", "W") for order in schedule.actions for item in order for a in leaf_actions([item]))
    if split and plan.zero >= 2 and plan.dp > 1:
        raise SpecError("zero", plan.zero, f"zero <= 1 with schedule={plan.schedule}: the executor's FSDP "
                        "(ZeRO-2/3) does not run a backward split into input and weight gradients")
    stages = schedule.stages_of_rank(dims.pp_rank)
    chunks = {s: build_chunk(model, plan, s, dims, recorder, seed, restore) for s in stages}

    fsdp = plan.zero >= 2 and plan.dp > 1
    dp_gradients = None
    if fsdp:
        for chunk in chunks.values():
            apply_fsdp(chunk, dims.dp_mesh(), reshard_after_forward=plan.zero == 3, recorder=recorder)
    elif plan.dp > 1:
        dp_gradients = apply_ddp(list(chunks.values()), dims.dp_group, plan.dp, plan.dp_bucket_bytes,
                                 plan.dp_overlap, plan.num_microbatches, recorder)

    params = [p for c in chunks.values() for p in c.parameters()]
    if plan.zero == 1 and plan.dp > 1:
        optimizer = ZeroOneAdamW(params, dims.dp_group, dims.dp_rank, [dims.dp_peer(d) for d in range(plan.dp)],
                                 recorder, plan.dp_bucket_bytes)
    else:
        optimizer = make_adamw(params)
    if restore is not None:
        from .checkpoint import restore_optimizer_state
        restore_optimizer_state(optimizer, chunks, model, plan, dims, restore)

    p2p = None
    if plan.pp > 1:
        seq = model.seq_len // plan.tp if plan.sp else model.seq_len
        dtype = AUTOCAST_DTYPES.get(plan.dtype, torch.float32)
        p2p = PipelineP2P(schedule, dims, (plan.mbs, seq, model.hidden), dtype, recorder)

    def classify_grads(stage: int) -> None:
        recorder.memory.classify([p.grad for p in chunks[stage].parameters()], "grads")

    def keep_gathered(stage: int, last: bool) -> None:
        # ZeRO-2: the parameters stay gathered from the step's first forward to the stage's last
        # backward, resharded only then, before the optimizer step (``zero`` module docstring)
        chunks[stage].set_reshard_after_backward(last)

    runtime = PipelineRuntime(schedule, dims.pp_rank, chunks, p2p, recorder, autocast_factory(plan.dtype, dims.device),
                              on_backward_done=classify_grads,
                              before_backward=keep_gathered if fsdp and plan.zero == 2 else None,
                              on_weights=dp_gradients.accumulated if dp_gradients is not None else None)
    scaler = LossScaler(enabled=plan.dtype == "fp16")
    if restore is not None and restore.scaler:
        scaler.load_state_dict(restore.scaler)
    return Training(schedule, chunks, optimizer, dp_gradients, scaler, runtime, fsdp)
