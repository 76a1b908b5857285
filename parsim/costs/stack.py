"""How the software stack (``parsim.specs.stack``) acts on the costs.

``apply_stack(model, cluster, plan)`` is called once where an engine starts (SimPy
``simulate``, the fast path's ``evaluate`` / ``build_tables``, ``memory_by_stage``, the
partitioner, a sweep): it names the stack (the plan's, or the profile's ``default_stack`` for
``stack=auto``), takes this GPU's numbers for it (the profile's ``device.stacks`` entry over the
preset) and returns

* the model with the stack's attention implementation (flash or unfused),
* the cluster whose device carries the stack's efficiencies folded into the profile's own
  fields, so every op is priced as this stack runs it (``costs.timing``):
      GEMM ceiling        gemm.max_efficiency x stack.gemm_efficiency
      flash attention     attention_efficiency x stack.attention_efficiency
                          (cudnn_attention_efficiency where the stack runs cuDNN's kernel and
                          the profile rates it: Transformer Engine on Hopper)
      per-op gap          kernel_overhead_s + stack.op_overhead_s
      usable memory       (memory_bytes - memory_reserve_bytes) / (1 + fragmentation)
  and ``device.stack`` set (applying the same stack again is a no-op),
* the plan with its stack named and the DP overlap the stack can do.

The stack's other terms are each written once, where their rule is: here the backward TP
collective hidden behind the weight-gradient GEMM (``tp_covered``), the NCCL-on-SM compute
slowdown (``comm_compute_slowdown``, read by ``costs.host``'s interference) and the ZeRO
collectives' share of NCCL bandwidth (``zero_comm_factor``); flash attention's rise with
sequence length in ``costs.timing``; the pipeline send size (``costs.comm.p2p_bytes``), the
loss's logits bytes (``costs.activations``, ``costs.ops``), the ZeRO-3 shards and gathered
layers and the optimizer step's temporaries (``costs.memory``, ``costs.footprint``) from the
plan's stack (``specs.plan_stack``). The torch stack changes nothing: every factor is 1 and every
term 0.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from parsim.specs import ClusterSpec, DeviceProfile, ModelSpec, Plan
from parsim.specs.stack import AUTO, Stack, get_stack

from .fsdp2 import fsdp_unit_time
from .ops import Op
from .timing import op_time


def stack_name(cluster: ClusterSpec | None, requested: str) -> str:
    """The stack a plan asking for ``requested`` runs on ``cluster``."""
    if requested != AUTO:
        return get_stack(requested).name
    return cluster.device.default_stack if cluster is not None else get_stack("torch").name


def resolve_stack(cluster: ClusterSpec, requested: str) -> Stack:
    """This GPU's numbers for the stack: the profile's ``device.stacks`` entry, else the preset."""
    name = stack_name(cluster, requested)
    return cluster.device.stacks.get(name) or get_stack(name)


def apply_stack(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> tuple[ModelSpec, ClusterSpec, Plan]:
    """(model, cluster, plan) as the plan's stack runs them (the module's docstring)."""
    stack, cluster, plan = apply_stack_to_run(cluster, plan)
    return stack_model(model, stack), cluster, plan


def apply_stack_to_run(cluster: ClusterSpec, plan: Plan) -> tuple[Stack, ClusterSpec, Plan]:
    """``apply_stack`` without a ModelSpec (the partitioner's traced torch models): the stack,
    the cluster as it runs it, the plan with the stack named and the DP overlap it can do."""
    applied = cluster.device.stack
    stack = applied if applied is not None and plan.stack == AUTO else resolve_stack(cluster, plan.stack)
    plan = plan if plan.stack == stack.name else plan.replace(stack=stack.name)
    if plan.dp_overlap and not stack.grad_reduce_overlap:
        plan = plan.replace(dp_overlap=False)
    return stack, stack_cluster(cluster, stack), plan


def default_stack_cluster(cluster: ClusterSpec) -> ClusterSpec:
    """The cluster under its applied stack, or under the profile's default one."""
    return cluster if cluster.device.stack is not None else stack_cluster(cluster, resolve_stack(cluster, AUTO))


def stack_model(model: ModelSpec, stack: Stack) -> ModelSpec:
    if stack.flash_attention is None or stack.flash_attention == model.flash_attention:
        return model
    return replace(model, flash_attention=stack.flash_attention)


def stack_cluster(cluster: ClusterSpec, stack: Stack) -> ClusterSpec:
    """The cluster whose device prices ops as ``stack`` runs them (a device that already runs
    a stack keeps it; another one is an error: a cluster runs one stack)."""
    dev = cluster.device
    if dev.stack is not None:
        if dev.stack.name != stack.name:
            raise ValueError(f"cluster already runs stack {dev.stack.name}, not {stack.name}")
        return cluster
    usable = dev.usable_memory_fraction
    if stack.memory_reserve_bytes is not None or stack.fragmentation is not None:
        reserve = stack.memory_reserve_bytes or 0.0
        usable = max(dev.memory_bytes - reserve, 0.0) / (1.0 + (stack.fragmentation or 0.0)) / dev.memory_bytes
    device = replace(dev, gemm=replace(dev.gemm, max_efficiency=dev.gemm.max_efficiency * stack.gemm_efficiency),
                     attention_efficiency=attention_rate(dev, stack) * stack.attention_efficiency,
                     kernel_overhead_s=dev.kernel_overhead_s + stack.op_overhead_s,
                     usable_memory_fraction=usable, stack=stack)
    return replace(cluster, device=device)


def attention_rate(dev: DeviceProfile, stack: Stack) -> float:
    """The fused-attention rate (fraction of peak) of the kernel ``stack`` runs on ``dev``:
    cuDNN's where the stack prefers it and the profile states it, else the flash one."""
    if stack.cudnn_attention and dev.cudnn_attention_efficiency > 0:
        return dev.cudnn_attention_efficiency
    return dev.attention_efficiency


def tp_covered(device: DeviceProfile, ops: list[Op], after: str, pass_: str, dtype: str) -> float:
    """Seconds of a backward TP collective the stack hides behind compute: Megatron-LM (>= 2022)
    launches the input-gradient all-reduce (SP: reduce-scatter) asynchronously and computes the
    weight gradient of the same linear layer meanwhile (``--async-tensor-model-parallel-allreduce``,
    Korthikanti et al. 2022 Sec. 4.2.2), so only max(0, collective - that wgrad GEMM) is
    exposed. 0 unless the stack does it and the pass ("bwd") computes weight gradients;
    ``after`` names the op the collective follows (``costs.comm.Collective.after``)."""
    stack = device.stack
    if stack is None or not stack.tp_bwd_overlap or pass_ != "bwd" or not after:
        return 0.0
    return sum(op_time(device, op, "bwd_weight", dtype) for op in ops if op.name == after)


def comm_compute_slowdown(cluster: ClusterSpec) -> float:
    """Compute seconds a GPU loses per second of collective overlapping its compute: NCCL
    kernels run on the same SMs (one thread block per channel) and share HBM bandwidth, so
    "overlapped" communication still slows the GEMMs beside it (Rajbhandari et al. 2021,
    ZeRO-Infinity Sec. 6; NCCL docs, NCCL_MAX_NCHANNELS). Dimensionless; 0 without a stack."""
    stack = cluster.device.stack
    return stack.comm_compute_slowdown if stack is not None else 0.0


def zero_comm_factor(cluster: ClusterSpec) -> float:
    """Time factor on the ZeRO collectives of every layer (ZeRO-3 gathers and reduce-scatters,
    ZeRO-2's per-part reduce-scatters): 1 / the fraction of NCCL's bandwidth the stack's ZeRO
    collectives reach (DeepSpeed's per-tensor ZeRO-3 gathers reach far less than one flat
    buffer's). Dimensionless, 1 without a stack."""
    stack = cluster.device.stack
    eff = stack.zero_comm_efficiency if stack is not None else 1.0
    return 1.0 / eff if eff > 0 else 1.0


def zero_unit_time(cluster: ClusterSpec, op: str, nbytes: float, dp: int,
                   collective: Callable[[bool], float]) -> tuple[float, float, float]:
    """(seconds before, the collective's seconds, seconds after) of one ZeRO-2/3 unit's
    collective ``op`` of ``nbytes`` (the unit's full parameters or gradients) over ``dp`` ranks,
    the one rule both engines price a ZeRO unit by: the collective at the share of NCCL
    bandwidth the stack's ZeRO collectives reach (``zero_comm_factor``), priced in situ where
    ZeRO collectives block the rank (``tables.zero_blocking``: gloo on the host's own cores,
    FSDP2 without side streams); ``collective(in_situ)`` prices the bare call, memoised by the
    caller. Around it, where ZeRO runs as FSDP2 (the profile's ``tables.fsdp2_copies``: the
    calibrated executor; the stack's ``fsdp2_copies``), FSDP2's copies and host work
    (``fsdp2.fsdp_unit_time``): compute the rank runs before and after the call where
    collectives block it. Beside side streams (a GPU) only the all-gather's copy-out is owed to
    the compute: FSDP2 runs it on the compute stream once the gather is waited for
    (``FSDPParamGroup.wait_for_unshard``), while its copy-ins run on the streams of the
    collectives they feed, ahead of them (``foreach_all_gather``'s copy-in stream,
    ``foreach_reduce`` on the reduce-scatter stream), and its host work runs ahead of the GPU."""
    tables = cluster.device.tables
    stack = cluster.device.stack
    fsdp2 = tables.fsdp2_copies or (stack is not None and stack.fsdp2_copies)
    before, after = fsdp_unit_time(cluster.device, op, nbytes, dp) if fsdp2 and nbytes > 0 else (0.0, 0.0)
    blocking = bool(tables.zero_blocking)
    return before if blocking else 0.0, collective(blocking) * zero_comm_factor(cluster), after
