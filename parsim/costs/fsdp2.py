"""What ZeRO-2/3 run as FSDP2 (``fully_shard``: one unit per layer and one for the rest of a
stage; the reference executor, and calibrated profiles with ``zero_copies: fsdp2``) holds beyond
the ZeRO model states, on one device: the sharded copy beside ZeRO-2's gathered parameters, a
unit's unsharded gradients with the flat reduce-scatter input they are copied into, the root
unit's parameters and its post-backward. ``costs.memory`` adds them up."""
from __future__ import annotations

import math

from parsim.specs import ClusterSpec, DeviceProfile, ModelSpec, Plan, plan_stack, stage_layers

from . import footprint
from .activations import layer_activation_bytes
from .ops import padded_vocab
from .params import embedding_params, head_params, layer_params
from .states import model_state_bytes, plan_state_bytes
from .timing import membound_time
from .zero import gathers_layers


def uses_fsdp2(cluster: ClusterSpec | None) -> bool:
    return cluster is not None and cluster.device.tables.fsdp2_copies


def reduce_scatter_copies(cluster: ClusterSpec | None) -> bool:
    """Does the profile's collective backend copy a reduce-scatter's whole input into a buffer of
    its own? gloo does (``ProcessGroupGloo`` reduces in place on a copy; measured: a 16 MiB
    ``reduce_scatter_tensor`` on 2 ranks allocates 16 MiB), NCCL does not. A profile calibrated on
    the host (ZeRO collectives block there, ``tables.zero_blocking``) ran gloo."""
    return uses_fsdp2(cluster) and cluster.device.tables.zero_blocking


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
    return _root_params(model, plan, vstage) * plan_state_bytes(plan).param


def _root_params(model: ModelSpec, plan: Plan, vstage: int) -> float:
    """Parameters of a virtual stage's root unit on one device: the embedding on the first, the
    final norm and head on the last (``params.embedding_params`` / ``head_params``), none between."""
    return ((embedding_params(model, plan) if vstage == 0 else 0.0)
            + (head_params(model, plan) if vstage == plan.pp * plan.vpp - 1 else 0.0))


def fsdp2_root_post_backward(model: ModelSpec, plan: Plan, vstage: int, held: float,
                             copies_input: bool, middle_relief: float = 0.0) -> tuple[float, float]:
    """ZeRO-2/3 run as FSDP2: (the head's unsharded weight gradient, kept from the head's backward
    to the end of the virtual stage's; the stage's root unit's post-backward,
    ``footprint.unit_post_backward``), bytes per device beyond the model states; (0, 0) on a
    stage without embedding or head. FSDP2 reduce-scatters the root unit (embedding, final norm,
    head: ``fsdp2_root_bytes``) after the stage's last op (torch 2.13
    ``_root_post_backward_final_callback``); its first-computed gradient is the head's, else the
    embedding's (V/t x h in the gradients' dtype). ZeRO-3 reshards the unit before the collective,
    so what every action holds (``held``: ``StageFootprint.gathered_params``) is gone by then;
    ZeRO-2 holds its gathered parameters until the step's last microbatch, whose post-backward
    reshards them too (with one microbatch, that one's); its first microbatch's new shard is the
    one the states count, and from three microbatches on a middle one holds both the gathered
    parameters and a new shard beside the accumulated one, with ``middle_relief`` bytes of
    activations fewer held than at the first one (``memory.second_backward_relief``): the larger
    of the two moments is the stage's. Measured on 2 gloo ranks (an untied
    16,000 x 768 vocabulary, fp32, dp = 2): ZeRO-2 pp 1 / 2 and ZeRO-3 pp 1 peaked here, to 0.1
    MiB; the model without it was 13-30 % low. With 4 microbatches (probe-gqa, 12,000 x 384
    untied, dp 2 pp 1 and pp 2) the peak read one new root shard (17.58 / 8.79 MiB) above the
    model's 2-microbatch moment."""
    last = plan.pp * plan.vpp - 1
    if plan.zero < 2 or plan.dp <= 1 or vstage not in (0, last):
        return 0.0, 0.0
    root = _root_params(model, plan, vstage)
    sb = plan_state_bytes(plan)
    first = sb.grad * padded_vocab(model, plan) * model.hidden / plan.tp
    many = plan.num_microbatches > 1
    post = footprint.unit_post_backward(root * sb.grad, first, plan.dp, plan.zero >= 3 and many, copies_input)
    if plan.zero == 2 and plan.num_microbatches > 2:
        post = max(post, footprint.unit_post_backward(root * sb.grad, first, plan.dp, True, copies_input)
                   - middle_relief)
    if plan.zero >= 3:
        post -= held
    elif not many:
        post -= (stage_layers(model, plan)[vstage] * layer_params(model, plan.tp) + root) * sb.param
    return (first if vstage == last else 0.0), post


def fsdp2_absent_grads(plan: Plan, rank_grads: float, first: bool | None = None) -> float:
    """ZeRO-2/3 as FSDP2 with one microbatch a step: the gradient states the model states count
    (``rank_grads``: the rank's gradient shards) are not there before its units' reduce-scatters
    make them (the optimizer's ``zero_grad`` sets them to None; the first comes after the stage's
    first layer's backward), so the forward's end and the head's and loss's backward hold none of
    them, and the first layer's post-backward only its own (``footprint.backward_working``). With
    more microbatches the first one's shards are there at every later one. Measured on 2 gloo
    ranks (a 4-layer h = 128, 1,024-word bf16 model, dp 2, one microbatch, s = 16-64): the loss's
    backward peaked with no gradient in the tracker, and the model counting them read 8-17 % high.
    ``first``: the same for a rank's first backward of a step with more microbatches, and the
    forwards before it (1F1B's warm-up: dp 2 pp 2 ZeRO-3, two microbatches, the first pipeline
    rank peaked at its second forward's end with no gradient shard); None: one microbatch a step.
    Bytes per device; 0 otherwise."""
    first = plan.num_microbatches == 1 if first is None else first
    return rank_grads if plan.zero >= 2 and plan.dp > 1 and first else 0.0


def fsdp2_after_layers(model: ModelSpec, plan: Plan, first: bool | None = None) -> float:
    """ZeRO-2/3 as FSDP2 with one microbatch a step: what the model states and the gathered
    parameters count but the first stage's embedding backward no longer holds -- the root unit's
    gradient shard, made by its reduce-scatter after the stage's last op, and under ZeRO-2 the
    layers' gathered parameters, each resharded by its post-backward in the step's last (here its
    only) microbatch (``executor/build.py``), less the last layer's reduce-scatter input, which
    torch 2.13 keeps until the next unit's (``reduce_scatter_max_input_buffers`` = 1; ZeRO-3's
    gathered layer stands for it). Measured on 2 gloo ranks (a 4-layer h = 128, 4,096-word tied
    bf16 model, dp 2, s = 16): the embedding's gradients summed beside the root's parameters, the
    layers' shards and one layer's reduce-scatter input, no layer's parameters. ``first``: a rank's
    first backward of a step with more microbatches, where the root's shard is not made yet either
    but ZeRO-2 keeps its layers gathered (``fsdp2_absent_grads``). Bytes per device."""
    first = plan.num_microbatches == 1 if first is None else first
    if plan.zero < 2 or plan.dp <= 1 or not first:
        return 0.0
    sb = plan_state_bytes(plan)
    relief = _root_params(model, plan, 0) * sb.grad / plan.dp
    layers = stage_layers(model, plan)[0]
    if not gathers_layers(plan.zero, plan.dp) and layers and plan.num_microbatches == 1:
        relief += layer_params(model, plan.tp) * (layers * sb.param - sb.grad)
    return relief


def fsdp2_forward_gather(model: ModelSpec, plan: Plan, first: bool | None = None) -> float:
    """ZeRO-2 as FSDP2 with one microbatch a step: the flat output of the forward's last layer
    all-gather, whose free torch 2.13 defers to the root module's post-forward (``AllGatherState``,
    ``FSDPState._post_forward``), so the forward's end -- the executor's loss runs inside its
    stage's root module -- holds it beside the gathered parameters. ZeRO-3's gathered layer
    (``gathered_bytes``) stands for it; with more microbatches ZeRO-2 all-gathers in the first
    forward only, whose end holds none of the gradient shards the states count. Measured on 2 gloo
    ranks (a 4-layer h = 128, 1,024-word bf16 model, dp 2, s = 16-128): the loss's forward peaked
    with one layer's fp32 parameters in a buffer from ``foreach_all_gather``, and the model read
    1.7-4.6 % low without it. ``first``: the forwards before a rank's first backward of a step
    with more microbatches (``fsdp2_absent_grads``). Bytes per device."""
    first = plan.num_microbatches == 1 if first is None else first
    if plan.zero != 2 or plan.dp <= 1 or not first:
        return 0.0
    return layer_params(model, plan.tp) * plan_state_bytes(plan).param


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


def fsdp2_post_backward(model: ModelSpec, plan: Plan, groups: list[tuple[int, str]], in_backward: float,
                        rank_grads: float = math.inf, first: bool | None = None) -> float:
    """ZeRO-2/3 as FSDP2: what a layer's post-backward adds to the stage's stash -- its unsharded
    gradients and the reduce-scatter input they are copied into (``fsdp2_bytes``' second term,
    ``in_backward``), less what the layer saved, which its nodes have freed by then (the smallest
    layer of the stage's (layers, policy) ``groups``). Measured on 2 gloo ranks (cpu-small, dp = 2,
    fp32 and bf16, where a layer's backward is the peak): counting both on top of the whole stash
    was 3.2-4.3 % high, this is within 1.1 %.

    Beside them, the collective's output: a new 1/dp shard of the layer's gradients, where a
    previous microbatch's exists to be added into (else it is the shard the states count); and
    torch 2.13's ``FSDPParamGroup.post_backward`` reshards the layer's parameters before
    ``foreach_reduce`` wherever ``reshard_after_backward`` holds -- every microbatch under ZeRO-3
    (its gathered layer, ``gathered_bytes``, is gone at the collective), only the stage's last
    under ZeRO-2 (``executor/build.py``). So ZeRO-3 holds the new shard less the layer's
    parameters; ZeRO-2 the new shard in a middle microbatch (three or more), and with two the
    larger of its first (no accumulated shards yet: ``rank_grads``, the rank's gradient states,
    are not there) and its last (parameters resharded). Measured op by op on 2 gloo ranks (a
    4-layer h = 128, 1,024-word bf16 model, dp 2, 2 microbatches, s = 16-48, where this moment is
    the peak): the reduce-scatter's input, gloo's copy of it and the new shard, with the next
    layer's prefetched parameters (ZeRO-3) or the other layers' gathered ones (ZeRO-2); the model
    without the two terms read 2.3-3.7 % high, with them within 1 %. ``first`` (True / False): a
    rank's first backward of the step, or one after it, priced apart (``fsdp2_absent_grads`` takes
    the shards off the first); None: both in one. Bytes per device."""
    if not in_backward:
        return 0.0
    own = min(layer_activation_bytes(model, plan, policy) for n, policy in groups if n)
    sb = plan_state_bytes(plan)
    unit = layer_params(model, plan.tp)
    m = plan.num_microbatches
    shard = unit * sb.grad / plan.dp if m > 1 else 0.0
    resharded = unit * sb.param
    if not gathers_layers(plan.zero, plan.dp) and m > 1:    # ZeRO-2: parameters kept to the last backward
        if first is None:
            resharded = 0.0 if m > 2 else min(resharded, rank_grads)
        elif first or m > 2:
            resharded = 0.0
    return max(in_backward - own + shard - resharded, 0.0)


def fsdp_unit_time(device: DeviceProfile, op: str, unit_bytes: float, dp: int) -> tuple[float, float]:
    """(seconds before, seconds after) FSDP2's collective ``op`` of one unit of ``unit_bytes``
    (its full parameters or gradients, bytes) over ``dp`` ranks, beside the collective itself
    (PyTorch FSDP2, ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``, torch 2.13):

    * all-gather: copy-in, the rank's shards into the flat input (``all_gather_copy_in``:
      ``unit_bytes`` / dp read and written), and copy-out of the flat output into the
      unsharded parameters (``split_with_sizes_copy``: ``unit_bytes`` read and written);
    * reduce-scatter: copy-in of the unsharded gradients into the flat input (``chunk_cat``:
      ``unit_bytes`` read and written);

    each a memory-bound pass at the device's streaming rate (``membound_time``, op
    "fsdp_copy"), plus the host work FSDP2 does per unit around each (unsharding and
    resharding the parameters, its hooks, the gradient's DTensor), measured by ``parsim
    calibrate`` (``tables.fsdp_gather_host_s`` / ``fsdp_scatter_host_s``,
    ``calibration.sharded.fsdp_unit_host_s``; absent: 0), charged before the call."""
    t = device.tables
    if op == "all_gather":
        host = t.fsdp_gather_host_s or 0.0
        return host + membound_time(device, 2 * unit_bytes / dp, "fsdp_copy"), \
            membound_time(device, 2 * unit_bytes, "fsdp_copy")
    return (t.fsdp_scatter_host_s or 0.0) + membound_time(device, 2 * unit_bytes, "fsdp_copy"), 0.0
