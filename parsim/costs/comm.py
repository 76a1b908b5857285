"""Communication volumes of a plan: what is sent, how many bytes, over which group.

``nbytes`` is always the size of the *full* (unsharded) buffer the collective produces or
reduces, in bytes: an all-reduce of X, an all-gather whose output is X, a reduce-scatter
whose input is X. Times come from ``parsim.costs.timing``.
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.specs import ModelSpec, Plan, plan_stack

from .memory import plan_state_bytes
from .ops import DTYPE_BYTES
from .params import layer_params, stage_params


@dataclass(frozen=True)
class Collective:
    op: str        # "all_reduce" | "all_gather" | "reduce_scatter"
    nbytes: float  # full buffer, bytes
    group: str     # "tp" | "dp"
    name: str      # where in the layer it sits
    after: str = ""  # the op (parsim.costs.ops name) it follows; "" = at the layer start


def microbatch_activation_bytes(model: ModelSpec, plan: Plan, element_bytes: float | None = None) -> float:
    """b*s*h activations of one microbatch in the training dtype (or ``element_bytes`` each),
    bytes: the full buffer of every TP collective between a layer's ops (Shoeybi et al. 2019
    Fig. 3; with SP its all-gathers' output and reduce-scatters' input, Korthikanti et al. 2022
    Sec. 4.2.2) and, over t, the pipeline send (``p2p_bytes``)."""
    e = DTYPE_BYTES[plan.dtype] if element_bytes is None else element_bytes
    return float(plan.mbs * model.seq_len * model.hidden * e)


def _tp_buffers(model: ModelSpec, plan: Plan) -> tuple[float, float]:
    """(bytes of a TP collective on a GEMM's 16-bit output or its gradient, bytes of one on the
    residual stream's side: a norm's output entering the TP region, the embedding's output, or
    their gradients). Equal, except under ``torch.autocast`` (``saved.precision``), where the
    residual stream, the norms and the embedding stay fp32 (the executor's TP functions run on
    what they are given: ``executor/tp_communications.py``)."""
    from .saved import precision
    return microbatch_activation_bytes(model, plan), microbatch_activation_bytes(model, plan, precision(plan).res)


def tp_collectives_per_layer(model: ModelSpec, plan: Plan, phase: str) -> list[Collective]:
    """Megatron-LM TP collectives of one layer, one microbatch (phase "fwd" or "bwd").

    Without SP: forward all-reduces after attention-out and MLP-down ("g"), backward
    all-reduces the input gradients of QKV and MLP-up ("f") (Shoeybi et al. 2019, Fig. 3).
    With SP: each all-reduce becomes reduce-scatter + all-gather (Korthikanti et al. 2022,
    Sec. 4.2.2): forward all-gathers before QKV and MLP-up and reduce-scatters after
    attention-out and MLP-down; backward mirrors it. Buffer = b*s*h activations (``_tp_buffers``:
    fp32 on the residual stream's side under autocast).
    """
    if plan.tp == 1:
        return []
    out, res = _tp_buffers(model, plan)     # GEMM outputs' side, the residual stream's side
    up = "mlp_up_gate" if model.activation == "swiglu" else "mlp_up"
    if not plan.sp:
        if phase == "fwd":
            return [Collective("all_reduce", out, "tp", "attn_allreduce", after="attn_out"),
                    Collective("all_reduce", out, "tp", "mlp_allreduce", after="mlp_down")]
        return [Collective("all_reduce", res, "tp", "mlp_in_grad_allreduce", after=up),
                Collective("all_reduce", res, "tp", "attn_in_grad_allreduce", after="qkv")]
    if phase == "fwd":
        return [Collective("all_gather", res, "tp", "attn_in_allgather", after="input_norm"),
                Collective("reduce_scatter", out, "tp", "attn_out_reducescatter", after="attn_out"),
                Collective("all_gather", res, "tp", "mlp_in_allgather", after="post_attn_norm"),
                Collective("reduce_scatter", out, "tp", "mlp_out_reducescatter", after="mlp_down")]
    return [Collective("all_gather", out, "tp", "mlp_out_grad_allgather", after="mlp_residual"),
            Collective("reduce_scatter", res, "tp", "mlp_in_grad_reducescatter", after=up),
            Collective("all_gather", out, "tp", "attn_out_grad_allgather", after="attn_residual"),
            Collective("reduce_scatter", res, "tp", "attn_in_grad_reducescatter", after="qkv")]


def tp_collectives_edge(model: ModelSpec, plan: Plan, part: str, phase: str) -> list[Collective]:
    """TP collectives of the vocabulary-parallel embedding (``part`` "embedding") or output
    layer and loss ("head"), one microbatch, phase "fwd" or "bwd"; ``after`` names the
    ``costs.ops.embedding_ops`` / ``head_ops`` op they follow.

    Megatron-LM (Shoeybi et al. 2019 Sec. 3; ``tensor_parallel.layers.VocabParallelEmbedding``,
    ``vocab_parallel_cross_entropy``): each rank looks up only its vocabulary rows, so the
    embedding output is all-reduced over TP (with SP reduce-scattered along the sequence,
    Korthikanti et al. 2022 Sec. 4.2.2; backward: identity / all-gather). The output layer's
    input enters the TP region: identity forward and all-reduce of its gradient backward (SP:
    all-gather forward, reduce-scatter backward); buffers b*s*h. The vocab-parallel
    cross-entropy all-reduces the per-token logit max, then the target logit and the sum of
    exponentials, fp32 (4 bytes) per token: Megatron issues the last two as two calls of b*s,
    ``parsim.executor`` stacks them into one of 2*b*s, as modelled here."""
    if plan.tp == 1:
        return []
    act = _tp_buffers(model, plan)[1]       # the embedding's output, the final norm's: the stream's
    tokens = float(plan.mbs * model.seq_len)
    fwd = phase == "fwd"
    if part == "embedding":
        if fwd:
            op = "reduce_scatter" if plan.sp else "all_reduce"
            return [Collective(op, act, "tp", "embedding_reduce", after="embedding")]
        return [Collective("all_gather", act, "tp", "embedding_grad_allgather")] if plan.sp else []
    if part != "head":
        raise ValueError(f"part must be 'embedding' or 'head', not {part!r}")
    if fwd:
        enter = [Collective("all_gather", act, "tp", "head_in_allgather", after="final_norm")] if plan.sp else []
        return enter + [Collective("all_reduce", 4.0 * tokens, "tp", "loss_max_allreduce", after="logits"),
                        Collective("all_reduce", 8.0 * tokens, "tp", "loss_sum_allreduce", after="cross_entropy")]
    op = "reduce_scatter" if plan.sp else "all_reduce"
    return [Collective(op, act, "tp", "head_in_grad_reduce", after="logits")]


def p2p_bytes(model: ModelSpec, plan: Plan) -> float:
    """Bytes one device sends to the next pipeline stage per microbatch (activations forward,
    their gradients backward): b*s*h*e, divided by t with TP (the scatter/gather optimisation
    of Narayanan et al. 2021 Sec. 4.1, and natively with SP); the whole b*s*h*e from every TP
    rank where the stack's pipeline does not scatter (DeepSpeed's pipeline engine,
    ``Stack.p2p_scatter_gather``)."""
    full = microbatch_activation_bytes(model, plan)
    return full / plan.tp if plan_stack(plan).p2p_scatter_gather or plan.sp else full


# schedules whose pipeline sends hold a blocking stack's sender (``Stack.p2p_blocking``): a
# naive pipeline waits for every transfer anyway; the zero-bubble family's sends overlap
BLOCKING_SCHEDULES = ("gpipe", "1f1b", "interleaved")


def p2p_holds_sender(plan: Plan, schedule: str | None = None) -> bool:
    """Whether a pipeline send holds its sending stage until it is through (``Stack.p2p_blocking``
    under the GPipe, 1F1B and interleaved schedules): the stage's next pass starts after it.
    ``schedule``: instead of the plan's."""
    schedule = plan.schedule if schedule is None else schedule
    return plan.pp > 1 and schedule in BLOCKING_SCHEDULES and plan_stack(plan).p2p_blocking


def zero1_gradient_op(plan: Plan) -> str:
    """The collective a ZeRO-1 step of ``plan`` reduces its gradient buckets with: a
    reduce-scatter, each replica keeping the shard it steps (Rajbhandari et al. 2020 Sec. 5.1;
    DeepSpeed stage 1, Megatron's distributed optimizer), or an all-reduce where the plan's
    stack runs ZeRO-1 beside DDP (``Stack.zero1_all_reduce``: torch's ZeroRedundancyOptimizer,
    the executor's ZeroOneAdamW)."""
    return "all_reduce" if plan_stack(plan).zero1_all_reduce else "reduce_scatter"


def dp_grad_bytes(model: ModelSpec, plan: Plan, pp_rank: int) -> float:
    """Gradient bytes a device reduces over its DP group per step (its stage's grads)."""
    return stage_params(model, plan)[pp_rank] * plan_state_bytes(plan).grad


def dp_param_bytes(model: ModelSpec, plan: Plan, pp_rank: int) -> float:
    """Parameter bytes a ZeRO-1/2 device all-gathers after its sharded optimizer step."""
    return stage_params(model, plan)[pp_rank] * plan_state_bytes(plan).param


def zero3_gather_bytes_per_layer(model: ModelSpec, plan: Plan) -> float:
    """ZeRO-3: parameter bytes all-gathered per layer, in forward and again in backward
    (Rajbhandari et al. 2020 Sec. 7.2.2: 3x the DP volume in all)."""
    return layer_params(model, plan.tp) * plan_state_bytes(plan).param


def zero3_reduce_scatter_bytes_per_layer(model: ModelSpec, plan: Plan) -> float:
    """ZeRO-3: gradient bytes reduce-scattered per layer in backward."""
    return layer_params(model, plan.tp) * plan_state_bytes(plan).grad


def dp_buckets(total_bytes: float, bucket_bytes: int) -> list[float]:
    """Split a gradient buffer into DDP-style buckets (last one may be smaller)."""
    n, full, last = bucket_split(total_bytes, bucket_bytes)
    return [full] * (n - 1) + [last] if n else []


def bucket_split(total_bytes: float, bucket_bytes: int) -> tuple[int, float, float]:
    """``dp_buckets`` without the list: (number of buckets, bytes of each but the last, bytes of
    the last) -- for callers that only price them, whatever their number."""
    if total_bytes <= 0:
        return 0, 0.0, 0.0
    n = int(-(-total_bytes // bucket_bytes))
    return n, float(bucket_bytes), total_bytes - bucket_bytes * (n - 1)
