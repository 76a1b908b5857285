"""Parameter counts per layer / per pipeline stage, per device (after TP sharding).

Total for GPT shapes: P = 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h))  (Narayanan et al. 2021, Eq. 2).
"""
from __future__ import annotations

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
