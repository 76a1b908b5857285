"""Memory per pipeline rank by category (params, grads, optimizer, activations, other).

Model states per parameter (bytes), Megatron-LM conventions (docs, "distributed optimizer"):
    fp32 training:        param 4, grad 4, optimizer 8 (Adam m, v)
    bf16 mixed:           param 2, grad 4, optimizer 12 (fp32 master, m, v): Megatron-LM forces
                          gradient accumulation and all-reduce in fp32 for bf16
                          (arguments.py: "bfloat16 requires gradient accumulation and
                          all-reduce to be done in fp32")
    fp16 mixed:           param 2, grad 2, optimizer 12: fp16 gradients reduced in fp16, the
                          ZeRO paper's 16-byte convention (Rajbhandari et al. 2020, Sec. 3.1)
    16-bit by autocast:   param 4, grad 4, optimizer 8, as fp32: ``torch.autocast`` over fp32
                          parameters (the executor; ``Stack.autocast``, ``plan_state_bytes``)
ZeRO (Rajbhandari et al. 2020, Sec. 5): stage 1 shards the optimizer over the dp ranks,
stage 2 also the gradients, stage 3 also the parameters. ZeRO-Offload (Ren et al. 2021)
keeps optimizer states (and with "optimizer+params", parameters) in host memory.

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

from parsim.specs import ClusterSpec, ModelSpec, Plan, plan_stack, stage_layers

from . import footprint
from .activations import (backward_working_bytes, embedding_activation_bytes, head_activation_bytes,
                          layer_activation_bytes, stage_output_bytes)
from .inflight import rank_moments
from .params import embedding_params, head_params, layer_params, stage_largest_tensors, stage_params
from .placement import rank_of_stage, stages_of_rank
from .recompute import layer_recompute, recomputes_fully, stage_recompute
from .split_backward import (head_output_grad_bytes, output_grad_bytes, w_recompute_residue,
                             weight_grad_working_bytes)
from .stack import apply_stack, default_stack_cluster
from .zero import gathers_layers

CATEGORIES = ("params", "grads", "optimizer", "activations", "other")


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model-state category."""
    param: float
    grad: float
    optimizer: float


def state_bytes(dtype: str, autocast: bool = False) -> StateBytes:
    """Bytes per parameter under ``dtype`` (the module docstring); ``autocast``: a 16-bit run by
    ``torch.autocast`` over fp32 parameters (``Stack.autocast``, the executor), which hold the
    fp32 states of an fp32 run -- the parameters are the master weights."""
    if dtype == "fp32" or autocast:
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


@dataclass(frozen=True)
class StageFootprint:
    """Bytes one virtual stage adds on one device (``costs.footprint``; split backward:
    ``costs.split_backward``)."""
    activations: float       # per microbatch in flight, from its forward's start to its backward's (W's) end
    backward: float          # during each of its backwards (``footprint.backward_working``)
    gathered_params: float   # ZeRO-3: full parameters of two layers (FSDP2: and the root unit) during every action
    kept: float = 0.0             # per microbatch from its I's end to its W's end: the output gradients
    backward_input: float = 0.0   # during each of its input-gradient passes (I)
    backward_weight: float = 0.0  # during each of its weight-gradient passes (W)

    def during(self, kind: str) -> float:
        """What a backward pass of ``kind`` (B, I or W) holds while it runs."""
        return self.backward if kind == "B" else self.backward_input if kind == "I" else self.backward_weight


def zero_model_state_bytes(num_params: float, dp: int, zero: int, k: float = 12.0,
                           param_bytes: float = 2.0, grad_bytes: float = 2.0) -> float:
    """Per-device model-state bytes in the ZeRO paper's convention (Rajbhandari et al. 2020,
    Sec. 5 / Fig. 1): (2 + 2 + K) Psi for DP; (2 + 2 + K/Nd) Psi for P_os;
    (2 + (2 + K)/Nd) Psi for P_os+g; (2 + 2 + K) Psi / Nd for P_os+g+p (``footprint.model_states``
    of one parameter, times Psi)."""
    p, g, o = footprint.model_states(1.0, param_bytes, grad_bytes, k, dp, zero, False, False)
    return num_params * (p + g + o)


def plan_state_bytes(plan: Plan) -> StateBytes:
    """``state_bytes`` of the plan's dtype under its stack."""
    return state_bytes(plan.dtype, plan_stack(plan).autocast)


def model_state_bytes(n_params: float, plan: Plan) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes of ``n_params`` parameters on one device under the plan's
    dtype, ZeRO stage, offload and stack (``footprint.stack_state_bytes``, ``footprint.model_states``)."""
    sb = plan_state_bytes(plan)
    stack = plan_stack(plan)
    param, grad, optimizer = footprint.stack_state_bytes(sb.param, sb.grad, sb.optimizer, plan.zero, stack.fp32_shards,
                                                         stack.grad_copy_bytes(plan.dtype))
    return footprint.model_states(n_params, param, grad, optimizer, plan.dp, plan.zero,
                                  plan.offload != "none", plan.offload == "optimizer+params")


def static_bytes(model: ModelSpec, plan: Plan, pp_rank: int, fsdp2: bool = False) -> tuple[float, ...]:
    """(params, grads, optimizer, activations, other) a pipeline rank holds for the whole step:
    its model states and ZeRO-Offload's staging bucket (``fsdp2``: plus what FSDP2 keeps,
    ``fsdp2_bytes``)."""
    return _static_bytes(model, plan, stage_params(model, plan)[pp_rank], fsdp2)


def _static_bytes(model: ModelSpec, plan: Plan, n_params: float, fsdp2: bool) -> tuple[float, ...]:
    params, grads, optimizer = model_state_bytes(n_params, plan)
    other = footprint.offload_staging(plan.dp_bucket_bytes, plan.offload != "none")
    if fsdp2:
        params += fsdp2_bytes(model, plan, n_params)[0]
    return (params, grads, optimizer, 0.0, other)


def fsdp2_bytes(model: ModelSpec, plan: Plan, n_params: float) -> tuple[float, float]:
    """ZeRO-2/3 run as FSDP2 (profiles with ``zero_copies: fsdp2``, the reference executor):
    (bytes held for the whole step, bytes held during a layer's backward) beyond the ZeRO model.

    * ZeRO-2: FSDP2 keeps the sharded parameters (``n_params`` / dp) as the parameters' storage
      while the gathered ones stay resident across the step (reshard after the last backward).
    * ZeRO-2/3 backward: a layer's unsharded gradients and the flat reduce-scatter input they
      are copied into (FSDP2 ``foreach_reduce``) exist together until the collective ends:
      2 x the layer's gradient bytes."""
    if plan.zero < 2 or plan.dp <= 1:
        return 0.0, 0.0
    sb = plan_state_bytes(plan)
    step = n_params * sb.param / plan.dp if plan.zero == 2 else 0.0
    return step, 2 * layer_params(model, plan.tp) * sb.grad


def fsdp2_released_at_step(model: ModelSpec, plan: Plan, n_params: float) -> float:
    """ZeRO-2 run as FSDP2: the gathered parameters of ``n_params`` (the model states' replicated
    ``params``) are gone at the optimizer step, resharded by the stage's last backward
    (``executor/zero.py``: ``set_reshard_after_backward``), which steps the shards
    (``fsdp2_bytes``'s first term). Bytes per device; 0 otherwise."""
    if plan.zero != 2 or plan.dp <= 1:
        return 0.0
    return model_state_bytes(n_params, plan)[0]


def optimizer_step_bytes(model: ModelSpec, plan: Plan, fsdp2: bool = False) -> list[tuple[float, float]]:
    """Per pipeline rank: (parameter bytes it no longer holds, temporaries it allocates) while
    its optimizer steps, after its last backward (``footprint.optimizer_temporaries`` of the
    largest parameter tensor it holds, ``params.stage_largest_tensors``, under the plan's stack;
    ``fsdp2``: ZeRO-2 run as FSDP2, ``fsdp2_released_at_step``)."""
    stack = plan_stack(plan)
    out = []
    for n_params, largest in zip(stage_params(model, plan), stage_largest_tensors(model, plan)):
        temporaries = footprint.optimizer_temporaries(largest, stack.optimizer_temporaries, plan.dp, plan.zero,
                                                      stack.zero1_whole_tensors, plan.offload != "none")
        out.append((fsdp2_released_at_step(model, plan, n_params) if fsdp2 else 0.0, temporaries))
    return out


def fsdp2_root_bytes(model: ModelSpec, plan: Plan, vstage: int) -> float:
    """ZeRO-3 run as FSDP2 (the reference executor): the full parameters of a virtual stage's root
    unit (its embedding and / or final norm + head; 0 on a middle stage), held during each of its
    actions beside the gathered layers (``gathered_bytes``). ``fully_shard`` of the stage module
    makes the parameters outside its layers one unit; its pre-forward and pre-backward hooks
    all-gather it and its post-forward / post-backward reshard it, so the embedding and head stay
    gathered from the first op of a forward or backward to the last (torch 2.13
    ``_fsdp_state._pre_forward`` / ``_root_post_backward_final_callback``). Bytes per device."""
    if not gathers_layers(plan.zero, plan.dp):
        return 0.0
    root = (embedding_params(model, plan) if vstage == 0 else 0.0) + \
        (head_params(model, plan) if vstage == plan.pp * plan.vpp - 1 else 0.0)
    return root * plan_state_bytes(plan).param


def fsdp2_layer_only_bytes(model: ModelSpec, plan: Plan) -> float:
    """ZeRO-3 run as FSDP2: of the two layers ``gathered_bytes`` counts, the one a layer's backward
    holds and the loss's (or the embedding's) does not. FSDP2 prefetches the next unit in backward
    order, so a layer's backward holds its own parameters and the next layer's, but the loss's
    backward only the first layer it will reach (torch 2.13 ``FSDPParamGroup.pre_backward`` /
    ``_backward_prefetch``). Measured on 2 gloo ranks (heldout-gpt, dp = 2, fp32 and bf16 alike):
    the loss's backward peaks with the root unit, the logits' gradients and exactly one layer's
    fp32 parameters beside the stash. Bytes per device; 0 unless ZeRO-3 gathers layers."""
    if not gathers_layers(plan.zero, plan.dp) or plan_stack(plan).zero3_gathered_layers < 2:
        return 0.0
    return layer_params(model, plan.tp) * plan_state_bytes(plan).param


def fsdp2_post_backward(model: ModelSpec, plan: Plan, groups: list[tuple[int, str]], in_backward: float) -> float:
    """ZeRO-2/3 as FSDP2: what a layer's post-backward adds to the stage's stash -- its unsharded
    gradients and the reduce-scatter input they are copied into (``fsdp2_bytes``' second term,
    ``in_backward``), less what the layer saved, which its nodes have freed by then (the smallest
    layer of the stage's (layers, policy) ``groups``). Measured on 2 gloo ranks (cpu-small, dp = 2,
    fp32 and bf16, where a layer's backward is the peak): counting both on top of the whole stash
    was 3.2-4.3 % high, this is within 1.1 %. Bytes per device."""
    if not in_backward:
        return 0.0
    own = min(layer_activation_bytes(model, plan, policy) for n, policy in groups if n)
    return max(in_backward - own, 0.0)


def uses_fsdp2(cluster: ClusterSpec | None) -> bool:
    return cluster is not None and cluster.device.tables.fsdp2_copies


def gathered_bytes(model: ModelSpec, plan: Plan) -> float:
    """ZeRO-3's (and parameter offload's) gathered layers, held during every action
    (``footprint.gathered_layers``; how many layers at once: the plan's stack)."""
    stack = plan_stack(plan)
    return footprint.gathered_layers(layer_params(model, plan.tp), plan_state_bytes(plan).param, plan.zero,
                                     plan.offload == "optimizer+params", stack.zero3_gathered_layers,
                                     stack.zero3_max_live_params)


def stage_footprints(model: ModelSpec, plan: Plan, fsdp2: bool = False) -> list[StageFootprint]:
    """``StageFootprint`` of every virtual stage (``fsdp2``: ZeRO-2/3 as FSDP2 runs them). Each
    stage's terms are pure functions of a few keys (its recompute groups, its rank, whether it is
    the first / last stage), so each distinct key is priced once."""
    in_backward = fsdp2_bytes(model, plan, 0.0)[1] if fsdp2 else 0.0
    gathered = gathered_bytes(model, plan)
    ahead = fsdp2_layer_only_bytes(model, plan) if fsdp2 else 0.0
    gathered -= ahead
    counts = stage_layers(model, plan)
    groups = [layer_recompute(plan, s, n) for s, n in enumerate(counts)]
    stash = _stashes(model, plan, groups)
    full = [sum(n for n, policy in g if policy == "full") for g in groups]     # ``_full_layers`` of each stage
    weight_working = [in_backward if in_backward else _rank_weight_working(model, plan, r) for r in range(plan.pp)]
    kept_all, kept_input = layer_activation_bytes(model, plan, "none"), layer_activation_bytes(model, plan, "full")
    # W's re-runs of recomputed layers (split_backward): one value per rank, the largest of its
    # stages but the first (whose W is a whole backward), as the working sets
    w_residue = cache(lambda k: w_recompute_residue(model, plan, k))
    residue = [max((w_residue(full[s]) for s in stages_of_rank(plan, r) if s > 0), default=0.0)
               for r in range(plan.pp)]
    # ``_rank_working`` of (rank, weight gradients, layer extra), priced once per distinct key
    working = cache(lambda r, grads, extra: _rank_working(model, plan, r, stash, grads, extra, full))
    output = stage_output_bytes(model, plan)
    last = len(groups) - 1
    layer_dy, head_dy = output_grad_bytes(model, plan), head_output_grad_bytes(model, plan)
    out = []
    for s, g in enumerate(groups):
        transient = footprint.recompute_transient(recomputes_fully(g), kept_all, kept_input)
        r = rank_of_stage(plan, s)
        post = fsdp2_post_backward(model, plan, g, in_backward)
        extra = max(transient, post) + ahead
        backward = working(r, in_backward == 0.0, extra)
        if s == 0:       # no input gradient: its I runs nothing, its W the whole backward (split_backward)
            split = dict(kept=0.0, backward_input=0.0, backward_weight=backward)
        else:
            split = dict(kept=counts[s] * layer_dy + (head_dy if s == last else 0.0),
                         backward_input=working(r, False, transient),
                         backward_weight=residue[r] + weight_working[r])
        root = fsdp2_root_bytes(model, plan, s) if fsdp2 else 0.0
        out.append(StageFootprint(footprint.held_bytes(stash[s], s == last, output), backward, gathered + root,
                                  **split))
    return out


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


def _rank_working(model: ModelSpec, plan: Plan, pp_rank: int, stash: list[float], weight_grads: bool,
                  layer_extra: float = 0.0, full: list[int] | None = None) -> float:
    """The largest ``backward_working_bytes`` of a rank's virtual stages, ``layer_extra`` on the
    layer phase (a backward's recompute transient and FSDP2 gradients: ``footprint.backward_working``;
    the end of the forward before it, with the stage's fully recomputed layers: ``full``, else
    ``_full_layers``)."""
    last = plan.pp * plan.vpp - 1
    return max(backward_working_bytes(model, plan, vstage == 0, vstage == last, stash[vstage], weight_grads,
                                      layer_extra, _full_layers(model, plan, vstage) if full is None else full[vstage])
               for vstage in stages_of_rank(plan, pp_rank))


def _full_layers(model: ModelSpec, plan: Plan, vstage: int) -> int:
    """How many of a virtual stage's layers recompute fully."""
    return sum(n for n, policy in stage_recompute(model, plan, vstage) if policy == "full")


def _rank_weight_working(model: ModelSpec, plan: Plan, pp_rank: int) -> float:
    """The largest weight-gradient working set of a rank's stages (``split_backward``)."""
    last = plan.pp * plan.vpp - 1
    return max(weight_grad_working_bytes(model, plan, s == 0, s == last) for s in stages_of_rank(plan, pp_rank))


def rank_backward_working(model: ModelSpec, plan: Plan, pp_rank: int, weight_grads: bool = True,
                          layer_extra: float = 0.0) -> float:
    """The backward working set of a pipeline rank (``other``): the largest of its virtual
    stages' (``activations.backward_working_bytes``; a chunk's stash is freed as its backward
    goes; ``layer_extra`` on its layer phase). One value per rank, so the SimPy timeline, this analytic model and the fast path
    count it alike under interleaving, where it overstates the first and last ranks' other
    chunks by at most the head's or embedding's extra."""
    stash = [_stash_bytes(model, plan, s, stage_recompute(model, plan, s)) for s in range(plan.pp * plan.vpp)]
    return _rank_working(model, plan, pp_rank, stash, weight_grads, layer_extra)


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
    stages = stage_footprints(model, plan, fsdp2)
    step = optimizer_step_bytes(model, plan, fsdp2)
    out = []
    for r, n_params in enumerate(stage_params(model, plan)):
        params, grads, optimizer, _, other = _static_bytes(model, plan, n_params, fsdp2)
        chunks = [stages[s] for s in stages_of_rank(plan, r)]
        act, extra = rank_peak(chunks, rank_moments(plan, r))
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
