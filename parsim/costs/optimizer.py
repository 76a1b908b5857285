"""One rank's optimizer step and what ZeRO-Offload moves over PCIe for it (seconds, bytes).

* The step: AdamW on the parameters the rank steps, its 1/dp shard under ZeRO >= 1
  (``costs.zero.zero_shard``; Rajbhandari et al. 2020 Sec. 5.1), priced by
  ``timing.optimizer_time`` on the device or, with ZeRO-Offload, on the host: its bytes, plus
  seconds per parameter tensor the rank steps where the profile measured that term
  (``rank_tensors``; ``tables.optimizer_per_tensor_s``, an optimizer looping over tensors in Python).
* ZeRO-Offload (Ren et al. 2021, Sec. 4): every reduced gradient bucket's 1/dp shard goes to the
  host as it is done (ZeRO-0/1 bucketed synchronisation); under ZeRO-2/3 the accumulated
  gradient shard goes down once, before the step; the updated parameter shard comes back after it.
* Tied embeddings over a pipeline: the first stage's word embedding and the last stage's output
  layer are two copies of one matrix, so before the step their gradients are all-reduced over
  the embedding group, the two pipeline ranks holding them (Megatron-LM
  ``_allreduce_word_embedding_grads`` after the DP gradient sync; the executor's
  ``pp_parallel.allreduce_tied_embedding_grads``): ``tied_embedding_sync``.
* ZeRO-Infinity (parameter offload, Rajbhandari et al. 2021): every ZeRO-3 gather of a layer is
  preceded by its parameter shard's copy from the host.

The SimPy engine (``sim.dp``, ``sim.engine``) plays these transfers on the device's PCIe port; the
fast path's tables hold them per pipeline rank (``fast.tables``).
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.specs import ClusterSpec, ModelSpec, Plan, plan_stack

from .memory import plan_state_bytes
from .ops import padded_vocab
from .params import layer_params, optimizer_tensor_sizes, optimizer_tensors
from .placement import rank_of_stage
from .timing import host_transfer_time, optimizer_time
from .zero import zero_shard


@dataclass(frozen=True)
class OptimizerStep:
    """The end of one rank's step after its gradients are reduced (seconds, bytes, parameters)."""
    params: float                 # parameters the rank steps (its ZeRO shard)
    on_host: bool                 # ZeRO-Offload: the step runs on the host's CPU
    grads_to_host: bool           # ZeRO-2/3 with offload: the accumulated gradient shard goes down first
    grads_to_host_bytes: float
    grads_to_host_s: float
    tensors: float                # parameter tensors the step loops over (0 where not priced)
    step_s: float                 # AdamW (on the device: before any host-sharing slowdown)
    params_from_host_bytes: float  # with offload: the updated parameter shard comes back
    params_from_host_s: float


def rank_tensors(cluster: ClusterSpec, model: ModelSpec, plan: Plan) -> list[float]:
    """Per pipeline rank: the parameter tensors its optimizer step loops over
    (``params.optimizer_tensors``), or 0 each where the profile prices no per-tensor term (the
    count would be multiplied by 0: ZeRO-1's partition is not worth playing then)."""
    tables = cluster.device.tables
    if not (tables.optimizer_per_tensor_s or tables.optimizer_sharded_per_tensor_s):
        return [0.0] * plan.pp
    return optimizer_tensors(model, plan)


def rank_tensor_sizes(cluster: ClusterSpec, model: ModelSpec, plan: Plan) -> list[tuple[float, ...]]:
    """Per pipeline rank: the elements of each tensor its optimizer step loops over, whole
    (``params.optimizer_tensor_sizes``; ``optimizer_step`` shards them under ZeRO-2/3), where the
    profile prices the step by cache level (``tables.optimizer_levels``); else () each."""
    if cluster.device.tables.optimizer_levels is None:
        return [()] * plan.pp
    return [tuple(t) for t in optimizer_tensor_sizes(model, plan)]


def optimizer_step(cluster: ClusterSpec, plan: Plan, rank_params: float, tensors: float = 0.0,
                   sizes: tuple[float, ...] = ()) -> OptimizerStep:
    """The optimizer step of a pipeline rank holding ``rank_params`` parameters, whose optimizer
    loops over ``tensors`` parameter tensors (``rank_tensors``) of ``sizes`` elements each
    (``rank_tensor_sizes``; under ZeRO-2/3 every tensor is sharded 1/dp, FSDP2, and stepped as a
    DTensor: ``timing.optimizer_time``'s ``sharded``), under ``plan``."""
    shard = zero_shard(rank_params, plan.dp, plan.zero, 1)
    sb = plan_state_bytes(plan)
    on_host = plan.offload != "none"
    grads = on_host and plan.zero >= 2
    grad_bytes = shard * sb.grad if grads else 0.0
    param_bytes = shard * sb.param if on_host else 0.0
    if sizes and plan.zero >= 2 and plan.dp > 1:
        sizes = tuple(e / plan.dp for e in sizes)
    return OptimizerStep(
        params=shard, on_host=on_host, grads_to_host=grads, grads_to_host_bytes=grad_bytes,
        grads_to_host_s=host_transfer_time(cluster, grad_bytes) if grads else 0.0,
        tensors=tensors, step_s=optimizer_time(cluster, shard, optimizer_dtype(plan), on_host=on_host, tensors=tensors,
                                               sizes=sizes, sharded=plan.zero >= 2 and plan.dp > 1),
        params_from_host_bytes=param_bytes,
        params_from_host_s=host_transfer_time(cluster, param_bytes) if on_host else 0.0)


def optimizer_dtype(plan: Plan) -> str:
    """The dtype whose AdamW bytes (``timing.adamw_bytes_per_param``) a plan's step moves: fp32
    under ``torch.autocast`` (``Stack.autocast``: the fp32 parameters are the master weights, no
    16-bit model copy is written back), else the plan's."""
    return "fp32" if plan_stack(plan).autocast else plan.dtype


def bucket_to_host(cluster: ClusterSpec, plan: Plan, bucket_bytes: float) -> tuple[float, float]:
    """ZeRO-Offload: (bytes, seconds) of a reduced gradient bucket's 1/dp shard going to the host."""
    nbytes = bucket_bytes / plan.dp
    return nbytes, host_transfer_time(cluster, nbytes)


def layer_shard_bytes(model: ModelSpec, plan: Plan) -> float:
    """ZeRO-3: bytes of one layer's parameter shard on a rank (1/dp of its parameters)."""
    return layer_params(model, plan.tp) * plan_state_bytes(plan).param / plan.dp


def layer_from_host_s(cluster: ClusterSpec, model: ModelSpec, plan: Plan) -> float:
    """ZeRO-Infinity: seconds to copy one layer's parameter shard from the host before its
    gather; 0 unless the parameters are offloaded."""
    if plan.offload != "optimizer+params":
        return 0.0
    return host_transfer_time(cluster, layer_shard_bytes(model, plan))


@dataclass(frozen=True)
class TiedSync:
    """The tied word embedding's gradient all-reduce between two pipeline ranks."""
    first: int            # pipeline rank holding the first stage (the embedding)
    last: int             # pipeline rank holding the last stage (the output layer)
    elements: float       # gradient elements each of them all-reduces (its TP shard; 1/dp under ZeRO-2/3)


def tied_embedding_sync(model: ModelSpec, plan: Plan) -> TiedSync | None:
    """The all-reduce that keeps the two copies of a tied embedding equal, or None where there is
    one copy (untied weights, pp = 1, or the V-shaped placements that put the first and the last
    stage on one rank, where the two gradients are summed in place). Each TP rank all-reduces its
    vocabulary shard of the (padded vocabulary x hidden) gradient; under ZeRO-2/3 a rank holds
    only its 1/dp shard of it (FSDP2's sharded gradients, ``.to_local()``)."""
    if not model.tied_embeddings or plan.pp == 1:
        return None
    first, last = rank_of_stage(plan, 0), rank_of_stage(plan, plan.num_stages - 1)
    if first == last:
        return None
    elements = padded_vocab(model, plan) * model.hidden / plan.tp
    return TiedSync(first, last, elements / plan.dp if plan.zero >= 2 else elements)
