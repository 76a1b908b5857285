"""Cost tables for the fast path, built once per sweep from ``parsim.costs``.

A sweep has hundreds of thousands of plans but only a few hundred distinct layer shapes:
everything the per-plan kernel needs is priced here once per distinct key, with the very
functions the SimPy engine uses, and looked up by index. Keys:

* layer key (tp, sp, mbs, dtype, recompute): per-layer op times (``timing.op_time`` summed
  over ``costs.layer_ops``), TP collective times, activation bytes per recompute policy
* head key (tp, sp, mbs, dtype): embedding / output-head op times and activations
* rank key (dp, tp, pp, vpp, dtype, placement) and send key (dp, tp, pp, mbs, dtype): per pipeline
  rank, its layers (placed as the schedule places its stages: loop or V, ``costs.placement``),
  parameters, DP communication, optimizer step and host transfers (per ZeRO stage and offload),
  and its pipeline send (``fast.ranks``)
* schedule key (schedule, pp, m, vpp): per rank, the chunk counts in flight at the moments
  that can be its memory peak (``fast.inflight``, from ``costs.peak_moments`` /
  ``costs.inflight.rank_moments``); for the plans timed by their action graph (the
  split-backward family, looped BFS, interleaved over unequal chunks: ``fast.dag.timed_by_graph``),
  that graph (``fast.dag``)

The memory rules that combine these rows per plan (``costs.footprint``) are compiled into the
kernel (``fast.memory``). A table has one software stack (``PlanTable.stack``), applied once
(``with_stack``: ``costs.stack.apply_stack``): every row is priced as that stack runs it, and
the dtype rows carry its memory terms.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from parsim.costs import (embedding_activation_bytes, embedding_ops, embedding_params, head_activation_bytes,
                          head_ops, head_params, layer_activation_bytes, layer_ops, layer_params, layer_recompute,
                          recomputes_collectives, recomputes_fully, rerun, state_bytes, tp_collectives_edge,
                          tp_collectives_per_layer)
from parsim.costs import timing
from parsim.costs.activations import (embedding_grad_bytes, forward_working_bytes, layer_working_bytes,
                                      logits_grad_bytes, loss_saved_bytes, stage_output_bytes, vocab_grad_bytes)
from parsim.costs.footprint import recompute_transient
from parsim.costs.host import HostModel
from parsim.costs.placement import loop_placed, stages_of_rank
from parsim.costs.split_backward import (head_output_grad_bytes, input_attention_bytes, output_grad_bytes,
                                         split_weight_terms, w_residue_per_layer, w_residue_top, w_recomputes,
                                         weight_grad_working_bytes)
from parsim.costs.stack import apply_stack, tp_covered
from parsim.specs import ClusterSpec, ModelSpec, Plan, get_stack, plan_stack, stage_layers

from .comm import tp_group_ranks
from .dag import N_WIDTH, schedule_graph, timed_by_graph
from .dag import canonical_microbatches as graph_microbatches
from .inflight import canonical_microbatches, moment_microbatches, moment_table
from .plans import WORDS, PlanTable
from .ranks import R_CHUNK, RankRows, rank_plan, send_rows
from .segments import backward_lead, compute_before_first_collective

# the first schedule code timed by its action graph (``fast.dag``): the codes after the four
# counted schedules (``specs.codes``)
FIRST_WALKED = WORDS["schedule"].index("zb-h1")
# the schedules that place their stages in a V (``costs.placement``)
V_PLACED = tuple(name for name in WORDS["schedule"] if not loop_placed(Plan(schedule=name)))

# layer table columns (seconds or bytes); split backward (``costs.split_backward``): the input- and
# weight-gradient op times, W's re-run of a recomputed forward (compute and TP), the output
# gradients kept from I to W, the backward working sets of I and of W
(L_FWD, L_BWD, L_RECOMPUTE, L_TP_FWD, L_TP_BWD, L_TP_RECOMPUTE, L_ACT, L_ACT_NONE, L_ACT_FULL,
 L_PARAMS, L_PRE_FWD, L_PRE_BWD, L_WORK, L_TRANSIENT, L_RERUN_FULL, L_RERUN_SELECTIVE, L_BWD_I, L_BWD_W,
 L_W_RECOMPUTE, L_TP_W_RECOMPUTE, L_KEPT, L_WORK_I, L_WORK_W, L_W_RESIDUE, L_TP_COVER, L_W_RESIDUE_TOP,
 L_TP_RERUN_FULL, L_FWD_COPIES, L_SPLIT_W, L_SPLIT_W2, L_TP1_BWD, L_MID_BWD, L_TP1_RERUN, L_MID_RERUN,
 L_I_ATTENTION, L_WIDTH) = range(36)
# the forward a backward re-runs under each layer policy that re-runs one (``costs.rerun``)
RERUN = {"full": L_RERUN_FULL, "selective": L_RERUN_SELECTIVE}
# head table columns; the head's weight-gradient time and kept output gradients, and the loss's
# saved logits its I frees (the first stage runs its whole backward as W: ``costs.split_backward``)
(H_EMB_FWD, H_EMB_BWD, H_HEAD_FWD, H_HEAD_BWD, H_EMB_ACT, H_HEAD_ACT, H_EMB_PARAMS, H_HEAD_PARAMS_PP1,
 H_HEAD_PARAMS_PPN, H_SBH, H_VOCAB_GRAD, H_EMB_GRAD, H_TIED, H_LOGITS_GRAD, H_HEAD_BWD_W, H_HEAD_KEPT,
 H_HEAD_TP_COVER, H_LOSS_FWD, H_LOSS_SAVED, H_WIDTH) = range(20)
# dtype table columns: bytes per parameter of each model state; and the table's stack's memory
# terms (``costs.footprint``): fp32 shards (0 / 1), 16-bit gradient copy bytes, layers gathered
# at once, the most gathered parameters alive, and whether ZeRO-1 gives whole tensors to a replica
# (0 / 1; the optimizer step's temporaries are the rank table's: ``fast.ranks`` R_WINDOW)
(D_PARAM, D_GRAD, D_OPT, D_FP32_SHARDS, D_GRAD_COPY, D_GATHERED_LAYERS, D_MAX_LIVE, D_ZERO1_WHOLE,
 D_WIDTH) = range(9)


class CostTables(NamedTuple):
    """The tables and each plan's row in them (a tuple of arrays: the numba kernel takes it whole)."""
    layer: np.ndarray          # (n_layer_keys, L_WIDTH)
    head: np.ndarray           # (n_head_keys, H_WIDTH)
    dtype: np.ndarray          # (len(DTYPES), D_WIDTH)
    rank: np.ndarray           # (sum of pp over rank keys, R_CHUNK + max vpp): ``fast.ranks``
    rank_offset: np.ndarray    # (n_rank_keys,) first row of each rank key in ``rank``
    send: np.ndarray           # (sum of pp over send keys,) seconds of each rank's pipeline send
    send_offset: np.ndarray    # (n_send_keys,) first entry of each send key in ``send``
    moments: np.ndarray        # fast.inflight.moment_table rows: held microbatches per chunk
    moment_start: np.ndarray   # per (schedule key, rank)
    moment_count: np.ndarray   # per (schedule key, rank)
    moment_offset: np.ndarray  # (n_schedule_keys,) first (key, rank) entry of each key
    layer_id: np.ndarray       # per plan
    head_id: np.ndarray        # per plan
    dtype_id: np.ndarray       # per plan
    rank_id: np.ndarray        # per plan
    send_id: np.ndarray        # per plan
    moment_id: np.ndarray      # per plan
    nodes: np.ndarray          # fast.dag node tables of the graph-timed schedules, stacked
    node_start: np.ndarray     # per graph key: first node
    node_count: np.ndarray     # per graph key: nodes (0: a counted schedule's key)
    node_m: np.ndarray         # per graph key: the microbatches its graph plays
    graph_id: np.ndarray       # per plan

    def take(self, index: np.ndarray) -> "CostTables":
        """The same tables with the rows of the plans ``index`` selects."""
        return self._replace(**{name: getattr(self, name)[index] for name in self._fields if name.endswith("_id")})


def key_ids(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of the stacked columns and each plan's row index (one mixed-radix int64
    key per row: far faster than ``np.unique(axis=0)``)."""
    key = np.zeros(cols[0].shape, dtype=np.int64)
    for col in cols:
        key = key * (int(col.max(initial=0)) + 1) + col
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    keys = np.stack([col[first] for col in cols], axis=1).reshape(-1, len(cols))
    return keys, inverse.reshape(-1).astype(np.int64)


def _plan(tp: int, sp: int, mbs: int, dtype: int, recompute: int = 0, stack: str = "auto", zero: int = 0,
          pp: int = 1) -> Plan:
    return Plan(tp=tp, sp=bool(sp), mbs=mbs, dtype=WORDS["dtype"][dtype], recompute=WORDS["recompute"][recompute],
                stack=stack, zero=zero, pp=pp)


def _ops_time(cluster: ClusterSpec, ops, pass_: str, dtype: str) -> float:
    return sum(timing.op_time(cluster.device, op, pass_, dtype) for op in ops)


def _tp_seconds(cluster: ClusterSpec, model: ModelSpec, plan: Plan, phase: str, host_ranks: int | None = None,
                part: str | None = None, cover: bool = True, colls: list | None = None) -> float:
    """Seconds of a layer's TP collectives (or, with ``part``, the embedding's / head's:
    ``tp_collectives_edge``; or these ``colls`` of the layer), priced in situ
    (timing.collective_time) as the SimPy engine does, less (``cover``) what the stack hides behind
    the weight-gradient GEMMs (``costs.stack.tp_covered``)."""
    group = tp_group_ranks(1, plan.tp, 1)
    if colls is None:
        colls = tp_collectives_per_layer(model, plan, phase) if part is None else tp_collectives_edge(model, plan, part,
                                                                                                      phase)
    ops = layer_ops(model, plan) if part is None else (embedding_ops if part == "embedding" else head_ops)(model, plan)
    # the compute before each call, as the engine's chains run the ops (``sim.compute._chain``)
    blocks = timing.compute_before(cluster.device, ops if phase == "fwd" else ops[::-1], colls, phase, plan.dtype)
    return sum(max(timing.collective_time(cluster, c.op, c.nbytes, group, True, host_ranks, block)
                   - (tp_covered(cluster.device, ops, c.after, phase, plan.dtype) if cover else 0.0), 0.0)
               for c, block in zip(colls, blocks))


def _prices_by_host_ranks(cluster: ClusterSpec) -> bool:
    """Does a calibrated collective price in-situ calls by the ranks sharing the host
    (``alpha_insitu_shared``)? Then the layer rows depend on the plan's ranks per node."""
    return cluster.network.collectives.prices_by_host_ranks


def layer_shape_row(model: ModelSpec, cluster: ClusterSpec, plan: Plan, host_ranks: int | None = None) -> np.ndarray:
    """Per-layer, per-microbatch costs on one device for a layer shape (tp, sp, mbs, dtype),
    the recomputation left at zero (``with_recompute`` fills it in);
    ``host_ranks``: ranks sharing the host, for in-situ TP prices that depend on it."""
    row = np.zeros(L_WIDTH)
    ops = layer_ops(model, plan)
    dt = plan.dtype
    row[L_FWD] = _ops_time(cluster, ops, "fwd", dt)
    row[L_BWD] = _ops_time(cluster, ops, "bwd", dt)
    # W's own cost run apart from its I, per chunk of L layers: L_SPLIT_W L + L_SPLIT_W2 L^2
    # (``costs.split_backward.split_weight_overhead``)
    row[L_SPLIT_W], row[L_SPLIT_W2] = split_weight_terms(cluster, row[L_BWD])
    for policy, column in RERUN.items():
        row[column] = _ops_time(cluster, rerun(model, plan, policy)[0], "fwd", dt)
    # the full re-run's TP collectives (``costs.rerun``)
    row[L_TP_RERUN_FULL] = _tp_seconds(cluster, model, plan, "fwd", host_ranks, colls=rerun(model, plan, "full")[1])
    row[L_TP_FWD] = _tp_seconds(cluster, model, plan, "fwd", host_ranks)
    row[L_TP_BWD] = _tp_seconds(cluster, model, plan, "bwd", host_ranks)
    row[L_ACT_NONE] = layer_activation_bytes(model, plan, "none")
    row[L_ACT_FULL] = layer_activation_bytes(model, plan, "full")
    row[L_PARAMS] = layer_params(model, plan.tp)
    row[L_PRE_FWD] = compute_before_first_collective(cluster, model, plan, "fwd", ops)
    row[L_PRE_BWD] = compute_before_first_collective(cluster, model, plan, "bwd", ops)
    # the backward's first TP collective and the compute up to its second (``fast.segments``);
    # the same of a fully re-run forward, where the backward starts with it
    row[L_TP1_BWD], row[L_MID_BWD] = backward_lead(cluster, model, plan, host_ranks)
    row[L_TP1_RERUN], row[L_MID_RERUN] = backward_lead(cluster, model, plan, host_ranks, rerun_full=True)
    # a layer's backward working set (``footprint.backward_working`` of a middle stage)
    row[L_WORK] = layer_working_bytes(model, plan)
    # split backward: I runs bwd_input (and the backward TP collectives), W bwd_weight
    row[L_BWD_I] = _ops_time(cluster, ops, "bwd_input", dt)
    row[L_BWD_W] = _ops_time(cluster, ops, "bwd_weight", dt)
    row[L_KEPT] = output_grad_bytes(model, plan)
    row[L_WORK_I] = layer_working_bytes(model, plan, weight_grads=False)
    row[L_WORK_W] = weight_grad_working_bytes(model, plan, False)
    # ... and I's TP collectives, with no weight-gradient GEMM beside them, hide nothing
    # (``costs.stack.tp_covered`` is 0 for "bwd_input"): what the backward's cover hid
    row[L_TP_COVER] = _tp_seconds(cluster, model, plan, "bwd", host_ranks, cover=False) - row[L_TP_BWD]
    return row


def with_recompute(model: ModelSpec, plan: Plan, shape: np.ndarray) -> np.ndarray:
    """The shape row under ``plan.recompute``: what the backward re-runs (``costs.recomputed_ops``,
    with the TP collectives where ``costs.recomputes_collectives``), what is stored."""
    row = shape.copy()
    # the fast path takes no per-stage counts and no shifted critical path: every layer follows
    # the policy of a one-layer stage (``costs.layer_recompute``; stage-aware recomputes all)
    groups = layer_recompute(plan, 0, 1)
    policy = next(p for n, p in groups if n)
    row[L_RECOMPUTE] = row[RERUN[policy]] if policy in RERUN else 0.0
    if recomputes_collectives(policy):
        row[L_TP_RECOMPUTE] = row[L_TP_RERUN_FULL]
        row[L_PRE_BWD] = row[L_PRE_FWD]          # the backward starts with the re-run forward
        row[L_TP1_BWD], row[L_MID_BWD] = row[L_TP1_RERUN], row[L_MID_RERUN]
        # ... and a split backward's W re-runs it once per weight group (``costs.split_backward``)
        row[L_W_RECOMPUTE] = w_recomputes(model) * row[L_RERUN_FULL]
        row[L_TP_W_RECOMPUTE] = w_recomputes(model) * row[L_TP_RERUN_FULL]
        # what W's re-runs keep until it ends: per recomputed layer, and once per stage
        row[L_W_RESIDUE] = w_residue_per_layer(model, plan)
        row[L_W_RESIDUE_TOP] = w_residue_top(model, plan)
    else:
        row[L_PRE_BWD] += row[L_RECOMPUTE]       # re-run ops with no collective among them come first
    row[L_ACT] = layer_activation_bytes(model, plan, policy)
    # every stage of a fast-path plan holds a layer (stages <= layers), so it recomputes fully
    # exactly when its layers do
    row[L_TRANSIENT] = recompute_transient(recomputes_fully(groups), row[L_ACT_NONE], row[L_ACT_FULL])
    # what a forward's end holds per fully recomputed layer (``activations.forward_working_bytes``)
    row[L_FWD_COPIES] = forward_working_bytes(model, plan, False, 1.0) if recomputes_fully(groups) else 0.0
    # a split backward's I at its lowest layer's attention, with what a selective re-run saves
    row[L_I_ATTENTION] = input_attention_bytes(model, plan, policy)
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
    row[H_EMB_PARAMS] = embedding_params(model, plan)
    row[H_HEAD_PARAMS_PP1] = head_params(model, plan.replace(pp=1))     # tied embeddings: just the norm
    row[H_HEAD_PARAMS_PPN] = head_params(model, plan.replace(pp=2))
    # the parts of ``backward_working_bytes`` for the first and last stages, and a stage's output
    row[H_SBH] = stage_output_bytes(model, plan)
    row[H_VOCAB_GRAD] = vocab_grad_bytes(model, plan)
    row[H_EMB_GRAD] = embedding_grad_bytes(model, plan)
    row[H_TIED] = float(model.tied_embeddings)
    row[H_LOGITS_GRAD] = logits_grad_bytes(model, plan)
    row[H_LOSS_FWD] = forward_working_bytes(model, plan, True, 0.0)      # the loss's, at the forward's end
    row[H_HEAD_BWD_W] = _ops_time(cluster, head, "bwd_weight", dt)
    row[H_HEAD_KEPT] = head_output_grad_bytes(model, plan)
    row[H_LOSS_SAVED] = loss_saved_bytes(model, plan)
    row[H_HEAD_TP_COVER] = (_tp_seconds(cluster, model, plan, "bwd", host_ranks, "head", cover=False)
                            - _tp_seconds(cluster, model, plan, "bwd", host_ranks, "head"))
    return row


def dtype_table(stack: str = "torch") -> np.ndarray:
    """Per dtype code: bytes per parameter of each model state (``costs.state_bytes``), and
    ``stack``'s memory terms (``specs.stack.Stack``; the same on every row but the gradient copy)."""
    st = get_stack(stack)
    out = np.zeros((len(WORDS["dtype"]), D_WIDTH))
    for i, name in enumerate(WORDS["dtype"]):
        sb = state_bytes(name, st.autocast)
        out[i, D_PARAM], out[i, D_GRAD], out[i, D_OPT] = sb.param, sb.grad, sb.optimizer
        out[i, D_FP32_SHARDS], out[i, D_GRAD_COPY] = float(st.fp32_shards), st.grad_copy_bytes(name)
        out[i, D_GATHERED_LAYERS], out[i, D_MAX_LIVE] = st.zero3_gathered_layers, st.zero3_max_live_params
        out[i, D_ZERO1_WHOLE] = float(st.zero1_whole_tensors)
    return out


def with_stack(model: ModelSpec, cluster: ClusterSpec, plans: PlanTable) -> tuple[ModelSpec, ClusterSpec, PlanTable]:
    """The table's software stack applied (``costs.stack.apply_stack``; applying it again is a
    no-op): the model and cluster as the stack runs them, the table with its stack named and
    the DP overlap the stack can do."""
    probe = Plan(stack=plans.stack, dp_overlap=plans.dp_overlap)
    model, cluster, probe = apply_stack(model, cluster, probe)
    if (probe.stack, probe.dp_overlap) != (plans.stack, plans.dp_overlap):
        plans = PlanTable(plans.cols, plans.dp_bucket_bytes, probe.dp_overlap, probe.stack)
    return model, cluster, plans


def uneven_chunks(model: ModelSpec, pp: int, vpp: int, v_placed: int = 0) -> list[bool]:
    """Per pipeline rank: do its model chunks hold different bytes? (Different layer counts;
    and the ranks holding the first / last stage, whose chunk also holds the embedding / head.)"""
    plan = rank_plan(1, 1, pp, vpp, 0, v_placed=v_placed)
    per_stage = stage_layers(model, plan)
    out = []
    for r in range(pp):
        stages = stages_of_rank(plan, r)
        out.append(0 in stages or pp * vpp - 1 in stages or len({per_stage[s] for s in stages}) > 1)
    return out


def build_tables(model: ModelSpec, cluster: ClusterSpec, plans: PlanTable) -> CostTables:
    model, cluster, plans = with_stack(model, cluster, plans)
    st = plans.stack
    c = plans.cols
    layer, layer_id, head, head_id = _shape_tables(model, cluster, c, st)
    max_vpp = int(c["vpp"].max(initial=1))
    v_placed = np.isin(c["schedule"], [WORDS["schedule"].index(s) for s in V_PLACED]).astype(np.int64)
    rkeys, rank_id = key_ids(c["dp"], c["tp"], c["pp"], c["vpp"], c["dtype"], v_placed)
    with_ps = bool((c["dp_impl"] == WORDS["dp_impl"].index("ps")).any())
    steps = key_ids(c["zero"], c["offload"])[0].tolist()
    rank_rows = RankRows(model, cluster, plans.dp_bucket_bytes, with_ps, max_vpp, steps, st)
    rank, rank_offset = _stacked([rank_rows(*map(int, k)) for k in rkeys], (0, R_CHUNK + max_vpp))
    skeys, send_id = key_ids(c["dp"], c["tp"], c["pp"], c["mbs"], c["dtype"], c["schedule"])
    send, send_offset = _stacked([send_rows(model, cluster, *map(int, k), stack=st) for k in skeys], (0,))
    return CostTables(layer=layer, head=head, dtype=dtype_table(st), rank=rank, rank_offset=rank_offset, send=send,
                      send_offset=send_offset, layer_id=layer_id, head_id=head_id, dtype_id=c["dtype"],
                      rank_id=rank_id, send_id=send_id, **_schedule_tables(model, plans, max_vpp))


def _schedule_tables(model: ModelSpec, plans: PlanTable, max_vpp: int) -> dict[str, np.ndarray]:
    """The moment tables (``fast.inflight``) per (schedule, pp, microbatches, vpp) key, and the
    graphs of the schedules timed by them (``_graph_tables``). Interleaved counts beyond the
    canonical one repeat; the walked schedules' past ``fast.dag.canonical_microbatches`` (looped
    BFS's never)."""
    c = plans.cols
    inter = c["schedule"] == WORDS["schedule"].index("interleaved")
    m_key = np.where(inter, canonical_microbatches(c["pp"], plans.microbatches), plans.microbatches)
    walked = c["schedule"] >= FIRST_WALKED
    played = timed_by_graph(c["schedule"], c["pp"], c["vpp"], model.layers)
    graph_m = np.zeros_like(m_key)

    def per_key(rule, mask: np.ndarray) -> np.ndarray:      # rule(schedule, pp, m, vpp) per distinct key
        keys, inv = key_ids(c["schedule"][mask], c["pp"][mask], plans.microbatches[mask], c["vpp"][mask])
        return np.array([rule(WORDS["schedule"][s], pp, m, vpp) for s, pp, m, vpp in keys.tolist()],
                        dtype=np.int64)[inv]
    if walked.any():
        m_key[walked] = per_key(moment_microbatches, walked)
    if played.any():
        graph_m[played] = per_key(graph_microbatches, played)
    mkeys, moment_id = key_ids(c["schedule"], c["pp"], m_key, c["vpp"])
    moments, mstart, mcount = moment_table(
        [(WORDS["schedule"][s], pp, m, vpp) for s, pp, m, vpp in mkeys.tolist()], max_vpp,
        lambda schedule, pp, vpp: uneven_chunks(model, pp, vpp, int(schedule in V_PLACED)))
    moff = np.cumsum([0] + [int(k[1]) for k in mkeys[:-1]]).astype(np.int64)
    return dict(moments=moments, moment_start=mstart, moment_count=mcount, moment_offset=moff,
                moment_id=moment_id, **_graph_tables(c, graph_m, played))


def _graph_tables(c: dict, graph_m: np.ndarray, played: np.ndarray) -> dict[str, np.ndarray]:
    """The node tables (``fast.dag``) of the graph-timed plans' (schedule, pp, played m, vpp) keys;
    every counted plan maps to one empty key."""
    key_schedule = np.where(played, c["schedule"], -1) + 1
    gkeys, graph_id = key_ids(key_schedule, np.where(played, c["pp"], 0), graph_m, np.where(played, c["vpp"], 0))
    blocks = [schedule_graph(WORDS["schedule"][s - 1], pp, m, vpp) if s > 0 else np.zeros((0, N_WIDTH), np.int64)
              for s, pp, m, vpp in gkeys.tolist()]
    count = np.array([len(b) for b in blocks], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64) if len(count) else count
    nodes = np.concatenate(blocks) if blocks else np.zeros((0, N_WIDTH), np.int64)
    return dict(nodes=nodes, node_start=start, node_count=count, node_m=gkeys[:, 2].astype(np.int64).copy(),
                graph_id=graph_id)


def _shape_tables(model: ModelSpec, cluster: ClusterSpec, c: dict[str, np.ndarray], st: str):
    """(layer rows, each plan's layer row, head rows, each plan's head row) under stack ``st``."""
    host = np.zeros_like(c["tp"])
    if _prices_by_host_ranks(cluster):
        # ranks on a host: a key of the layer rows only where in-situ TP prices depend on it
        world, inverse = np.unique(c["dp"] * c["tp"] * c["pp"], return_inverse=True)
        host = np.array([HostModel(cluster, int(w)).ranks_on_host for w in world], dtype=np.int64)[inverse.reshape(-1)]
    # ZeRO-2/3 under a stack that accumulates gradients in kernels of its own: only the shard
    # (``costs.ops.grad_accumulation_bytes``); a key of the rows only there
    sharded = (c["zero"] >= 2).astype(np.int64) * 2 if plan_stack(Plan(stack=st)).autograd_grad_accumulation \
        else np.zeros_like(c["tp"])
    lkeys, layer_id = key_ids(c["tp"], c["sp"], c["mbs"], c["dtype"], c["recompute"], host, sharded)
    shapes: dict[tuple[int, ...], np.ndarray] = {}
    rows = []
    for k in lkeys.tolist():
        shape_key = (*k[:4], k[5], k[6])
        if shape_key not in shapes:
            shapes[shape_key] = layer_shape_row(model, cluster, _plan(*k[:4], stack=st, zero=k[6]), k[5] or None)
        rows.append(with_recompute(model, _plan(*k[:5], stack=st, zero=k[6]), shapes[shape_key]))
    layer = np.array(rows).reshape(-1, L_WIDTH)
    # a tied output layer holds its own copy of the embedding once the pipeline splits them
    # (``costs.params.head_params``): its gradient is accumulated too where that is priced
    split = (c["pp"] > 1).astype(np.int64) if model.tied_embeddings else np.zeros_like(c["tp"])
    hkeys, head_id = key_ids(c["tp"], c["sp"], c["mbs"], c["dtype"], host, sharded, split)
    head = np.array([head_row(model, cluster, _plan(*map(int, k[:4]), stack=st, zero=int(k[5]), pp=1 + int(k[6])),
                              int(k[4]) or None) for k in hkeys]).reshape(-1, H_WIDTH)
    return layer, layer_id, head, head_id


def _stacked(blocks: list[np.ndarray], empty: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The blocks one after another, and the first row of each."""
    offsets = np.cumsum([0] + [len(b) for b in blocks[:-1]]).astype(np.int64)
    return (np.concatenate(blocks) if blocks else np.zeros(empty)), offsets
