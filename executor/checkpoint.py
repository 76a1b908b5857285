"""Checkpoint and resume at a step boundary with ``torch.distributed.checkpoint`` (DCP), in a
plan-independent (canonical) form, so a run can resume under a different plan.

The checkpoint holds, per canonical parameter name (``model.canonical_name``), the full
tensor (``model/<name>``) and its AdamW moments (``optim/<name>/exp_avg``, ``.../exp_avg_sq``),
plus ``meta.json`` (step, AdamW step count, fp16 loss scale). Saving gathers each tensor
over the ZeRO-2/3 shards (``DTensor.full_tensor``) and the TP shards (all-gather), and exactly
one rank writes each name (tp rank 0, DP rank 0 or the ZeRO-1 owner, the first stage for the
tied embedding). Loading reads the full tensors of the stages a rank holds and cuts its
shards, so any plan can load any checkpoint (resharding by construction). The price is one
full tensor at a time in memory on save and the stage's full tensors on load.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor, distribute_tensor

from parsim.specs import ModelSpec, Plan

from .model import StageModule, canonical_name
from .parallel_dims import ParallelDims
from .tp_parallel import shard_tensor, tp_shard_dim, unshard_tensor

MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass
class CanonicalState:
    step: int                                    # steps completed
    model: dict[str, torch.Tensor]
    optim: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    optim_step: int = 0
    scaler: dict = field(default_factory=dict)


def _canonical_rows(name: str, local: torch.Tensor, spec: ModelSpec, tp: int) -> int:
    if name.endswith(("embed.token_weight", "head.weight")):
        return spec.vocab
    return local.shape[0] * (tp if tp_shard_dim(name) == 0 else 1)


def full_tensor(t: torch.Tensor, name: str, spec: ModelSpec, dims: ParallelDims) -> torch.Tensor:
    """Gather a stage tensor over ZeRO shards and TP shards (collective over dp and tp)."""
    local = t.full_tensor() if isinstance(t, DTensor) else t
    local = local.detach().contiguous()
    if dims.tp == 1 or tp_shard_dim(name) is None:
        return local
    parts = [torch.empty_like(local) for _ in range(dims.tp)]
    dist.all_gather(parts, local, group=dims.tp_group)
    return unshard_tensor(parts, name, _canonical_rows(name, local, spec, dims.tp))


def _is_writer_of_model(dims: ParallelDims, stage_name: str, spec: ModelSpec) -> bool:
    tied_copy = stage_name == "head.weight" and spec.tied_embeddings
    return dims.tp_rank == 0 and dims.dp_rank == 0 and not tied_copy


def gather_full_gradients(chunks: dict[int, StageModule], spec: ModelSpec, dims: ParallelDims) -> dict:
    """Canonical full gradients this rank writes (tests); every rank must call it."""
    out = {}
    for chunk in chunks.values():
        for name, p in chunk.named_parameters():
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            full = full_tensor(grad, name, spec, dims)
            if _is_writer_of_model(dims, name, spec):
                # a copy: .grad may be a view into a DDP bucket that the next step zeroes
                out[canonical_name(name, spec)] = full.detach().to("cpu", copy=True)
    return out


def gather_canonical(chunks: dict[int, StageModule], optimizer, spec: ModelSpec, plan: Plan, dims: ParallelDims,
                     with_optimizer: bool = True) -> tuple[dict, dict, int]:
    """(model, optimizer moments, AdamW step) entries this rank writes; every rank must call it."""
    model_state: dict[str, torch.Tensor] = {}
    optim_state: dict[str, dict[str, torch.Tensor]] = {}
    optim_step = 0
    owners = getattr(optimizer, "owned", None)
    owned = {id(p) for p in owners} if owners is not None else None
    for chunk in chunks.values():
        for name, p in chunk.named_parameters():
            cname = canonical_name(name, spec)
            full = full_tensor(p, name, spec, dims)
            if _is_writer_of_model(dims, name, spec):
                model_state[cname] = full.cpu()
            if not with_optimizer:
                continue
            state = optimizer.state.get(p, {})
            if not state:
                continue
            optim_step = int(state["step"])
            moments = {k: full_tensor(state[k], name, spec, dims).cpu() for k in MOMENTS}
            writer_dp = dims.dp_rank == 0 if owned is None else id(p) in owned
            if dims.tp_rank == 0 and writer_dp and not (name == "head.weight" and spec.tied_embeddings):
                optim_state[cname] = moments
    return model_state, optim_state, optim_step


def save_checkpoint(path: str, step: int, chunks, optimizer, scaler, spec: ModelSpec, plan: Plan,
                    dims: ParallelDims) -> None:
    model_state, optim_state, optim_step = gather_canonical(chunks, optimizer, spec, plan, dims)
    steps = torch.tensor([optim_step], device=dims.device)  # NCCL groups have no CPU backend
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
    if dist.get_rank() == 0:
        meta = {"step": step, "optim_step": int(steps.item()), "scaler": scaler.state_dict(),
                "model": spec.name, "plan": plan.to_string()}
        (Path(path) / "meta.json").write_text(json.dumps(meta, indent=1))
    dist.barrier()


def load_checkpoint(path: str, spec: ModelSpec, plan: Plan, stages: list[int], first_layers: list[int],
                    layer_counts: list[int], with_optimizer: bool = True) -> CanonicalState:
    meta = json.loads((Path(path) / "meta.json").read_text())
    shapes: dict[str, tuple[int, ...]] = {}
    num_stages = plan.pp * plan.vpp
    for s in stages:
        with torch.device("meta"):
            chunk = StageModule(spec, first_layers[s], layer_counts[s], is_first=s == 0, is_last=s == num_stages - 1)
        for name, p in chunk.named_parameters():
            shapes[canonical_name(name, spec)] = tuple(p.shape)
    template: dict = {"model": {n: torch.empty(shape) for n, shape in shapes.items()}}
    if with_optimizer:
        template["optim"] = {n: {k: torch.empty(shape) for k in MOMENTS} for n, shape in shapes.items()}
    dcp.load(template, checkpoint_id=path)
    return CanonicalState(step=int(meta["step"]), model=template["model"], optim=template.get("optim", {}),
                          optim_step=int(meta["optim_step"]), scaler=meta.get("scaler", {}))


def restore_optimizer_state(optimizer, chunks: dict[int, StageModule], spec: ModelSpec, plan: Plan,
                            dims: ParallelDims, restore: CanonicalState) -> None:
    """Put the checkpoint's AdamW moments into this rank's optimizer, cut like its parameters."""
    owners = getattr(optimizer, "owned", None)
    owned = {id(p) for p in owners} if owners is not None else None
    for chunk in chunks.values():
        for name, p in chunk.named_parameters():
            if owned is not None and id(p) not in owned:
                continue
            cname = canonical_name(name, spec)
            state = {"step": torch.tensor(float(restore.optim_step))}
            for k in MOMENTS:
                local = shard_tensor(restore.optim[cname][k], name, plan.tp, dims.tp_rank).to(dims.device)
                if isinstance(p, DTensor):
                    local = distribute_tensor(local, p.device_mesh, p.placements, src_data_rank=None)
                state[k] = local.clone()
            optimizer.state[p] = state
