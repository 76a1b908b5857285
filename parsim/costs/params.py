"""Parameter counts per layer / per pipeline stage, per device (after TP sharding).

Total for GPT shapes: P = 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h))  (Narayanan et al. 2021, Eq. 2).
"""
from __future__ import annotations

import heapq

from parsim.specs import ModelSpec, Plan, SpecError, plan_stack, stage_layers

from . import footprint
from .ops import padded_vocab
from .placement import rank_of_stage, stages_of_rank


def layer_params(model: ModelSpec, tp: int = 1) -> float:
    """Parameters of one transformer layer held by one TP rank (count, not bytes).

    Column-parallel weights/biases (QKV, MLP-up) and row-parallel weights (attn-out,
    MLP-down) are split t ways; row-parallel biases and norms are replicated (Megatron-LM).
    """
    h, kv, f = model.hidden, model.kv_hidden, model.ffn_hidden
    qkv = h * (h + 2 * kv)
    out = h * h
    mlp = (3 if model.activation == "swiglu" else 2) * h * f
    sharded = qkv + out + mlp
    replicated = 0.0
    if model.bias:
        sharded += (h + 2 * kv) + (2 * f if model.activation == "swiglu" else f)   # column biases
        replicated += 2 * h                                                         # row biases
    norm = 2 * h if model.norm == "layernorm" else h
    replicated += 2 * norm
    return sharded / tp + replicated


def embedding_params(model: ModelSpec, plan: Plan) -> float:
    """Word embedding (vocab-parallel, split tp ways) + learned positions (replicated)."""
    words = padded_vocab(model, plan) * model.hidden / plan.tp
    pos = model.seq_len * model.hidden if model.position == "learned" else 0
    return words + pos


def head_params(model: ModelSpec, plan: Plan) -> float:
    """Final norm + output projection. Tied embeddings: with pp=1 the output layer reuses the
    embedding; with pp>1 the last stage keeps its own copy of the word embedding (Megatron-LM)."""
    norm = 2 * model.hidden if model.norm == "layernorm" else model.hidden
    words = padded_vocab(model, plan) * model.hidden / plan.tp
    if model.tied_embeddings and plan.pp == 1:
        return norm
    return norm + words


def stage_params(model: ModelSpec, plan: Plan) -> list[float]:
    """Parameters held by each pipeline rank (its vpp virtual stages, placed as the schedule
    places them: ``placement``), per TP rank."""
    per_layer = layer_params(model, plan.tp)
    layers = stage_layers(model, plan)
    out = [0.0] * plan.pp
    for vstage, n in enumerate(layers):
        out[rank_of_stage(plan, vstage)] += n * per_layer
    out[rank_of_stage(plan, 0)] += embedding_params(model, plan)
    out[rank_of_stage(plan, plan.pp * plan.vpp - 1)] += head_params(model, plan)
    return out


def total_params(model: ModelSpec) -> float:
    """Unique parameters of the whole model (tp=pp=1, unpadded vocab)."""
    h = model.hidden
    norm = 2 * h if model.norm == "layernorm" else h
    emb = model.vocab * h + (model.seq_len * h if model.position == "learned" else 0)
    head = norm + (0 if model.tied_embeddings else model.vocab * h)
    return model.layers * layer_params(model, 1) + emb + head


def eq2_params(model: ModelSpec) -> float:
    """Narayanan et al. 2021 Eq. 2 literally (GPT shapes)."""
    L, h, V, s = model.layers, model.hidden, model.vocab, model.seq_len
    return 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))


# ----------------------------------------------------------------------------- parameter tensors

def layer_tensor_order(model: ModelSpec, tp: int = 1) -> list[tuple[float, bool]]:
    """(elements, is a matrix) of each parameter tensor of one transformer layer on one TP rank,
    in the order the torch executor's ``Block.parameters()`` lists them (``executor/model.py``:
    attn_norm, q, k, v, o, mlp_norm, up, (gate), down; each ``nn.Linear``'s weight, then its
    bias where ``model.bias``; LayerNorm's bias too, RMSNorm has none). Column-parallel weights
    and biases split tp ways, row-parallel weights split, row biases and norms replicated
    (Megatron-LM, as ``layer_params``)."""
    h, kv, f, b = model.hidden, model.kv_hidden, model.ffn_hidden, model.bias
    norm = [(float(h), False)] * (2 if model.norm == "layernorm" and b else 1)

    def linear(weight: float, bias: float) -> list[tuple[float, bool]]:
        return [(weight, True)] + ([(bias, False)] if b else [])

    column_mlp = linear(h * f / tp, f / tp) * (2 if model.activation == "swiglu" else 1)
    return (norm + linear(h * h / tp, h / tp) + linear(h * kv / tp, kv / tp) * 2 + linear(h * h / tp, h)
            + norm + column_mlp + linear(f * h / tp, h))


def layer_tensors(model: ModelSpec, tp: int = 1) -> list[float]:
    """Elements of each parameter tensor of one transformer layer on one TP rank
    (``layer_tensor_order``)."""
    return [size for size, _ in layer_tensor_order(model, tp)]


# the most parameter tensors one pipeline rank may hold (``rank_tensor_order`` lists each, ~70
# bytes apiece): ~60,000 layers of 16 tensors, 400x the largest published models' ranks; past it a
# model is unbounded (10^12 layers took `parsim memory` to a MemoryError, make fuzz, 2026-12-02)
MAX_RANK_TENSORS = 1_000_000


def rank_tensor_order(model: ModelSpec, plan: Plan) -> list[list[tuple[float, bool]]]:
    """(elements, is a matrix) of every parameter tensor each pipeline rank holds, in the order
    the executor hands them to its optimizer (``executor/build.py``: the rank's model chunks as
    ``placement.stages_of_rank`` orders them, each ``StageModule``'s parameters: the word (+
    learned position) embedding on the first chunk, its layers, the head's own output weight
    (its ``Parameter`` comes before its norm's: a module lists its own first) and final norm on
    the last; the tied embedding is reused only by a single-chunk model). The
    executor pads the vocabulary to a multiple of tp rows only (``executor/tp_parallel.py``
    ``padded_rows``), not to Megatron's 128 x tp: sizes decide ZeRO-1's partition."""
    h = model.hidden
    words = float(-(-model.vocab // plan.tp) * h)
    norm = [(float(h), False)] * (2 if model.norm == "layernorm" and model.bias else 1)
    layer, per_stage = layer_tensor_order(model, plan.tp), stage_layers(model, plan)
    held = max(sum(per_stage[v] for v in stages_of_rank(plan, r)) for r in range(plan.pp)) * len(layer)
    if held > MAX_RANK_TENSORS:
        raise SpecError("model.layers", model.layers,
                        f"at most {MAX_RANK_TENSORS:,} parameter tensors on one pipeline rank (its layers x "
                        f"{len(layer)} tensors a layer: {held:,}; the memory model lists them one by one): "
                        f"fewer layers, or more pipeline stages")
    last = plan.pp * plan.vpp - 1
    out: list[list[tuple[float, bool]]] = []
    for rank in range(plan.pp):
        tensors: list[tuple[float, bool]] = []
        for vstage in stages_of_rank(plan, rank):
            if vstage == 0:
                tensors += [(words, True)] + ([(float(model.seq_len * h), True)] if model.position == "learned" else [])
            tensors += layer * per_stage[vstage]
            if vstage == last:
                tensors += ([] if model.tied_embeddings and last == 0 else [(words, True)]) + norm
        out.append(tensors)
    return out


def stage_tensors(model: ModelSpec, plan: Plan) -> list[list[float]]:
    """Elements of every parameter tensor each pipeline rank holds, in its optimizer's order
    (``rank_tensor_order``)."""
    return [[size for size, _ in tensors] for tensors in rank_tensor_order(model, plan)]


def step_windows(model: ModelSpec, plan: Plan, replicas: bool = False) -> list[float]:
    """Per pipeline rank: the elements of fp32 temporaries its optimizer step holds at its
    heaviest moment (``footprint.step_window`` under the plan's stack) over the tensors it
    steps, in order: all it holds (ZeRO-2/3 and a flat ZeRO-1 step a 1/dp shard of each,
    ``footprint.optimizer_temporaries``), or with ``replicas`` (ZeRO-1 giving whole tensors to
    replicas, ``Stack.zero1_whole_tensors``) the heaviest of the ``plan.dp`` replicas' own
    tensors, which keep their order (``executor/zero.py``: ``ZeroOneAdamW.owned``)."""
    stack = plan_stack(plan)
    out = []
    for tensors in rank_tensor_order(model, plan):
        owners = whole_tensor_owners([size for size, _ in tensors], plan.dp) if replicas else [0] * len(tensors)
        out.append(max((footprint.step_window([t for t, o in zip(tensors, owners) if o == r],
                                              stack.optimizer_temporaries, stack.optimizer_carry)
                        for r in set(owners)), default=0.0))
    return out


def embedding_largest_tensor(model: ModelSpec, plan: Plan) -> float:
    """Elements of the embedding's largest parameter tensor per TP rank: its word embedding
    (padded and split as ``embedding_params``) or its learned positions."""
    words = padded_vocab(model, plan) * model.hidden / plan.tp
    return max(words, model.seq_len * model.hidden if model.position == "learned" else 0.0)


def head_largest_tensor(model: ModelSpec, plan: Plan) -> float:
    """Elements of the head's largest parameter tensor per TP rank: its output weight, or the
    final norm's where tied embeddings leave it none of its own (``head_params``)."""
    if model.tied_embeddings and plan.pp == 1:
        return float(model.hidden)
    return padded_vocab(model, plan) * model.hidden / plan.tp


def optimizer_tensor_sizes(model: ModelSpec, plan: Plan) -> list[list[float]]:
    """Elements of the parameter tensors one rank's optimizer steps over, per pipeline rank:
    all it holds (ZeRO-2/3 shard every tensor, FSDP2: ``costs.optimizer.optimizer_step`` takes
    1/dp of each), or under ZeRO-1 the tensors of the replica that owns the most when whole
    tensors go, largest first, to the least-loaded replica (the executor's
    ``zero.partition_parameters``, as torch's ZeroRedundancyOptimizer)."""
    per_rank = stage_tensors(model, plan)
    if plan.zero != 1 or plan.dp == 1:
        return per_rank
    return [max(_whole_tensor_partition(tensors, plan.dp), key=len) for tensors in per_rank]


def zero1_owned_params(model: ModelSpec, plan: Plan) -> list[float]:
    """Per pipeline rank: the elements of the replica that owns the most when ZeRO-1 gives each
    tensor whole, largest first, to the least-loaded of ``plan.dp`` replicas (the executor's
    ``zero.partition_parameters``, as torch's ZeroRedundancyOptimizer): its optimizer states
    are that rank's, not 1/dp of the stage's. A 12,000 x 384 embedding beside two layers of
    ~1.6 M parameters in tensors of at most 0.39 M: one replica owns the embedding's 4.61 M, the
    other 3.15 M, against 3.88 M each when split evenly (measured on 4 gloo ranks, dp 2 pp 2: the
    Adam states of the first replica read 35.16 MiB, the embedding's)."""
    return [max(sum(owned) for owned in _whole_tensor_partition(tensors, plan.dp))
            for tensors in stage_tensors(model, plan)]


def whole_tensor_owners(tensors: list[float], dp: int) -> list[int]:
    """The replica each of ``tensors`` (elements each) goes to when given whole, largest first, to
    the least-loaded of ``dp`` replicas (ties: the lowest replica; equal sizes keep their order),
    as the executor's ``zero.partition_parameters`` and torch's ZeroRedundancyOptimizer. Only
    the first min(dp, tensors) replicas can receive one (each tensor beyond an empty replica's
    turn goes to the lowest empty one first), so only they are on the heap: a sweep's dp reaches
    the cluster's size (10^9 devices asked a list of 10^9 replicas of a tiny model's few
    tensors)."""
    heap = [(0.0, i) for i in range(max(1, min(dp, len(tensors))))]    # (load, replica): least, lowest first
    owner = [0] * len(tensors)
    for i in sorted(range(len(tensors)), key=lambda i: (-tensors[i], i)):
        load, r = heapq.heappop(heap)
        heapq.heappush(heap, (load + tensors[i], r))
        owner[i] = r
    return owner


def _whole_tensor_partition(tensors: list[float], dp: int) -> list[list[float]]:
    """``tensors`` (elements each) of each replica that receives any (``whole_tensor_owners``),
    in their order."""
    owners = whole_tensor_owners(tensors, dp)
    return [[t for t, o in zip(tensors, owners) if o == r] for r in sorted(set(owners))]


def optimizer_tensors(model: ModelSpec, plan: Plan) -> list[float]:
    """Parameter tensors one rank's optimizer steps over, per pipeline rank
    (``optimizer_tensor_sizes``)."""
    return [float(len(t)) for t in optimizer_tensor_sizes(model, plan)]
