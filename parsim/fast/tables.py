"""Cost tables for the fast path, built once per sweep from ``parsim.costs``.

A sweep has hundreds of thousands of plans but only a few hundred distinct layer shapes:
everything the per-plan kernel needs is priced here once per distinct key, with the very
functions the SimPy engine uses, and looked up by index. Keys:

* layer key (tp, sp, mbs, dtype, recompute): per-layer op times (``timing.op_time`` summed
  over ``costs.layer_ops``), TP collective times, activation bytes per recompute policy
* head key (tp, sp, mbs, dtype): embedding / output-head op times and activations,
  pipeline send size (``costs.p2p_bytes``)
* rank key (dp, tp, pp, vpp, dtype): per pipeline rank, its layers (``specs.stage_layers``,
  loop placement) in all and per model chunk, its parameters (``costs.stage_params``) and its
  DP communication (``fast.comm.rank_comm_rows``)
* schedule key (schedule, pp, m, vpp): per rank, the chunk counts in flight at the moments
  that can be its memory peak (``fast.inflight``, from ``costs.peak_moments``)

The memory rules that combine these rows per plan (``costs.footprint``) are compiled into the
kernel (``fast.memory``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from parsim.costs import (embedding_activation_bytes, embedding_ops, embedding_params, head_activation_bytes,
                          head_ops, head_params, layer_activation_bytes, layer_ops, layer_params, layer_recompute,
                          p2p_bytes, recomputes_fully, stage_params, state_bytes, tp_collectives_edge,
                          tp_collectives_per_layer)
from parsim.costs import timing
from parsim.costs.activations import layer_working_bytes, logits_grad_bytes, stage_output_bytes, vocab_grad_bytes
from parsim.costs.footprint import recompute_transient
from parsim.costs.stack import apply_stack, tp_covered
from parsim.specs import ClusterSpec, ModelSpec, Plan, get_stack, stage_layers

from .comm import C_WIDTH, CollectivePricer, rank_comm_rows, tp_group_ranks
from .inflight import canonical_microbatches, moment_table
from .plans import WORDS, PlanTable

# layer table columns (seconds or bytes)
(L_FWD, L_BWD, L_RECOMPUTE, L_TP_FWD, L_TP_BWD, L_TP_RECOMPUTE, L_ACT, L_ACT_NONE, L_ACT_FULL,
 L_PARAMS, L_PRE_FWD, L_PRE_BWD, L_WORK, L_TRANSIENT, L_WIDTH) = range(15)
# head table columns
(H_EMB_FWD, H_EMB_BWD, H_HEAD_FWD, H_HEAD_BWD, H_EMB_ACT, H_HEAD_ACT, H_P2P_BYTES, H_EMB_PARAMS, H_HEAD_PARAMS_PP1,
 H_HEAD_PARAMS_PPN, H_SBH, H_VOCAB_GRAD, H_TIED, H_LOGITS_GRAD, H_WIDTH) = range(15)
# rank table columns: layers, parameters, the fast.comm columns, then layers per model chunk
R_LAYERS, R_PARAMS, R_COMM = 0, 1, 2
R_CHUNK = R_COMM + C_WIDTH
# dtype table columns: bytes per parameter of each model state, optimizer traffic per parameter; and
# the table's stack's memory terms (``costs.footprint``): fp32 shards (0 / 1), 16-bit gradient copy
# bytes, layers gathered at once, the most gathered parameters alive
(D_PARAM, D_GRAD, D_OPT, D_ADAM_BYTES, D_FP32_SHARDS, D_GRAD_COPY, D_GATHERED_LAYERS, D_MAX_LIVE,
 D_WIDTH) = range(9)


@dataclass
class CostTables:
    layer: np.ndarray          # (n_layer_keys, L_WIDTH)
    head: np.ndarray           # (n_head_keys, H_WIDTH)
    dtype: np.ndarray          # (len(DTYPES), D_WIDTH)
    rank: np.ndarray           # (sum of pp over rank keys, R_CHUNK + max vpp)
    rank_offset: np.ndarray    # (n_rank_keys,) first row of each rank key in ``rank``
    moments: np.ndarray        # fast.inflight.moment_table rows: held microbatches per chunk
    moment_start: np.ndarray   # per (schedule key, rank)
    moment_count: np.ndarray   # per (schedule key, rank)
    moment_offset: np.ndarray  # (n_schedule_keys,) first (key, rank) entry of each key
    layer_id: np.ndarray       # per plan
    head_id: np.ndarray        # per plan
    rank_id: np.ndarray        # per plan
    moment_id: np.ndarray      # per plan


def key_ids(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of the stacked columns and each plan's row index (one mixed-radix int64
    key per row: far faster than ``np.unique(axis=0)``)."""
    key = np.zeros(cols[0].shape, dtype=np.int64)
    for col in cols:
        key = key * (int(col.max(initial=0)) + 1) + col
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    keys = np.stack([col[first] for col in cols], axis=1).reshape(-1, len(cols))
    return keys, inverse.reshape(-1).astype(np.int64)


def _plan(tp: int, sp: int, mbs: int, dtype: int, recompute: int = 0, stack: str = "auto") -> Plan:
    return Plan(tp=tp, sp=bool(sp), mbs=mbs, dtype=WORDS["dtype"][dtype], recompute=WORDS["recompute"][recompute],
                stack=stack)


def _ops_time(cluster: ClusterSpec, ops, pass_: str, dtype: str, core_only: bool = False) -> float:
    return sum(timing.op_time(cluster.device, op, pass_, dtype) for op in ops if op.attention_core or not core_only)


def _tp_seconds(cluster: ClusterSpec, model: ModelSpec, plan: Plan, phase: str, host_ranks: int | None = None,
                part: str | None = None) -> float:
    """Seconds of a layer's TP collectives (or, with ``part``, the embedding's / head's:
    ``tp_collectives_edge``), priced in situ (timing.collective_time) as the SimPy engine does,
    less what the stack hides behind the weight-gradient GEMMs (``costs.stack.tp_covered``)."""
    group = tp_group_ranks(1, plan.tp, 1)
    colls = tp_collectives_per_layer(model, plan, phase) if part is None else tp_collectives_edge(model, plan, part, phase)
    ops = layer_ops(model, plan) if part is None else [] if part == "embedding" else head_ops(model, plan)
    return sum(max(timing.collective_time(cluster, c.op, c.nbytes, group, in_situ=True, host_ranks=host_ranks)
                   - tp_covered(cluster.device, ops, c.after, phase, plan.dtype), 0.0)
               for c in colls)


def _prices_by_host_ranks(cluster: ClusterSpec) -> bool:
    """Does a calibrated collective price in-situ calls by the ranks sharing the host
    (``alpha_insitu_shared``)? Then the layer rows depend on the plan's ranks per node."""
    return cluster.network.collectives.prices_by_host_ranks


def _compute_before_first_collective(cluster: ClusterSpec, model: ModelSpec, plan: Plan, phase: str, ops) -> float:
    """Compute seconds of a layer's forward ("fwd") or backward ("bwd", ops reversed) before
    its first TP collective (``Collective.after`` names the op it follows; "" = layer start):
    how long a collective's port stays free for other traffic at the start of a layer."""
    colls = tp_collectives_per_layer(model, plan, phase)
    if not colls:
        return _ops_time(cluster, ops, phase, plan.dtype)
    first = colls[0].after
    order = ops if phase == "fwd" else list(reversed(ops))
    total = 0.0
    if first == "":
        return total
    for op in order:
        total += timing.op_time(cluster.device, op, phase, plan.dtype)
        if op.name == first:
            break
    return total


def layer_shape_row(model: ModelSpec, cluster: ClusterSpec, plan: Plan, host_ranks: int | None = None) -> np.ndarray:
    """Per-layer, per-microbatch costs on one device for a layer shape (tp, sp, mbs, dtype),
    every recompute policy's extra left at zero (``with_recompute`` fills it in);
    ``host_ranks``: ranks sharing the host, for in-situ TP prices that depend on it."""
    row = np.zeros(L_WIDTH)
    ops = layer_ops(model, plan)
    dt = plan.dtype
    row[L_FWD] = _ops_time(cluster, ops, "fwd", dt)
    row[L_BWD] = _ops_time(cluster, ops, "bwd", dt)
    # the attention-core forward, kept in L_RECOMPUTE until a policy is applied
    row[L_RECOMPUTE] = _ops_time(cluster, ops, "fwd", dt, core_only=True)
    row[L_TP_FWD] = _tp_seconds(cluster, model, plan, "fwd", host_ranks)
    row[L_TP_BWD] = _tp_seconds(cluster, model, plan, "bwd", host_ranks)
    row[L_ACT_NONE] = layer_activation_bytes(model, plan, "none")
    row[L_ACT_FULL] = layer_activation_bytes(model, plan, "full")
    row[L_PARAMS] = layer_params(model, plan.tp)
    row[L_PRE_FWD] = _compute_before_first_collective(cluster, model, plan, "fwd", ops)
    row[L_PRE_BWD] = _compute_before_first_collective(cluster, model, plan, "bwd", ops)
    # a layer's backward working set (``footprint.backward_working`` of a middle stage)
    row[L_WORK] = layer_working_bytes(model, plan)
    return row


def with_recompute(model: ModelSpec, plan: Plan, shape: np.ndarray) -> np.ndarray:
    """The shape row under ``plan.recompute``: what the backward re-runs, what is stored."""
    row = shape.copy()
    # the fast path takes no per-stage counts and no shifted critical path: every layer follows
    # the policy of a one-layer stage (``costs.layer_recompute``; stage-aware recomputes all)
    groups = layer_recompute(plan, 0, 1)
    policy = next(p for n, p in groups if n)
    if policy == "full":
        # full recomputation re-runs the whole forward, its TP collectives included
        # (Korthikanti et al. 2022 Sec. 3; Megatron-LM checkpointed forward)
        row[L_RECOMPUTE] = row[L_FWD]
        row[L_TP_RECOMPUTE] = row[L_TP_FWD]
        row[L_PRE_BWD] = row[L_PRE_FWD]          # the backward starts with the re-run forward
    elif policy == "selective":
        # selective recomputation re-runs only the attention core (Korthikanti et al. 2022 Sec. 5)
        row[L_PRE_BWD] += row[L_RECOMPUTE]
    else:
        row[L_RECOMPUTE] = 0.0
    row[L_ACT] = layer_activation_bytes(model, plan, policy)
    # every stage of a fast-path plan holds a layer (stages <= layers), so it recomputes fully
    # exactly when its layers do
    row[L_TRANSIENT] = recompute_transient(recomputes_fully(groups), row[L_ACT_NONE], row[L_ACT_FULL])
    return row


def layer_row(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> np.ndarray:
    """Per-layer, per-microbatch costs on one device for a plan's layer shape and recompute."""
    return with_recompute(model, plan, layer_shape_row(model, cluster, plan))


def head_row(model: ModelSpec, cluster: ClusterSpec, plan: Plan, host_ranks: int | None = None) -> np.ndarray:
    row = np.zeros(H_WIDTH)
    dt = plan.dtype
    emb, head = embedding_ops(model, plan), head_ops(model, plan)
    # the embedding's / head's TP collectives run in series with their ops (sim.compute chains):
    # folded into their times
    row[H_EMB_FWD] = _ops_time(cluster, emb, "fwd", dt) + _tp_seconds(cluster, model, plan, "fwd", host_ranks, "embedding")
    row[H_EMB_BWD] = _ops_time(cluster, emb, "bwd", dt) + _tp_seconds(cluster, model, plan, "bwd", host_ranks, "embedding")
    row[H_HEAD_FWD] = _ops_time(cluster, head, "fwd", dt) + _tp_seconds(cluster, model, plan, "fwd", host_ranks, "head")
    row[H_HEAD_BWD] = _ops_time(cluster, head, "bwd", dt) + _tp_seconds(cluster, model, plan, "bwd", host_ranks, "head")
    row[H_EMB_ACT] = embedding_activation_bytes(model, plan)
    row[H_HEAD_ACT] = head_activation_bytes(model, plan)
    row[H_P2P_BYTES] = p2p_bytes(model, plan)
    row[H_EMB_PARAMS] = embedding_params(model, plan)
    row[H_HEAD_PARAMS_PP1] = head_params(model, plan.replace(pp=1))     # tied embeddings: just the norm
    row[H_HEAD_PARAMS_PPN] = head_params(model, plan.replace(pp=2))
    # the parts of ``backward_working_bytes`` for the first and last stages, and a stage's output
    row[H_SBH] = stage_output_bytes(model, plan)
    row[H_VOCAB_GRAD] = vocab_grad_bytes(model, plan)
    row[H_TIED] = float(model.tied_embeddings)
    row[H_LOGITS_GRAD] = logits_grad_bytes(model, plan)
    return row


def dtype_table(stack: str = "torch") -> np.ndarray:
    """Per dtype: its state bytes and optimizer traffic per parameter, and ``stack``'s ZeRO-3
    memory terms (the same on every row)."""
    st = get_stack(stack)
    out = np.zeros((len(WORDS["dtype"]), D_WIDTH))
    for i, name in enumerate(WORDS["dtype"]):
        sb = state_bytes(name)
        out[i, D_PARAM], out[i, D_GRAD], out[i, D_OPT] = sb.param, sb.grad, sb.optimizer
        out[i, D_FP32_SHARDS], out[i, D_GRAD_COPY] = float(st.fp32_shards), st.grad_copy_bytes(name)
        out[i, D_GATHERED_LAYERS], out[i, D_MAX_LIVE] = st.zero3_gathered_layers, st.zero3_max_live_params
        # timing.optimizer_time: 28 bytes per parameter in fp32, + 4 for the low-precision copy
        out[i, D_ADAM_BYTES] = 28.0 + (0.0 if name == "fp32" else 4.0)
    return out


def rank_rows(model: ModelSpec, pricer: CollectivePricer, dp: int, tp: int, pp: int, vpp: int, dtype: int,
              bucket_bytes: int, with_ps: bool, max_vpp: int) -> np.ndarray:
    plan = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, dtype=WORDS["dtype"][dtype])
    per_stage = stage_layers(model, plan)
    params = stage_params(model, plan)
    rows = np.zeros((pp, R_CHUNK + max_vpp))
    rows[:, R_LAYERS] = [sum(per_stage[r + v * pp] for v in range(vpp)) for r in range(pp)]
    rows[:, R_PARAMS] = params
    rows[:, R_COMM:R_CHUNK] = rank_comm_rows(model, pricer, dp, tp, pp, vpp, dtype, params, bucket_bytes, with_ps)
    for r in range(pp):
        rows[r, R_CHUNK:R_CHUNK + vpp] = [per_stage[r + v * pp] for v in range(vpp)]
    return rows


def with_stack(model: ModelSpec, cluster: ClusterSpec, plans: PlanTable) -> tuple[ModelSpec, ClusterSpec, PlanTable]:
    """The table's software stack applied (``costs.stack.apply_stack``; applying it again is a
    no-op): the model and cluster as the stack runs them, the table with its stack named and
    the DP overlap the stack can do."""
    probe = Plan(stack=plans.stack, dp_overlap=plans.dp_overlap)
    model, cluster, probe = apply_stack(model, cluster, probe)
    if (probe.stack, probe.dp_overlap) != (plans.stack, plans.dp_overlap):
        plans = PlanTable(plans.cols, plans.dp_bucket_bytes, probe.dp_overlap, probe.stack)
    return model, cluster, plans


def uneven_chunks(model: ModelSpec, pp: int, vpp: int) -> list[bool]:
    """Per pipeline rank: do its model chunks hold different bytes? (Different layer counts;
    and the first / last rank, whose first / last chunk also holds the embedding / head.)"""
    per_stage = stage_layers(model, Plan(pp=pp, vpp=vpp))
    return [r in (0, pp - 1) or len({per_stage[r + v * pp] for v in range(vpp)}) > 1 for r in range(pp)]


def build_tables(model: ModelSpec, cluster: ClusterSpec, plans: PlanTable) -> CostTables:
    model, cluster, plans = with_stack(model, cluster, plans)
    st = plans.stack
    c = plans.cols
    # ranks per node: a key of the layer rows only where in-situ TP prices depend on it
    host = (np.minimum(c["dp"] * c["tp"] * c["pp"], cluster.devices_per_node) if _prices_by_host_ranks(cluster)
            else np.zeros_like(c["tp"]))
    lkeys, layer_id = key_ids(c["tp"], c["sp"], c["mbs"], c["dtype"], c["recompute"], host)
    shapes: dict[tuple[int, ...], np.ndarray] = {}
    rows = []
    for k in lkeys.tolist():
        shape_key = (*k[:4], k[5])
        if shape_key not in shapes:
            shapes[shape_key] = layer_shape_row(model, cluster, _plan(*k[:4], stack=st), k[5] or None)
        rows.append(with_recompute(model, _plan(*k[:5], stack=st), shapes[shape_key]))
    layer = np.array(rows).reshape(-1, L_WIDTH)
    hkeys, head_id = key_ids(c["tp"], c["sp"], c["mbs"], c["dtype"], host)
    head = np.array([head_row(model, cluster, _plan(*map(int, k[:4]), stack=st), int(k[4]) or None)
                     for k in hkeys]).reshape(-1, H_WIDTH)
    rkeys, rank_id = key_ids(c["dp"], c["tp"], c["pp"], c["vpp"], c["dtype"])
    with_ps = bool((c["dp_impl"] == WORDS["dp_impl"].index("ps")).any())
    max_vpp = int(c["vpp"].max(initial=1))
    pricer = CollectivePricer(cluster)
    blocks = [rank_rows(model, pricer, *map(int, k), plans.dp_bucket_bytes, with_ps, max_vpp) for k in rkeys]
    offsets = np.cumsum([0] + [len(b) for b in blocks[:-1]]).astype(np.int64)
    rank = np.concatenate(blocks) if blocks else np.zeros((0, R_CHUNK + max_vpp))
    # per (schedule, pp, microbatches, vpp): interleaved counts beyond the canonical one repeat
    inter = c["schedule"] == WORDS["schedule"].index("interleaved")
    m_key = np.where(inter, canonical_microbatches(c["pp"], plans.microbatches), plans.microbatches)
    mkeys, moment_id = key_ids(c["schedule"], c["pp"], m_key, c["vpp"])
    moments, mstart, mcount = moment_table([(WORDS["schedule"][s], pp, m, vpp) for s, pp, m, vpp in mkeys.tolist()],
                                           max_vpp, lambda pp, vpp: uneven_chunks(model, pp, vpp))
    moff = np.cumsum([0] + [int(k[1]) for k in mkeys[:-1]]).astype(np.int64)
    return CostTables(layer=layer, head=head, dtype=dtype_table(st), rank=rank, rank_offset=offsets,
                      moments=moments, moment_start=mstart, moment_count=mcount, moment_offset=moff,
                      layer_id=layer_id, head_id=head_id, rank_id=rank_id, moment_id=moment_id)
