"""The memory rules of one device, as functions of numbers (counts, bytes, flags) to bytes.

Each rule is written here once, and every engine runs this code: ``costs.memory`` (the
analytic model) and the SimPy engine (``sim.memory``) call these functions with the bytes of a
model and plan (``costs.activations``, ``costs.params``), the partitioner
(``partition.stage_cost``) with those of its cost graph, and the fast path compiles them with
numba into its sweep kernel (``fast.memory``), fed from its cost tables. So they take plain
numbers, use only arithmetic, comparisons and ``min``/``max``, and call no function but the ZeRO
rules of ``costs.zero`` (which the fast path registers with numba: ``fast.rules``); the one
rule over a sequence (``step_window``) the fast path runs where it builds its rank rows.
"""
from __future__ import annotations

from collections.abc import Sequence

from .zero import zero_shard


def model_states(n_params: float, param_bytes: float, grad_bytes: float, optimizer_bytes: float, dp: int,
                 zero: int, offload_optimizer: bool, offload_params: bool,
                 zero1_owned: float = -1.0) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes of ``n_params`` parameters on one of ``dp`` ranks.

    ZeRO (Rajbhandari et al. 2020, Sec. 5): stage 1 shards the optimizer states over the dp
    ranks, stage 2 also the gradients, stage 3 also the parameters. ZeRO-Offload (Ren et al.
    2021) keeps the optimizer states on the host and streams the gradients there (none stay on
    the device); ``offload_params`` ("optimizer+params") moves the parameters too. A stage-1
    partition of whole tensors (``Stack.zero1_whole_tensors``) gives the most-loaded replica
    ``zero1_owned`` parameters' states (``params.zero1_owned_params``; negative: an even split)."""
    params = zero_shard(n_params * param_bytes, dp, zero, 3)
    grads = zero_shard(n_params * grad_bytes, dp, zero, 2)
    optimizer = zero_shard(n_params * optimizer_bytes, dp, zero, 1)
    if zero == 1 and dp > 1 and zero1_owned >= 0:
        optimizer = zero1_owned * optimizer_bytes
    if offload_optimizer:
        grads = 0.0
        optimizer = 0.0
    if offload_params:
        params = 0.0
    return params, grads, optimizer


def offload_staging(bucket_bytes: float, offload_optimizer: bool) -> float:
    """ZeRO-Offload's pinned staging memory: one gradient bucket in flight over PCIe (DeepSpeed
    allocates it up front), held all step (``other``)."""
    return float(bucket_bytes) if offload_optimizer else 0.0


def stack_state_bytes(param_bytes: float, grad_bytes: float, optimizer_bytes: float, zero: int, fp32_shards: bool,
                      grad_copy_bytes: float) -> tuple[float, float, float]:
    """(param, grad, optimizer) bytes per parameter of the model state before sharding, as the
    software stack keeps it:

    * a ZeRO-3 run whose software keeps its shard in fp32 as the optimizer's master weight
      (FSDP with a bf16 mixed-precision policy: PyTorch FSDP docs, "Mixed precision";
      ``Stack.fp32_shards``) holds 4 bytes of parameter and only Adam's m and v beside it (the
      16-bit copy exists only gathered, ``gathered_layers``): 4 + grad + (optimizer - 4);
    * DeepSpeed's BF16 optimizer (ZeRO 0-1) accumulates the gradients in a flat fp32 buffer of
      the whole model and keeps the model's bf16 ``.grad`` tensors beside it
      (deepspeed/runtime/bf16_optimizer.py: ``fp32_groups_gradients_flat``): ``grad_copy_bytes``
      (2 in bf16, ``Stack.bf16_grad_copy_bytes``) more per parameter, not sharded.
    Otherwise as given."""
    if zero >= 3 and fp32_shards and param_bytes < 4.0:
        return 4.0, grad_bytes, optimizer_bytes - 4.0
    if zero <= 1:
        return param_bytes, grad_bytes + grad_copy_bytes, optimizer_bytes
    return param_bytes, grad_bytes, optimizer_bytes


def step_window(tensors: Sequence[tuple[float, bool]], copies: float, carry: float) -> float:
    """Elements of fp32 temporaries an optimizer step holds at its heaviest moment on one device,
    stepping ``tensors`` ((elements, is a matrix), in order) in two parameter groups, the
    matrices then the rest (the executor's AdamW: weight decay on >= 2-D tensors only,
    ``executor/optimizer.py`` ``make_adamw``). torch's single-tensor AdamW (torch 2.13
    ``optim/adam.py`` ``_single_tensor_adam``; Composer's DecoupledAdamW alike) loops over a
    group's tensors: ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`` holds
    sqrt(v) and the quotient of tensor i at once (``copies``: 2) while the previous tensor's
    ``denom`` stays bound to the name until the assignment (``carry``: 1), so the window is
    max_i copies s_i + carry s_(i-1), each group starting afresh (a new call). A fused kernel:
    none (``Stack.optimizer_temporaries`` / ``optimizer_carry``)."""
    best = 0.0
    for matrices in (True, False):
        previous = 0.0
        for size, matrix in tensors:
            if matrix == matrices:
                best = max(best, copies * size + carry * previous)
                previous = size
    return best


def optimizer_temporaries(window: float, dp: int, zero: int, whole_tensors: bool, offload_optimizer: bool,
                          replica_window: float = -1.0) -> float:
    """Bytes the optimizer step allocates beside the model states while it runs (``other``), on
    one device: ``window`` elements of fp32 temporaries (the master weights' type) at its
    heaviest moment (``step_window`` of the tensors it steps). Under ZeRO the step sees each
    tensor's 1/dp shard (``zero_shard`` of stage 1), unless ZeRO-1 gives whole tensors to one
    replica (``whole_tensors``): a replica then steps its own tensors, the heaviest replica's
    window being ``replica_window`` (``params.step_windows``; negative: not known, the rank's
    whole window), and ZeRO-2/3 (FSDP2) shard every tensor. ZeRO-Offload steps on the host:
    none on the device."""
    if offload_optimizer:
        return 0.0
    if whole_tensors and zero == 1 and dp > 1 and replica_window >= 0:
        return 4.0 * replica_window
    return 4.0 * zero_shard(window, dp, zero, 2 if whole_tensors else 1)


def optimizer_step_peaks(backward_extra: float, temporaries: float, released: float) -> bool:
    """Is the optimizer step a rank's heaviest moment? It runs after the step's last backward,
    with every activation freed and the model states held: it beats the heaviest backward
    (``backward_extra``: its activations and working set beyond the model states) when its
    ``temporaries`` less what the step no longer holds (``released``: FSDP2's ZeRO-2 gathered
    parameters, resharded by the last backward) weigh more; the backward, which comes first,
    wins a tie."""
    return temporaries - released > backward_extra


def gathered_layers(layer_params: float, param_bytes: float, zero: int, offload_params: bool, layers: float,
                    max_live: float) -> float:
    """ZeRO-3 (and parameter offload) materialise the full parameters of the layers being
    gathered during every action (``other``): ``layers`` of them (the current and the
    prefetched one: 2; ``Stack.zero3_gathered_layers``), at most ``max_live`` parameters
    (DeepSpeed's stage3_max_live_parameters; ``Stack.zero3_max_live_params``)."""
    return min(layers * layer_params, max_live) * param_bytes if (zero >= 3 or offload_params) else 0.0


def stash_bytes(layers: float, first: bool, last: bool, embedding: float, head: float) -> float:
    """Bytes one microbatch stores for its backward in one virtual stage: its layers' (``layers``,
    Korthikanti et al. 2022 Table 2 per recompute policy), the embedding's dropout mask on the
    first virtual stage, the final norm's input and the logits on the last."""
    stash = layers
    if first:
        stash += embedding
    if last:
        stash += head
    return stash


def held_bytes(stash: float, last: bool, output: float) -> float:
    """Bytes one microbatch holds in a virtual stage from its forward's start to its backward's
    end: the stash, and on every stage but the last the output it sent
    (``activations.stage_output_bytes``)."""
    return stash + (0.0 if last else output)


def recompute_transient(recomputes_fully: bool, layer_kept_all: float, layer_kept_input: float) -> float:
    """A backward that recomputes a layer fully briefly holds that layer's full activations again
    beside the input it stored (Chen et al. 2016): the layer's bytes without recomputation minus
    those under full recomputation (``activations.layer_activation_bytes``)."""
    return layer_kept_all - layer_kept_input if recomputes_fully else 0.0


def unit_post_backward(unit_grads: float, first_grad: float, dp: int, shard_exists: bool,
                       copies_input: bool) -> float:
    """Bytes an FSDP2 unit's post-backward holds at its reduce-scatter, beyond the model states,
    on one device (torch 2.13 ``FSDPParamGroup.post_backward`` -> ``foreach_reduce``): the flat
    input the unit's ``unit_grads`` are copied into; of the unsharded gradients, the one computed
    first (``first_grad``), which autograd still references; the new 1/``dp`` shard, where a
    previous microbatch's already exists to be added into (``shard_exists``; else it is the
    shard the states count); and the whole input again where the collective copies it
    (``copies_input``: gloo's ``reduce_scatter_tensor`` reduces in a buffer of its own).
    Measured op by op on the executor's root units (2 gloo ranks, an untied 16,000-word
    vocabulary, ZeRO-2 and ZeRO-3, pp 1 and 2): each term to 0.1 MiB."""
    shard = unit_grads / dp if shard_exists else 0.0
    return first_grad + unit_grads + shard + (unit_grads if copies_input else 0.0)


def backward_working(layer: float, output: float, head: float, vocab_grad: float, embedding_grad: float,
                     logits_grad: float, tied: bool,
                     first: bool, last: bool, stash: float, layer_extra: float, forward: float = 0.0,
                     head_kept: float = 0.0, root_post: float = 0.0, absent: float = 0.0,
                     after_layers: float = 0.0) -> float:
    """Bytes a virtual stage's backward holds beyond its stored activations at the backward's peak
    (``other``), on one device; ``stash`` = the bytes one microbatch stores in the stage (freed as
    the backward goes). The largest of:

    * a layer (``layer``, ``activations.layer_working_bytes``): the gradient of its largest weight
      plus the activation gradients alive in the MLP backward, and ``layer_extra``, what only a
      layer's backward holds: the recompute transient (``recompute_transient``: non-reentrant
      ``torch.utils.checkpoint`` re-runs a layer's forward when its backward first unpacks a saved
      tensor, ``_checkpoint_hook.unpack_hook``; the head and the embedding are not checkpointed, so
      their backwards run before or after it) and FSDP2's unsharded gradients of the layer with the
      flat reduce-scatter input (``memory.fsdp2_bytes``: the layer unit's post-backward; the
      loss's and head's backward come before any layer's). Measured on the executor (CPU fp32):
      the last stage's peak is the loss gradients beside the stash alone, the first stage's the
      recomputed layer (tests/test_memory_model.py);
    * the last stage starts with the head: the output weight's gradient (``vocab_grad``) plus the
      gradient of the final norm's output (``output``, e*s*b*h/sp), or the cross-entropy's two
      fp32 logits gradients (``logits_grad``), while a layer's backward comes after the head's
      stored bytes (``head``) are freed;
    * the first stage ends with the embedding, whose backward writes a dense V/t x h gradient
      (``embedding_grad``: ``embedding_dense_backward``, in the dtype of the gradient it receives)
      when the microbatch's stash is gone (beside the gradient received from the next stage and
      the embedding output's);
    * one stage holding both ends of tied embeddings (pp = 1): autograd keeps the head's weight
      gradient until the embedding's arrives to sum them (its input buffer), so the layers run
      their backward beside it, and at the end the two and their sum exist together.

    * FSDP2 (ZeRO-2/3): the head's unsharded weight gradient (``head_kept``) stays from the
      head's backward to the end of the stage's, beside its layers' backward; and after the
      stage's last op, with the microbatch's stash gone, its root unit's post-backward
      (``root_post``, ``unit_post_backward`` less what is resharded before it).

    * ``absent``: gradient states the model states count but the stage's start does not hold yet
      (FSDP2 without gradient accumulation: ``fsdp2.fsdp2_absent_grads``), off the forward's end
      and the head's and loss's moments, before the first reduce-scatter; a layer's moment comes
      with its own in ``layer_extra``; ``after_layers``: what the model states and the gathered
      parameters count but the embedding's backward no longer holds (``fsdp2.fsdp2_after_layers``).

    and, where it weighs more, the end of the forward before it (``forward``,
    ``activations.forward_working_bytes``): a rank holds as much when a forward ends as when the
    backward after it starts (``costs.inflight``), plus what only the forward holds then.

    Not modelled: Megatron-LM's fused weight-gradient accumulation
    (``gradient_accumulation_fusion`` writes them into the fp32 main grad; this then overstates by
    the weight-gradient term). SwiGLU measured equal to the GeLU terms with its f. Measured on the
    executor's stages (CPU fp32, tp = 1): within 0.01 MiB for cpu-small's middle, first, last and
    single stages at b = 1, 2; tests/test_memory_model.py holds them to 1%."""
    tied_here = first and last and tied
    layer = layer + layer_extra
    working = layer
    if last:
        working = max(layer - head + max(embedding_grad * tied_here, head_kept),
                      output + max(vocab_grad, head_kept) - absent, logits_grad - absent)
    if first:
        # + the gradient received from stage 1 and the embedding output's (none from a loss)
        working = max(working, (embedding_grad * 3 if tied_here else embedding_grad) + (0.0 if last else 2 * output)
                      - stash - after_layers)
    return max(working, forward - absent, root_post - stash)


def split_kept(layer_dys: float, head_dy: float, loss_saved: float, input_grad: float, output: float,
               last: bool) -> float:
    """Bytes a split backward's I leaves per microbatch at its end, until its W ends, beyond what
    the microbatch held before it (``held_bytes``): the output gradients it captured for W
    (``layer_dys``: the stage's layers'; ``head_dy``: the output layer's and final norm's on the
    last stage) and the input gradient it sent back (``input_grad``): ``stage_backward_input``
    leaves it in the stage input's ``.grad``, and the input lives on in the retained graph (the
    first norm, or the checkpoint, saved it). Less what I frees: on the last stage the logits the
    loss saved (``loss_saved``; torch's ``stage_backward_input`` detaches the loss once the input
    gradient is taken, and the loss's nodes, which no weight's gradient passes through, go with
    what they saved), on the others the output the stage sent (``output``: detached, no node saved
    it). The stage's other stored activations stay with the retained graph. Measured (executor
    tracker, fp32): on heldout-gpt's pp = 2 ZB-H1 last rank one microbatch waits for its W with
    its logits' gradient and the input's, no log-softmax; on a pp = 4 middle rank the input's
    gradient outlives I (alive after it, in no captured group) as the sent output does not."""
    return layer_dys + input_grad + (head_dy - loss_saved if last else -output)


def input_grad_end(layer_dys: float, head_dy: float, input_grad: float, last: bool, attention: float = 0.0) -> float:
    """Bytes an I holds over the stored activations at its peak: every output gradient it
    captured for W (``split_kept``'s, the loss's logits not yet freed) and, as it ends, the input
    gradient it sends back (``input_grad``: e s b h / sp), or earlier, at its lowest layer's
    unfused attention, what that holds beyond the dYs not yet captured (``attention``,
    ``split_backward.input_attention_bytes``; only where the stage has a layer). Measured (as
    ``split_kept``, 2 layers on the last stage): 21.5 MB over the rank's level at I's start, 21.0
    MB by this rule."""
    return layer_dys + (head_dy if last else 0.0) + max(input_grad, attention if layer_dys > 0 else 0.0)


def weight_working(layer_grad: float, vocab_grad: float, layer_dys: float, last: bool) -> float:
    """Bytes a W of a stage with an input gradient (not the first, whose W is its whole backward,
    priced as a B) holds over the stored activations while it runs: a layer's W at its peak
    (``layer_grad``), or on the last stage the dense V/t x h gradient of the output layer
    (``vocab_grad``). ``stage_backward_weight`` runs the parameter groups in module order, so the output
    layer's comes after the stage's layers', which have deleted their output gradients
    (``layer_dys``) by then. Measured (as ``split_kept``): the output layer's 16.8 MB gradient is
    made 2.6 MB below the rank's level at W's start."""
    return max(layer_grad, vocab_grad - layer_dys) if last else layer_grad
