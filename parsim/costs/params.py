"""Parameter counts per layer / per pipeline stage, per device (after TP sharding).

Total for GPT shapes: P = 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h))  (Narayanan et al. 2021, Eq. 2).
"""
from __future__ import annotations

import heapq

from parsim.specs import ModelSpec, Plan, stage_layers

from .ops import padded_vocab
from .placement import rank_of_stage


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

def layer_tensors(model: ModelSpec, tp: int = 1) -> list[float]:
    """Elements of each parameter tensor of one transformer layer on one TP rank, as the torch
    executor builds it (``executor/model.py``: two norms, q / k / v / o and up / (gate) / down
    ``nn.Linear``s with biases where ``model.bias``; LayerNorm's bias too, RMSNorm has none).
    Column-parallel weights and biases split tp ways, row-parallel weights split, row biases and
    norms replicated (Megatron-LM, as ``layer_params``)."""
    h, kv, f, b = model.hidden, model.kv_hidden, model.ffn_hidden, model.bias
    norm = [h, h] if model.norm == "layernorm" and b else [h]
    column = [(h * h, h), (h * kv, kv), (h * kv, kv)] + [(h * f, f)] * (2 if model.activation == "swiglu" else 1)
    out = norm * 2
    for weight, bias in column:
        out += [weight / tp] + ([bias / tp] if b else [])
    for weight in (h * h, f * h):                 # o, down: row-parallel
        out += [weight / tp] + ([h] if b else [])
    return out


def stage_tensors(model: ModelSpec, plan: Plan) -> list[list[float]]:
    """Elements of every parameter tensor each pipeline rank holds (its vpp model chunks):
    layers, the word (+ learned position) embedding on the first chunk, the final norm and its
    own output weight on the last (the tied embedding is reused only by a single-chunk model).
    The executor pads the vocabulary to a multiple of tp rows only (``executor/tp_parallel.py``
    ``padded_rows``), not to Megatron's 128 x tp: sizes decide ZeRO-1's partition."""
    words = float(-(-model.vocab // plan.tp) * model.hidden)
    norm = [model.hidden] * (2 if model.norm == "layernorm" and model.bias else 1)
    out: list[list[float]] = [[] for _ in range(plan.pp)]
    chunks = plan.pp * plan.vpp
    for vstage, n in enumerate(stage_layers(model, plan)):
        out[vstage % plan.pp] += layer_tensors(model, plan.tp) * n
    out[0] += [words] + ([model.seq_len * model.hidden] if model.position == "learned" else [])
    out[(chunks - 1) % plan.pp] += norm + ([] if model.tied_embeddings and chunks == 1 else [words])
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


def stage_largest_tensors(model: ModelSpec, plan: Plan) -> list[float]:
    """Elements of the largest parameter tensor each pipeline rank holds, per TP rank (its model
    chunks placed as ``stage_params`` places them): a layer's largest weight
    (``layer_tensors``), the embedding's on the first chunk, the head's on the last; the
    optimizer step's temporaries scale with it (``footprint.optimizer_temporaries``)."""
    layer = max(layer_tensors(model, plan.tp))
    out = [0.0] * plan.pp
    for vstage, n in enumerate(stage_layers(model, plan)):
        if n:
            out[rank_of_stage(plan, vstage)] = layer
    first, last = rank_of_stage(plan, 0), rank_of_stage(plan, plan.pp * plan.vpp - 1)
    out[first] = max(out[first], embedding_largest_tensor(model, plan))
    out[last] = max(out[last], head_largest_tensor(model, plan))
    return out


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


def _whole_tensor_partition(tensors: list[float], dp: int) -> list[list[float]]:
    """``tensors`` (elements each) given whole, largest first, to the least-loaded of ``dp``
    replicas (ties: the lowest replica; equal sizes keep their order, as the executor's). Only the
    first min(dp, tensors) replicas can receive one (each tensor beyond an empty replica's turn goes
    to the lowest empty one first), so only they are listed: a sweep's dp reaches the cluster's
    size (10^9 devices asked a list of 10^9 replicas of a tiny model's few tensors)."""
    replicas = max(1, min(dp, len(tensors)))
    heap = [(0.0, i) for i in range(replicas)]      # (load, replica): the least, lowest first
    owned: list[list[float]] = [[] for _ in range(replicas)]
    for size in sorted(tensors, reverse=True):
        load, r = heapq.heappop(heap)
        heapq.heappush(heap, (load + size, r))
        owned[r].append(size)
    return owned


def optimizer_tensors(model: ModelSpec, plan: Plan) -> list[float]:
    """Parameter tensors one rank's optimizer steps over, per pipeline rank
    (``optimizer_tensor_sizes``)."""
    return [float(len(t)) for t in optimizer_tensor_sizes(model, plan)]
