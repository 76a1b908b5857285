"""Memory per pipeline rank by category (params, grads, optimizer, activations, other).

Bytes per parameter of the model states: ``costs.states``; what FSDP2 adds: ``costs.fsdp2``.
The rules themselves are the functions of ``costs.footprint``; this module feeds them the bytes
of a model and plan: ``static_bytes`` (what a rank holds all step), ``stage_footprints`` (what
each virtual stage holds per microbatch in flight, during its backwards, and during every
action), and ``memory_by_stage`` adds them up at the moments ``costs.inflight.peak_moments``
lists, or at the optimizer step after the last backward (``optimizer_step_bytes``) where that
weighs more. The SimPy engine allocates the same ``static_bytes``, ``stage_footprints`` and
``optimizer_step_bytes`` on its timeline as the actions and the step run (``parsim.sim.memory``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache

from parsim.schedules import chunk_of_pass, held_at_backwards
from parsim.specs import ClusterSpec, ModelSpec, Plan, plan_stack, stage_layers

from . import footprint
from .activations import (backward_working_bytes, embedding_activation_bytes, head_activation_bytes,
                          layer_activation_bytes, loss_saved_bytes, stage_output_bytes)
from .fsdp2 import (fsdp2_absent_grads, fsdp2_after_layers, fsdp2_bytes, fsdp2_forward_gather, fsdp2_layer_only_bytes,
                    fsdp2_post_backward, fsdp2_released_at_step, fsdp2_root_bytes, fsdp2_root_post_backward,
                    reduce_scatter_copies, uses_fsdp2)
from .inflight import COUNTED, Moment, rank_moments
from .params import layer_params, stage_params, step_windows, zero1_owned_params
from .placement import rank_of_stage, stages_of_rank
from .recompute import layer_recompute, recomputes_fully, stage_recompute
from .split_backward import (head_output_grad_bytes, input_attention_bytes, output_grad_bytes, w_recompute_residue,
                             weight_grad_working_bytes)
from .stack import apply_stack, default_stack_cluster
from .states import StateBytes, model_state_bytes, plan_state_bytes, state_bytes, zero_model_state_bytes  # noqa: F401

CATEGORIES = ("params", "grads", "optimizer", "activations", "other")


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


@dataclass(frozen=True)
class StageFootprint:
    """Bytes one virtual stage adds on one device (``costs.footprint``; split backward:
    ``costs.split_backward``)."""
    activations: float       # per microbatch in flight, from its forward's start to its backward's (W's) end
    backward: float          # during each of its backwards (``footprint.backward_working``)
    gathered_params: float   # ZeRO-3: full parameters of two layers (FSDP2: and the root unit) during every action
    kept: float = 0.0             # per microbatch from its I's end to its W's end: the output gradients
    #                               (less, on the last stage, the loss's logits I frees)
    backward_input: float = 0.0   # during each of its input-gradient passes (I)
    backward_weight: float = 0.0  # during each of its weight-gradient passes (W)

    def during(self, kind: str) -> float:
        """What a backward pass of ``kind`` (B, I or W) holds while it runs."""
        return self.backward if kind == "B" else self.backward_input if kind == "I" else self.backward_weight


def static_bytes(model: ModelSpec, plan: Plan, pp_rank: int, fsdp2: bool = False) -> tuple[float, ...]:
    """(params, grads, optimizer, activations, other) a pipeline rank holds for the whole step:
    its model states and ZeRO-Offload's staging bucket (``fsdp2``: plus what FSDP2 keeps,
    ``fsdp2_bytes``)."""
    return _static_bytes(model, plan, stage_params(model, plan)[pp_rank], fsdp2, _zero1_owned(model, plan)[pp_rank])


def first_backward_apart(plan: Plan, fsdp2: bool) -> bool:
    """Do both engines price a rank's first backward of the step (and the forwards before it)
    apart from its others: FSDP2's gradient shards are made by it (``fsdp2_absent_grads``). Where
    a step has one microbatch every backward is a first; with more, under the schedules whose
    moments are counted in order (``inflight.COUNTED``); walked schedules keep the shards all step
    (an upper bound)."""
    return (fsdp2 and plan.zero >= 2 and plan.dp > 1
            and (plan.num_microbatches == 1 or plan.schedule in COUNTED))


def unmade_grads(model: ModelSpec, plan: Plan, pp_rank: int, fsdp2: bool = False) -> float:
    """Of a pipeline rank's gradient states (``static_bytes``), the bytes not there before its
    first backward (``first_backward_apart``: FSDP2's shards); the analytic moments take them off
    that backward (``stage_footprints(first=True)``), the SimPy timeline allocates them at its
    start. 0 otherwise."""
    return _rank_grads(model, plan)[pp_rank] if first_backward_apart(plan, fsdp2) else 0.0


def _rank_grads(model: ModelSpec, plan: Plan) -> list[float]:
    """Per pipeline rank: the gradient bytes its model states count."""
    return [model_state_bytes(n, plan)[1] for n in stage_params(model, plan)]


def footprints_apart(model: ModelSpec, plan: Plan, fsdp2: bool = False,
                     copies_input: bool = False) -> tuple[list[StageFootprint], list[StageFootprint] | None]:
    """(``stage_footprints`` of a rank's backwards, of its first backward where that one is priced
    apart, else None): with several microbatches a step and ``first_backward_apart``. Both
    engines take them from here."""
    if not (first_backward_apart(plan, fsdp2) and plan.num_microbatches > 1):
        return stage_footprints(model, plan, fsdp2, copies_input), None
    return (stage_footprints(model, plan, fsdp2, copies_input, first=False),
            stage_footprints(model, plan, fsdp2, copies_input, first=True))


def first_apart_peak(chunks: list[StageFootprint], firsts: list[StageFootprint], plan: Plan,
                     pp_rank: int) -> tuple[float, float]:
    """``rank_peak`` where the rank's first backward holds ``firsts`` (its chunks as
    ``stage_footprints(first=True)`` prices them) and the ones after it ``chunks``: the moments of
    ``inflight.peak_moments`` and one more, the first backward after them, which may hold as many
    microbatches with the gradient shards made (1F1B's steady state)."""
    vpp, m = plan.vpp, plan.num_microbatches
    count = min(min(plan.pp * vpp, m * vpp) + 1, m * vpp)
    moments = [Moment(chunk_of_pass(k, plan.pp, vpp, backward=True), held)
               for k, held in enumerate(held_at_backwards(plan.schedule, pp_rank, plan.pp, m, vpp, count))]
    first = rank_peak(firsts, moments[:1])
    rest = rank_peak(chunks, moments[1:]) if len(moments) > 1 else (-1.0, 0.0)
    return first if sum(first) >= sum(rest) else rest


def _zero1_owned(model: ModelSpec, plan: Plan) -> list[float]:
    """Per pipeline rank: the parameters ZeRO-1's most-loaded replica owns where tensors go whole
    (``params.zero1_owned_params``; ``model_state_bytes`` reads them under such a stack), -1
    without ZeRO-1 over several replicas."""
    return zero1_owned_params(model, plan) if plan.zero == 1 and plan.dp > 1 else [-1.0] * plan.pp


def _static_bytes(model: ModelSpec, plan: Plan, n_params: float, fsdp2: bool, zero1_owned: float) -> tuple[float, ...]:
    params, grads, optimizer = model_state_bytes(n_params, plan, zero1_owned)
    other = footprint.offload_staging(plan.dp_bucket_bytes, plan.offload != "none")
    if fsdp2:
        params += fsdp2_bytes(model, plan, n_params)[0]
    return (params, grads, optimizer, 0.0, other)


def optimizer_step_bytes(model: ModelSpec, plan: Plan, fsdp2: bool = False) -> list[tuple[float, float]]:
    """Per pipeline rank: (parameter bytes it no longer holds, temporaries it allocates) while
    its optimizer steps, after its last backward (``footprint.optimizer_temporaries`` of the
    heaviest moment of its loop over its tensors, ``params.step_windows``, under the plan's
    stack; ``fsdp2``: ZeRO-2 run as FSDP2, ``fsdp2_released_at_step``)."""
    stack = plan_stack(plan)
    replicas = step_windows(model, plan, replicas=True) if plan.zero == 1 and plan.dp > 1 else [-1.0] * plan.pp
    out = []
    for n_params, window, replica in zip(stage_params(model, plan), step_windows(model, plan), replicas):
        temporaries = footprint.optimizer_temporaries(window, plan.dp, plan.zero, stack.zero1_whole_tensors,
                                                      plan.offload != "none", replica)
        out.append((fsdp2_released_at_step(model, plan, n_params) if fsdp2 else 0.0, temporaries))
    return out


def gathered_bytes(model: ModelSpec, plan: Plan) -> float:
    """ZeRO-3's (and parameter offload's) gathered layers, held during every action
    (``footprint.gathered_layers``; how many layers at once: the plan's stack)."""
    stack = plan_stack(plan)
    return footprint.gathered_layers(layer_params(model, plan.tp), plan_state_bytes(plan).param, plan.zero,
                                     plan.offload == "optimizer+params", stack.zero3_gathered_layers,
                                     stack.zero3_max_live_params)


def stage_footprints(model: ModelSpec, plan: Plan, fsdp2: bool = False,
                     copies_input: bool = False, first: bool | None = None) -> list[StageFootprint]:
    """``StageFootprint`` of every virtual stage (``fsdp2``: ZeRO-2/3 as FSDP2 runs them;
    ``copies_input``: over a backend that copies a reduce-scatter's input, ``reduce_scatter_copies``;
    ``first``: as a rank's first backward of the step runs, before its gradient shards are made,
    ``fsdp2_absent_grads``; None: where every backward is a first, one microbatch a step).
    Each stage's terms are pure functions of a few keys (its recompute groups, its rank, whether it
    is the first / last stage), so each distinct key is priced once."""
    in_backward = fsdp2_bytes(model, plan, 0.0)[1] if fsdp2 else 0.0
    gathered = gathered_bytes(model, plan)
    ahead = fsdp2_layer_only_bytes(model, plan) if fsdp2 else 0.0
    gathered -= ahead
    counts = stage_layers(model, plan)
    groups = [layer_recompute(plan, s, n) for s, n in enumerate(counts)]
    stash = _stashes(model, plan, groups)
    # what every action of a stage holds: ZeRO-3's gathered layers, and under FSDP2 its root unit
    held = [gathered + (fsdp2_root_bytes(model, plan, s) if fsdp2 else 0.0) for s in range(len(groups))]
    output = stage_output_bytes(model, plan)
    last = len(groups) - 1
    roots = None
    if fsdp2:
        per_microbatch = [footprint.held_bytes(stash[v], v == last, output) for v in range(len(groups))]
        # only the first and last stages have a root unit to post-backward
        roots = [fsdp2_root_post_backward(model, plan, s, held[s], copies_input,
                                          second_backward_relief(plan, s, per_microbatch) if s in (0, last) else 0.0)
                 for s in range(len(groups))]
    full = [sum(n for n, policy in g if policy == "full") for g in groups]     # ``_full_layers`` of each stage
    # every pass holds its own virtual stage's working set, not the largest of its rank's: under
    # interleaving a chunk's recomputed layers are not there while another chunk's backward runs
    weight_working = cache(lambda s: in_backward if in_backward else _stage_weight_working(model, plan, s))
    # a split backward's I at its lowest layer's attention, by that layer's recompute policy
    i_attention = cache(lambda policy: input_attention_bytes(model, plan, policy))
    kept_all, kept_input = layer_activation_bytes(model, plan, "none"), layer_activation_bytes(model, plan, "full")
    # W's re-runs of recomputed layers (split_backward), of stages but the first (whose W is a
    # whole backward)
    w_residue = cache(lambda k: w_recompute_residue(model, plan, k))
    # ``_stage_working`` of (virtual stage, weight gradients, layer extra), priced once per distinct key
    layer_dy, head_dy = output_grad_bytes(model, plan), head_output_grad_bytes(model, plan)
    loss_saved = loss_saved_bytes(model, plan)
    rank_grads = _rank_grads(model, plan) if in_backward else [0.0] * plan.pp
    absent = [fsdp2_absent_grads(plan, g, first) for g in rank_grads]
    after_layers = fsdp2_after_layers(model, plan, first) if in_backward else 0.0
    forward_held = fsdp2_forward_gather(model, plan, first) if in_backward else 0.0
    working = cache(lambda v, grads, extra: _stage_working(model, plan, v, stash, grads, extra, full, roots,
                                                           absent[rank_of_stage(plan, v)], after_layers, forward_held))
    # a layer's own shard is there from its reduce-scatter on (``fsdp2_absent_grads``); with more
    # microbatches its post-backward counts it already (``fsdp2_post_backward``)
    unit_shard = layer_params(model, plan.tp) * plan_state_bytes(plan).grad / plan.dp
    unit_shard *= plan.num_microbatches == 1
    out = []
    for s, g in enumerate(groups):
        transient = footprint.recompute_transient(recomputes_fully(g), kept_all, kept_input)
        r = rank_of_stage(plan, s)
        post = fsdp2_post_backward(model, plan, g, in_backward, rank_grads[r], first)
        extra = max(transient, post) + ahead - max(absent[r] - unit_shard, 0.0)
        backward = working(s, in_backward == 0.0, extra)
        if s == 0:       # no input gradient: its I runs nothing, its W the whole backward (split_backward)
            split = dict(kept=0.0, backward_input=0.0, backward_weight=backward)
        else:
            split = dict(kept=footprint.split_kept(counts[s] * layer_dy, head_dy, loss_saved, output, output, s == last),
                         backward_input=max(working(s, False, transient),
                                            footprint.input_grad_end(counts[s] * layer_dy, head_dy, output, s == last,
                                                                     i_attention(_lowest_policy(g)))),
                         backward_weight=w_residue(full[s]) + weight_working(s))
        out.append(StageFootprint(footprint.held_bytes(stash[s], s == last, output), backward, held[s], **split))
    return out


def second_backward_relief(plan: Plan, vstage: int, held_bytes: list[float]) -> float:
    """Bytes of activations the rank of ``vstage`` holds less as that stage's second backward of
    a step starts than as its first does (``held_bytes``: what one microbatch holds in each virtual
    stage, ``footprint.held_bytes``): one microbatch's worth under GPipe, where every forward comes
    first, none in 1F1B's steady state (``schedules.held_at_backwards``). Walked schedules
    (``inflight.COUNTED`` lacks them) count none: the second moment is priced as heavy as the
    first, an upper bound."""
    if plan.schedule not in COUNTED:
        return 0.0
    r, vpp = rank_of_stage(plan, vstage), plan.vpp
    stages = stages_of_rank(plan, r)
    chunk = stages.index(vstage)
    moments = held_at_backwards(plan.schedule, r, plan.pp, plan.num_microbatches, vpp,
                                min(plan.num_microbatches * vpp, (plan.pp + 2) * vpp))
    mine = [held for k, held in enumerate(moments) if chunk_of_pass(k, plan.pp, vpp, backward=True) == chunk][:2]
    if len(mine) < 2:
        return 0.0
    return max(sum((a - b) * held_bytes[stages[c]] for c, (a, b) in enumerate(zip(*mine))), 0.0)


def _stashes(model: ModelSpec, plan: Plan, groups: list[list[tuple[int, str]]]) -> list[float]:
    """``_stash_bytes`` of every virtual stage, priced once per distinct (groups, first, last)."""
    last = plan.pp * plan.vpp - 1
    stash = cache(lambda vstage, g: _stash_bytes(model, plan, vstage, g))
    return [stash(0 if s == 0 else last if s == last else -1, tuple(g)) for s, g in enumerate(groups)]


def _stash_bytes(model: ModelSpec, plan: Plan, vstage: int, groups: list[tuple[int, str]]) -> float:
    """``footprint.stash_bytes`` of a virtual stage with these (layers, policy) groups: its layers
    per recompute policy, the embedding's on the first, the head's on the last."""
    layers = sum(n * layer_activation_bytes(model, plan, policy) for n, policy in groups)
    return footprint.stash_bytes(layers, vstage == 0, vstage == plan.pp * plan.vpp - 1,
                                 embedding_activation_bytes(model, plan), head_activation_bytes(model, plan))


def _stage_working(model: ModelSpec, plan: Plan, vstage: int, stash: list[float], weight_grads: bool,
                   layer_extra: float = 0.0, full: list[int] | None = None,
                   roots: list[tuple[float, float]] | None = None, absent: float = 0.0,
                   after_layers: float = 0.0, forward_held: float = 0.0) -> float:
    """``backward_working_bytes`` of a virtual stage's backward, ``layer_extra`` on the layer phase
    (a backward's recompute transient and FSDP2 gradients: ``footprint.backward_working``; the end
    of the forward before it, with the stage's fully recomputed layers: ``full``, else
    ``_full_layers``; FSDP2's root unit per virtual stage: ``roots``, ``fsdp2_root_post_backward``;
    the rank's gradient states not made yet: ``absent``, ``fsdp2_absent_grads``; ``after_layers``,
    ``fsdp2_after_layers``; ``forward_held``, ``fsdp2_forward_gather``)."""
    last = plan.pp * plan.vpp - 1
    return backward_working_bytes(model, plan, vstage == 0, vstage == last, stash[vstage], weight_grads,
                                  layer_extra, _full_layers(model, plan, vstage) if full is None else full[vstage],
                                  *(roots[vstage] if roots else ()), absent=absent, after_layers=after_layers,
                                  root_grads=roots is not None, forward_held=forward_held)


def _full_layers(model: ModelSpec, plan: Plan, vstage: int) -> int:
    """How many of a virtual stage's layers recompute fully."""
    return sum(n for n, policy in stage_recompute(model, plan, vstage) if policy == "full")


def _stage_weight_working(model: ModelSpec, plan: Plan, vstage: int) -> float:
    """The weight-gradient working set of a stage with an input gradient (``split_backward``; the
    first stage's W is its whole backward, priced as one, ``stage_footprints``, so the embedding
    gradient is no W's of the rank's other chunks: interleaved-zb's rank 0 read 5.6 % high with
    it, heldout-gpt pp=2 vpp=2)."""
    return weight_grad_working_bytes(model, plan, vstage == plan.pp * plan.vpp - 1, stage_layers(model, plan)[vstage])


def _lowest_policy(groups: list[tuple[int, str]]) -> str:
    """The recompute policy of a stage's lowest layer (``groups``: its ``stage_recompute``)."""
    return next((policy for n, policy in groups if n), "none")


def rank_backward_working(model: ModelSpec, plan: Plan, pp_rank: int, weight_grads: bool = True,
                          layer_extra: float = 0.0, roots: list[tuple[float, float]] | None = None) -> float:
    """The largest backward working set of a pipeline rank's virtual stages
    (``activations.backward_working_bytes``; a chunk's stash is freed as its backward goes;
    ``layer_extra`` on its layer phase; ``roots``: FSDP2's root units, ``_stage_working``). Each
    backward holds its own stage's (``stage_footprints``); this is the heaviest of them."""
    stash = [_stash_bytes(model, plan, s, stage_recompute(model, plan, s)) for s in range(plan.pp * plan.vpp)]
    return max(_stage_working(model, plan, s, stash, weight_grads, layer_extra, roots=roots)
               for s in stages_of_rank(plan, pp_rank))


def rank_peak(chunks: list[StageFootprint], moments: list) -> tuple[float, float]:
    """(activations, backward bytes) at a rank's heaviest moment: each of its chunks' held bytes
    times the microbatches it holds then, and the running backward's bytes and gathered
    parameters on top (the first such moment when several weigh the same)."""
    best = (-1.0, 0.0, 0.0)
    for moment in moments:
        chunk, held = moment[0], moment[1]
        kind, kept = (moment[2], moment[3]) if len(moment) > 2 else ("B", ())     # PassMoment / Moment
        act = sum(chunks[c].activations * n for c, n in enumerate(held))
        if kept:
            act += sum(chunks[c].kept * n for c, n in enumerate(kept))
        running = chunks[chunk]
        extra = (running.backward if kind == "B" else running.during(kind)) + running.gathered_params
        if act + extra > best[0]:
            best = (act + extra, act, extra)
    return best[1], best[2]


def memory_by_stage(model: ModelSpec, plan: Plan, cluster: ClusterSpec | None = None) -> list[StageMemory]:
    """Peak memory of every pipeline rank (per device; TP and DP peers are identical): its
    heaviest backward (``rank_peak``) or its optimizer step (``optimizer_step_bytes``), under
    the plan's software stack where a cluster is given (``costs.stack.apply_stack``)."""
    if cluster is not None:
        model, cluster, plan = apply_stack(model, cluster, plan)
    fsdp2 = uses_fsdp2(cluster)
    stages, firsts = footprints_apart(model, plan, fsdp2, reduce_scatter_copies(cluster))
    step = optimizer_step_bytes(model, plan, fsdp2)
    out = []
    for r, (n_params, owned) in enumerate(zip(stage_params(model, plan), _zero1_owned(model, plan))):
        params, grads, optimizer, _, other = _static_bytes(model, plan, n_params, fsdp2, owned)
        chunks = [stages[s] for s in stages_of_rank(plan, r)]
        if firsts is None:
            act, extra = rank_peak(chunks, rank_moments(plan, r))
        else:
            act, extra = first_apart_peak(chunks, [firsts[s] for s in stages_of_rank(plan, r)], plan, r)
        released, temporaries = step[r]
        if footprint.optimizer_step_peaks(act + extra, temporaries, released):
            params, act, extra = params - released, 0.0, temporaries
        out.append(StageMemory(stage=r, params=params, grads=grads, optimizer=optimizer, activations=act,
                               other=other + extra))
    return out


def device_capacity(cluster: ClusterSpec) -> float:
    """Bytes a framework can allocate on one device (under the stack applied, else the
    profile's default stack: its allocator reserve, ``costs.stack``)."""
    cluster = default_stack_cluster(cluster)
    return cluster.device.memory_bytes * cluster.device.usable_memory_fraction


def fits(model: ModelSpec, plan: Plan, cluster: ClusterSpec) -> bool:
    model, cluster, plan = apply_stack(model, cluster, plan)
    cap = device_capacity(cluster)
    return all(s.total <= cap for s in memory_by_stage(model, plan, cluster))
