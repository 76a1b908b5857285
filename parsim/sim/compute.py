"""What one F/B/I/W action of one virtual stage costs: its chain of compute and TP segments.

An action is a chain of *segments* on two streams of one device: ``compute`` (runs of ops,
``op_time`` summed; Narayanan et al. 2021 Sec. 5.1 op shapes via ``parsim.costs.ops``) and
``tp`` (the Megatron-LM TP collectives of ``tp_collectives_per_layer``, placed after the op
their ``after`` names; Shoeybi et al. 2019 Fig. 3, Korthikanti et al. 2022 Sec. 4.2.2).
Megatron runs TP collectives synchronously, so a plain chain is serial: its length is the
action's duration. With ``tp_overlap=subpipe`` (Merak, Lai et al., IEEE TPDS 2023,
"sub-pipelined TP") every transformer layer splits the microbatch into two halves (``mbs -
mbs // 2`` and ``mbs // 2`` sequences) whose chains share the two streams, so one half's
collective overlaps the other half's compute; ``place`` schedules one layer's two half-chains
(two SimPy processes on capacity-1 stream Resources, FIFO). The halves join again at the end
of each layer -- the executor's ``Block`` concatenates them -- so the layers are placed one
after another (``layer_groups``); a layer's recompute (R) runs with its backward, per layer.

Backward order is the forward ops reversed. ``B`` = bwd_input + bwd_weight; zero-bubble ``I``
(input grad, with the backward collectives) and ``W`` (weight grad, no collectives; a fully
recomputed layer's W re-runs its forward ``costs.split_backward.w_recomputes`` times first).
DualPipe's overlapped F&B slot plays a forward and a backward as two chains on the shared
streams (``overlap_cost``).
Recompute runs before a layer's backward: ``full`` re-runs the layer forward with its TP
collectives (Korthikanti et al. 2022 Sec. 3; Megatron-LM checkpointed forward), ``selective``
re-runs the ``attention_core`` ops only (Korthikanti et al. 2022 Sec. 5). Embedding ops run
at the start of stage 0's forward (end of its backward); the output head at the end of the
last stage's forward (start of its backward: the loss is computed in the forward), each with
its TP collectives (``costs.tp_collectives_edge``: vocabulary-parallel embedding, output
layer and cross-entropy).

Everything here is a pure function of (model, cluster, plan); the engine prices each distinct
(stage, kind, slowdown) once and reuses it for every microbatch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from parsim.costs import (embedding_ops, head_ops, layer_ops, rerun, stage_recompute, tp_collectives_edge,
                          tp_collectives_per_layer)
from parsim.costs.host import ComputeScale
from parsim.costs.split_backward import overlapped_time, split_weight_overhead, w_recomputes
from parsim.costs.stack import tp_covered
from parsim.costs.timing import compute_before, op_time
from parsim.specs import ClusterSpec, ModelSpec, Plan, stage_layers

from .streams import Placed, Segment, layer_groups, place, uncovered

__all__ = ["Segment", "Placed", "ActionCost", "GradPart", "StageShape", "action_cost", "overlap_cost", "layer_chain",
           "layer_groups", "place", "uncovered", "stage_shapes", "halves", "segment_key", "with_tp_times"]

# trace kind of a TP collective op (parsim.trace.events.COMM_KINDS)
TP_KINDS = {"all_reduce": "tp_allreduce", "all_gather": "tp_allgather", "reduce_scatter": "tp_reducescatter"}


@dataclass(frozen=True)
class ActionCost:
    """One action of one virtual stage, for one microbatch, on one device."""
    kind: str
    stage: int
    prologue: tuple[Segment, ...]            # whole-microbatch segments before the layers (embedding / head)
    halves: tuple[tuple[Segment, ...], ...]  # the layers: one chain, or two with sub-pipelined TP
    layers: tuple[tuple[tuple[Segment, ...], ...], ...]   # the halves cut per layer (layer_groups)
    epilogue: tuple[Segment, ...]            # whole-microbatch segments after the layers
    placed: tuple[Placed, ...]               # every segment, in start order
    duration: float                          # seconds, action start to end
    exposed_tp: float                        # seconds of TP comm the compute stream does not cover
    flops: float                             # FLOP executed
    grads_ready: tuple["GradPart", ...]      # B / W: weight gradients as backward completes them
    f_stage: int = -1                        # an overlapped slot's forward stage

    @property
    def weight_grads(self) -> bool:
        """Does it produce weight gradients (B, W, or an overlapped slot's B)?"""
        return self.kind in ("B", "W", "F&B")


@dataclass(frozen=True)
class GradPart:
    """Weight gradients of one layer (or the embedding / head) complete within a B or W action."""
    trigger: int | str | None   # the segment key whose last compute ends it (layer, "head",
                                # "embedding"), or None: ready at the action's start
    offset: float               # seconds from the action's start
    params: float               # parameters whose gradients are ready
    key: int | str | None = None  # what they belong to: the layer, "head" or "embedding"


# ----------------------------------------------------------------------- op chains

def _chain(ops, pass_: str, kind: str, layer: int, collectives, device, dtype: str,
           scale: "float | ComputeScale") -> list[Segment]:
    """Ops in the given order, cut after each op a collective follows (``Collective.after``);
    each op's time times ``scale`` (one factor, or one per op kind: ``ComputeScale``)."""
    if not isinstance(scale, ComputeScale):
        scale = ComputeScale(scale, scale, scale)
    blocks = compute_before(device, ops, collectives, pass_, dtype)
    after: dict[str, list] = {}
    for c, block in zip(collectives, blocks):
        after.setdefault(c.after, []).append((c, block))
    out: list[Segment] = []
    run_t, run_f, names = 0.0, 0.0, []

    def flush():
        nonlocal run_t, run_f, names
        if names:
            out.append(Segment("compute", kind, layer, run_t, run_f, name="+".join(names)))
        run_t, run_f, names = 0.0, 0.0, []

    for c, block in after.get("", []):
        out.append(_tp_segment(c, layer, block=block))
    flop_of = {"fwd": lambda o: o.fwd_flops, "bwd": lambda o: o.bwd_flops,
               "bwd_input": lambda o: o.bwd_input_flops, "bwd_weight": lambda o: o.bwd_weight_flops}[pass_]
    for op in ops:
        run_t += op_time(device, op, pass_, dtype) * scale.of(op, pass_)
        run_f += flop_of(op)
        names.append(op.name)
        if op.name in after:
            flush()
            # hidden behind the weight-gradient GEMM at its nominal speed: one number for the
            # whole TP group, so every member calls the collective (a straggler crediting its
            # slower GEMM could drop a call the others wait for: a deadlock)
            hidden = tp_covered(device, ops, op.name, pass_, dtype)
            out.extend(_tp_segment(c, layer, hidden, block) for c, block in after[op.name])
    flush()
    return out


def _tp_segment(c, layer: int, covered: float = 0.0, block: float = 0.0) -> Segment:
    # duration is filled in by the caller, which knows the TP group (collective_time needs ranks)
    return Segment("tp", TP_KINDS[c.op], layer, 0.0, nbytes=c.nbytes, op=c.op, name=c.name, covered=covered,
                   block=block)


def layer_chain(model: ModelSpec, cluster: ClusterSpec, plan: Plan, kind: str, policy: str, layer: int,
                scale: float = 1.0) -> list[Segment]:
    """Segments of one transformer layer in action ``kind`` (F, B, I, W) under a recompute
    ``policy``; TP segments have duration 0 until ``with_tp_times`` prices them."""
    ops = layer_ops(model, plan)
    dev, dt = cluster.device, plan.dtype
    fwd_c = tp_collectives_per_layer(model, plan, "fwd")
    if kind == "F":
        return _chain(ops, "fwd", "F", layer, fwd_c, dev, dt, scale)
    back = list(reversed(ops))
    if kind == "W":
        # a fully recomputed layer's W re-runs its forward once per weight group (torch 2.13's
        # stage_backward_weight with non-reentrant checkpointing: ``costs.split_backward``)
        # (each re-run as B's: ``costs.rerun``)
        out: list[Segment] = []
        rerun_ops, rerun_c = rerun(model, plan, "full")
        for _ in range(w_recomputes(model) if policy == "full" else 0):
            out += _chain(rerun_ops, "fwd", "R", layer, rerun_c, dev, dt, scale)
        return out + _chain(back, "bwd_weight", "W", layer, [], dev, dt, scale)
    # the recomputed forward first (none without recomputation: ``costs.rerun``)
    rerun_ops, rerun_c = rerun(model, plan, policy)
    out = _chain(rerun_ops, "fwd", "R", layer, rerun_c, dev, dt, scale)
    pass_ = "bwd" if kind == "B" else "bwd_input"
    out += _chain(back, pass_, kind, layer, tp_collectives_per_layer(model, plan, "bwd"), dev, dt, scale)
    return out


def _edge_chain(model: ModelSpec, ops, kind: str, action: str, cluster: ClusterSpec, plan: Plan,
                scale: float) -> list[Segment]:
    """Embedding or head ops of an action, with their TP collectives (``tp_collectives_edge``:
    the vocabulary-parallel lookup's reduction, the output layer's input, the loss's all-reduces;
    the input-gradient ones in B / I, none in W)."""
    pass_ = {"F": "fwd", "B": "bwd", "I": "bwd_input", "W": "bwd_weight"}[action]
    if action != "F":
        ops = list(reversed(ops))
    collectives = [] if action == "W" else tp_collectives_edge(model, plan, kind, "fwd" if action == "F" else "bwd")
    return _chain(ops, pass_, kind, -1, collectives, cluster.device, plan.dtype, scale)


def with_tp_times(chain: list[Segment], tp_time) -> list[Segment]:
    """Price the TP segments with ``tp_time(op, nbytes, block)`` (``block``: the compute before
    the call, ``Segment.block``; less what the stack hides behind compute: ``Segment.covered``)
    and drop zero-length segments."""
    out = []
    for s in chain:
        if s.stream == "tp":
            s = replace(s, duration=max(tp_time(s.op, s.nbytes, s.block) - s.covered, 0.0))
        if s.duration > 0:
            out.append(s)
    return _merge_compute(out)


def _merge_compute(chain: list[Segment]) -> list[Segment]:
    """Join back-to-back compute segments of one layer and kind (fewer SimPy events; the
    streams then strictly alternate where collectives sit)."""
    out: list[Segment] = []
    for s in chain:
        p = out[-1] if out else None
        if p and p.stream == s.stream == "compute" and p.layer == s.layer and p.kind == s.kind:
            out[-1] = Segment("compute", p.kind, p.layer, p.duration + s.duration, p.flops + s.flops,
                              name=f"{p.name}+{s.name}")
        else:
            out.append(s)
    return out


# ----------------------------------------------------------------------- action costs

@dataclass(frozen=True)
class StageShape:
    """Which layers a virtual stage holds, their recompute policies, and whether it holds the
    embedding or the output head."""
    stage: int
    first_layer: int
    policies: tuple[str, ...]          # per layer of the stage
    is_first: bool                     # holds the embedding
    is_last: bool                      # holds the output head


def stage_shapes(model: ModelSpec, plan: Plan) -> list[StageShape]:
    counts = stage_layers(model, plan)
    out, first = [], 0
    last = plan.pp * plan.vpp - 1
    for s, n in enumerate(counts):
        policies = tuple(p for layers, p in stage_recompute(model, plan, s) for _ in range(layers))
        out.append(StageShape(s, first, policies, s == 0, s == last))
        first += n
    return out


def halves(plan: Plan) -> list[Plan]:
    """The plan of each sub-microbatch: two halves with sub-pipelined TP, else the plan."""
    if plan.tp_overlap != "subpipe":
        return [plan]
    a = plan.mbs - plan.mbs // 2
    return [plan.replace(mbs=a), plan.replace(mbs=plan.mbs // 2)]


def action_cost(model: ModelSpec, cluster: ClusterSpec, plan: Plan, shape: StageShape, kind: str, tp_time,
                layer_params: float, edge_params: tuple[float, float],
                scale: ComputeScale = ComputeScale()) -> ActionCost:
    """Chain(s), placement and duration of action ``kind`` of one virtual stage.

    ``tp_time(op, nbytes)`` prices a TP collective for this stage's TP group; ``scale``
    multiplies compute time (GEMM-like and memory-bound: straggler slowdown, host contention);
    ``edge_params`` = (embedding, head) parameters this stage holds (0 when it holds neither)."""
    per_layer: dict[tuple[str, int], list[Segment]] = {}
    chains = []
    for h, hp in enumerate(halves(plan)):
        chain: list[Segment] = []
        order = range(len(shape.policies)) if kind == "F" else reversed(range(len(shape.policies)))
        for i in order:             # backward runs the layers last to first
            policy = shape.policies[i]
            key = (policy, h)
            if key not in per_layer:      # identical layers: price once, relabel per layer
                per_layer[key] = layer_chain(model, cluster, hp, kind, policy, 0, scale)
            chain += [replace(s, layer=shape.first_layer + i) for s in per_layer[key]]
        chains.append(with_tp_times(chain, tp_time))
    first, last = [], []
    if shape.is_first:
        emb = with_tp_times(_edge_chain(model, embedding_ops(model, plan), "embedding", kind, cluster, plan, scale),
                            tp_time)
        (first if kind == "F" else last).extend(emb)
    if shape.is_last:
        head = with_tp_times(_edge_chain(model, head_ops(model, plan), "head", kind, cluster, plan, scale), tp_time)
        (last if kind == "F" else first).extend(head)
    if kind == "W":      # run apart from its I, W costs more than its ops (``split_weight_overhead``)
        extra = split_weight_overhead(model, cluster, plan, len(shape.policies)) * scale.gemm
        if extra > 0:
            last.append(Segment("compute", "W", -1, extra, name="split-weight overhead"))
    # embedding / head run on the whole microbatch, before and after the (sub-pipelined) layers
    placed_first = place([first])
    t1 = placed_first[-1].end if placed_first else 0.0
    groups = layer_groups(chains)
    middle = []
    for group in groups:       # layer after layer; the halves of one layer share the streams
        layer = place(group)
        middle += [Placed(p.start + t1, p.end + t1, p.half, p.segment) for p in layer]
        t1 = max((p.end for p in middle), default=t1)
    placed_last = [Placed(p.start + t1, p.end + t1, p.half, p.segment) for p in place([last])]
    placed = tuple(placed_first + middle + placed_last)
    duration = max((p.end for p in placed), default=0.0)
    comm = [(p.start, p.end) for p in placed if p.segment.stream == "tp"]
    cover = [(p.start, p.end) for p in placed if p.segment.stream == "compute"]
    return ActionCost(kind=kind, stage=shape.stage, prologue=tuple(first), halves=tuple(tuple(c) for c in chains),
                      layers=tuple(tuple(tuple(c) for c in g) for g in groups),
                      epilogue=tuple(last),
                      placed=placed, duration=duration, exposed_tp=uncovered(comm, cover),
                      flops=sum(p.segment.flops for p in placed),
                      grads_ready=_grads_ready(placed, shape, kind, layer_params, edge_params))


def overlap_cost(f: ActionCost, b: ActionCost, shape: StageShape, layer_params: float,
                 edge_params: tuple[float, float]) -> ActionCost:
    """DualPipe's overlapped slot: the forward ``f`` of one stage and the backward ``b`` (B or I)
    of another (``shape``), each one's TP collectives hidden behind the other's compute
    (DeepSeek-AI 2024, Sec 3.2.1). Its duration is the one rule every engine takes,
    ``costs.split_backward.overlapped_time`` of the two passes' compute and communication. The
    segments are the two chains replayed on the shared compute and TP streams (``place``, as
    sub-pipelined TP's halves) and drawn compressed to that duration; a device stepped segment by
    segment (ZeRO-3, TP sharing a link, full mode) replays them as they are, which hides less
    (``actions.run_stepped``). Kind ``F&`` + the backward's kind; its stage is the backward's."""
    chains = [_flat(f), _flat(b)]
    replay = place(chains)
    replayed = max((p.end for p in replay), default=0.0)
    duration = overlapped_time(*_compute_and_comm(f), *_compute_and_comm(b))
    scale = duration / replayed if replayed > 0 else 1.0
    placed = tuple(Placed(p.start * scale, p.end * scale, p.half, p.segment) for p in replay)
    comm = [(p.start, p.end) for p in placed if p.segment.stream == "tp"]
    cover = [(p.start, p.end) for p in placed if p.segment.stream == "compute"]
    backward = [p for p in placed if p.half == 1]
    return ActionCost(kind="F&" + b.kind, stage=b.stage, prologue=(), halves=tuple(tuple(c) for c in chains),
                      layers=(tuple(tuple(c) for c in chains),), epilogue=(), placed=placed, duration=duration,
                      exposed_tp=uncovered(comm, cover), flops=f.flops + b.flops,
                      grads_ready=_grads_ready(backward, shape, b.kind, layer_params, edge_params), f_stage=f.stage)


def _compute_and_comm(cost: ActionCost) -> tuple[float, float]:
    """Seconds of an action's compute segments, and the rest of its duration (its TP collectives)."""
    compute = sum(p.end - p.start for p in cost.placed if p.segment.stream == "compute")
    return compute, cost.duration - compute


def _flat(cost: ActionCost) -> list[Segment]:
    """An action's segments as one chain, in the order they run (one microbatch: no halves)."""
    return [p.segment for p in cost.placed]


def _grads_ready(placed, shape: StageShape, kind: str, layer_params: float, edge_params: tuple[float, float]):
    """When each layer's (and the head's / embedding's) weight gradients are complete within
    a B or W action, in the order backward produces them: the end of its last compute segment
    (DDP bucket readiness; Li et al. 2020, Sec. 3.2.3). A part with no compute time is ready
    with the part before it."""
    if kind not in ("B", "W"):
        return ()
    done: dict[int | str, float] = {}
    for p in placed:
        if p.segment.stream == "compute":
            key = segment_key(p.segment)
            done[key] = max(done.get(key, 0.0), p.end)
    emb, head = edge_params
    order: list[tuple[int | str, float]] = []
    if shape.is_last:
        order.append(("head", head))
    order += [(shape.first_layer + i, layer_params) for i in reversed(range(len(shape.policies)))]
    if shape.is_first:
        order.append(("embedding", emb))
    out, t, trigger = [], 0.0, None
    for key, n in order:
        if key in done and done[key] >= t:
            t, trigger = done[key], key
        if n > 0:
            out.append(GradPart(trigger, t, n, key))
    return tuple(out)


def segment_key(s: Segment) -> int | str:
    """What a compute segment works on: its layer, or "embedding" / "head"."""
    return s.kind if s.layer < 0 else s.layer
