"""Memory per pipeline rank by category (params, grads, optimizer, activations, other).

Model states per parameter (bytes), Megatron-LM conventions (docs, "distributed optimizer"):
    fp32 training:        param 4, grad 4, optimizer 8 (Adam m, v)
    bf16 mixed:           param 2, grad 4, optimizer 12 (fp32 master, m, v): Megatron-LM forces
                          gradient accumulation and all-reduce in fp32 for bf16
                          (arguments.py: "bfloat16 requires gradient accumulation and
                          all-reduce to be done in fp32")
    fp16 mixed:           param 2, grad 2, optimizer 12: fp16 gradients reduced in fp16, the
                          ZeRO paper's 16-byte convention (Rajbhandari et al. 2020, Sec. 3.1)
ZeRO (Rajbhandari et al. 2020, Sec. 5): stage 1 shards the optimizer over the dp ranks,
stage 2 also the gradients, stage 3 also the parameters. ZeRO-Offload (Ren et al. 2021)
keeps optimizer states (and with "optimizer+params", parameters) in host memory.

Activations: stored bytes per microbatch (``activations``, Korthikanti et al. 2022) times the
microbatches in flight, plus the output a non-last stage keeps (``stage_output_bytes``); a
backward's working set on top (``rank_backward_working``: weight and activation gradients,
measured against the executor in tests/test_memory_model.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from parsim.specs import ClusterSpec, ModelSpec, Plan, stage_layers

from .activations import (backward_working_bytes, embedding_activation_bytes, head_activation_bytes,
                          inflight_microbatches, interleaved_peak_bytes, layer_activation_bytes, stage_output_bytes)
from .params import layer_params, stage_params

CATEGORIES = ("params", "grads", "optimizer", "activations", "other")


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model-state category."""
    param: float
    grad: float
    optimizer: float


def state_bytes(dtype: str) -> StateBytes:
    if dtype == "fp32":
        return StateBytes(4.0, 4.0, 8.0)
    if dtype == "fp16":
        return StateBytes(2.0, 2.0, 12.0)
    return StateBytes(2.0, 4.0, 12.0)


@dataclass(frozen=True)
class StageMemory:
    stage: int           # pipeline rank
    params: float        # bytes
    grads: float
    optimizer: float
    activations: float
    other: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.other

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total"] = self.total
        return d


def zero_model_state_bytes(num_params: float, dp: int, zero: int, k: float = 12.0,
                           param_bytes: float = 2.0, grad_bytes: float = 2.0) -> float:
    """Per-device model-state bytes in the ZeRO paper's convention (Rajbhandari et al. 2020,
    Sec. 5 / Fig. 1): (2 + 2 + K) Psi for DP; (2 + 2 + K/Nd) Psi for P_os;
    (2 + (2 + K)/Nd) Psi for P_os+g; (2 + 2 + K) Psi / Nd for P_os+g+p."""
    p, g, o = param_bytes, grad_bytes, k
    if zero >= 1:
        o /= dp
    if zero >= 2:
        g /= dp
    if zero >= 3:
        p /= dp
    return num_params * (p + g + o)


def rank_recompute(model: ModelSpec, plan: Plan, pp_rank: int) -> list[tuple[int, str]]:
    """(layers, recompute policy) groups held by a pipeline rank, per its virtual stages
    (``stage_recompute`` of each of them, in order)."""
    out: list[tuple[int, str]] = []
    for v in range(plan.vpp):
        out += stage_recompute(model, plan, pp_rank + v * plan.pp)
    return out


def stage_recompute(model: ModelSpec, plan: Plan, vstage: int) -> list[tuple[int, str]]:
    """(layers, recompute policy) groups of one virtual stage, in layer order.

    Stage-aware recomputation (Merak, Lai et al. 2023): stage v recomputes its first
    ``recompute_layers[v]`` layers fully and keeps the rest. Shifted critical path
    (Merak): the last pipeline rank does not recompute."""
    n = stage_layers(model, plan)[vstage]
    if plan.shifted_critical_path and vstage % plan.pp == plan.pp - 1 and plan.recompute != "none":
        return [(n, "none")]
    if plan.recompute == "stage-aware":
        r = plan.recompute_layers[vstage] if plan.recompute_layers is not None else n
        return [(r, "full"), (n - r, "none")]
    return [(n, plan.recompute)]


def fsdp2_bytes(model: ModelSpec, plan: Plan, n_params: float) -> tuple[float, float]:
    """ZeRO-2/3 run as FSDP2 (profiles with ``zero_copies: fsdp2``, the reference executor):
    (bytes held for the whole step, bytes held during a backward) beyond the ZeRO model.

    * ZeRO-2: FSDP2 keeps the sharded parameters (``n_params`` / dp) as the parameters' storage
      while the gathered ones stay resident across the step (reshard after the last backward).
    * ZeRO-2/3 backward: a layer's unsharded gradients and the flat reduce-scatter input they
      are copied into (FSDP2 ``foreach_reduce``) exist together until the collective ends:
      2 x the layer's gradient bytes."""
    if plan.zero < 2 or plan.dp <= 1:
        return 0.0, 0.0
    sb = state_bytes(plan.dtype)
    step = n_params * sb.param / plan.dp if plan.zero == 2 else 0.0
    return step, 2 * layer_params(model, plan.tp) * sb.grad


def uses_fsdp2(cluster: ClusterSpec | None) -> bool:
    return cluster is not None and cluster.device.tables.fsdp2_copies


def memory_by_stage(model: ModelSpec, plan: Plan, cluster: ClusterSpec | None = None) -> list[StageMemory]:
    """Peak memory of every pipeline rank (per device; TP and DP peers are identical)."""
    sb = state_bytes(plan.dtype)
    m = plan.num_microbatches
    params_per_rank = stage_params(model, plan)
    out = []
    for r in range(plan.pp):
        n = params_per_rank[r]
        dp = plan.dp
        params = n * sb.param / (dp if plan.zero >= 3 else 1)
        grads = n * sb.grad / (dp if plan.zero >= 2 else 1)
        optimizer = n * sb.optimizer / (dp if plan.zero >= 1 else 1)
        other = 0.0
        if plan.offload in ("optimizer", "optimizer+params"):
            optimizer = 0.0
            grads = 0.0                    # ZeRO-Offload streams gradients to host
            other += plan.dp_bucket_bytes  # one gradient bucket in flight over PCIe
        if plan.offload == "optimizer+params":
            params = 0.0
        if plan.zero >= 3 or plan.offload == "optimizer+params":
            # ZeRO-3 materialises the full parameters of the current and the prefetched layer.
            other += 2 * layer_params(model, plan.tp) * sb.param
        in_backward = 0.0
        if uses_fsdp2(cluster):
            held, in_backward = fsdp2_bytes(model, plan, n)
            params += held
            other += in_backward
        # The layer being recomputed briefly holds its full activations again.
        transient = layer_activation_bytes(model, plan, "none") - layer_activation_bytes(model, plan, "full")
        working = rank_backward_working(model, plan, r, weight_grads=in_backward == 0.0)
        if plan.schedule == "interleaved":
            # chunks differ (layers, recompute, embedding / head): count each one's microbatches
            chunks = [plan.pp * c + r for c in range(plan.vpp)]
            act, extra = interleaved_peak_bytes(
                plan.pp, m, plan.vpp, r, [chunk_activation_bytes(model, plan, s) for s in chunks],
                [(transient if recomputes_fully(model, plan, s) else 0.0) + working for s in chunks])
            other += extra
            out.append(StageMemory(stage=r, params=params, grads=grads, optimizer=optimizer,
                                   activations=act, other=other))
            continue
        inflight = inflight_microbatches(plan.schedule, plan.pp, m, r, plan.vpp)
        act = 0.0
        for layers, policy in rank_recompute(model, plan, r):
            act += layers * layer_activation_bytes(model, plan, policy)
        act *= inflight
        if any(policy == "full" and layers for layers, policy in rank_recompute(model, plan, r)):
            other += transient
        if r == 0:
            act += embedding_activation_bytes(model, plan) * inflight
        if r == plan.pp - 1:
            act += head_activation_bytes(model, plan) * (m if plan.schedule == "gpipe" else 1)
        else:
            act += stage_output_bytes(model, plan) * inflight
        other += working
        out.append(StageMemory(stage=r, params=params, grads=grads, optimizer=optimizer,
                               activations=act, other=other))
    return out


def chunk_stash_bytes(model: ModelSpec, plan: Plan, vstage: int) -> float:
    """Bytes one microbatch stores for backward in one virtual stage: its layers (per recompute
    policy), the embedding's dropout mask on the first, the head's on the last."""
    act = sum(n * layer_activation_bytes(model, plan, policy) for n, policy in stage_recompute(model, plan, vstage))
    if vstage == 0:
        act += embedding_activation_bytes(model, plan)
    if vstage == plan.pp * plan.vpp - 1:
        act += head_activation_bytes(model, plan)
    return act


def chunk_activation_bytes(model: ModelSpec, plan: Plan, vstage: int) -> float:
    """Bytes one microbatch holds in one virtual stage from its forward to its backward: the
    stash, and the output sent on every stage but the last (``stage_output_bytes``)."""
    last = vstage == plan.pp * plan.vpp - 1
    return chunk_stash_bytes(model, plan, vstage) + (0.0 if last else stage_output_bytes(model, plan))


def rank_backward_working(model: ModelSpec, plan: Plan, pp_rank: int, weight_grads: bool = True) -> float:
    """What a backward on this pipeline rank holds beyond the stored activations (``other``):
    ``activations.backward_working_bytes`` of its virtual stages, the largest of them (a chunk's
    stash is freed as its backward goes). One value per rank, so the SimPy timeline, this
    analytic model and the fast path count it alike under interleaving, where it overstates the
    first and last ranks' other chunks by at most the head's or embedding's extra."""
    last = plan.pp * plan.vpp - 1
    return max(backward_working_bytes(model, plan, vstage == 0, vstage == last,
                                      chunk_stash_bytes(model, plan, vstage), weight_grads)
               for vstage in range(pp_rank, plan.pp * plan.vpp, plan.pp))


def recomputes_fully(model: ModelSpec, plan: Plan, vstage: int) -> bool:
    return any(policy == "full" and n for n, policy in stage_recompute(model, plan, vstage))


def device_capacity(cluster: ClusterSpec) -> float:
    """Bytes a framework can allocate on one device."""
    return cluster.device.memory_bytes * cluster.device.usable_memory_fraction


def fits(model: ModelSpec, plan: Plan, cluster: ClusterSpec) -> bool:
    cap = device_capacity(cluster)
    return all(s.total <= cap for s in memory_by_stage(model, plan, cluster))
