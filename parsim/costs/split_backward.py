"""Split backward (zero-bubble schedules): what the input-gradient pass I and the weight-gradient
pass W of a layer cost, what a deferred W keeps alive, how recomputation meets the split, and the
overlapped forward & backward slot of DualPipe.

Zero-bubble pipeline parallelism (Qi et al. 2023, arXiv:2401.10241, Sec 2) splits a stage's
backward B into I (input gradients: on the critical path, the previous stage waits for them) and
W (weight gradients: needed only by the optimizer step, so a schedule may defer them into its
bubbles). Per op (``costs.ops``) I runs ``bwd_input`` and W ``bwd_weight``: the dX = dY W^T GEMMs
and every weightless op's backward (attention core, softmax, norms', activations' and residuals'
input gradients) go to I; the dW = X^T dY GEMMs and the gradient accumulation go to W. Their
times are ``timing.op_time(op, "bwd_input")`` and ``(op, "bwd_weight")``; B = I + W.

What the deferred W keeps, as torch 2.13 runs it (``torch.distributed.pipelining._backward``:
``stage_backward_input`` = ``autograd.grad`` w.r.t. the stage inputs with ``retain_graph=True``,
capturing the gradients arriving at every weight's node; ``stage_backward_weight`` later =
``autograd.grad`` from those nodes to the weights, one call per parameter group), the reference
executor's runtime:

* the stored activations stay from the forward to the end of W (the graph is retained), as in
  Qi et al.'s accounting (M_B freed after W, their Sec 3.1);
* from the end of I to the end of W, the captured output gradients dY of every weight-bearing op
  (``output_grad_bytes``): QKV, attention-out, MLP-up, MLP-down and the two norms, per layer;
  the final norm and the logits on the last stage;
* the first stage has no input gradient to compute (its input is token ids): torch's
  ``PipelineStage`` runs nothing in its I and its whole backward in its W
  (``backward_weight_one_chunk``), and every engine here does the same (I: no time, no bytes;
  W: B's time and working set).

Recomputation (``recompute=full``; non-reentrant ``torch.utils.checkpoint``, the executor's):
the checkpoint recomputes once per autograd graph task. I is one task: it re-runs the layer's
forward (as B does) and frees what it recomputed when it ends. W is one task per parameter
group, each re-running the whole layer forward, so W of a recomputed layer re-runs it
``w_recomputes`` times (8 on a GPT layer: issue 21's report of zero-bubble schedules with
activation checkpointing running 8x slower than interleaved 1F1B), and each re-run keeps what
the layer's weightless ops saved until W ends (``w_recompute_residue``, derived from torch's
checkpoint and checked against the executor's tracker). Selective recomputation
re-runs the attention core in I only: it holds no weight. Megatron-LM's zero-bubble
implementation instead stores each linear layer's input and dY for W (``WeightGradStore``) and
never recomputes in W; that variant is not modelled.

DualPipe's overlapped slot (DeepSeek-AI 2024, DeepSeek-V3 report, arXiv:2412.19437, Sec 3.2.1,
Fig. 4): the forward of one chunk and the backward of another run together so that each chunk's
communication (there all-to-all and PP; here the TP collectives -- PP sends are asynchronous in
every engine already) hides behind the other chunk's compute. On one device compute does not
overlap compute, nor one link's collectives each other, so the slot takes at least the two
computes back to back, the two communications back to back, and each chunk its own compute +
communication chain: ``overlapped_time``. Without TP (no in-line
communication) the slot is exactly F + B: DualPipeV then gains nothing from overlap and only its
schedule (bubble, memory) differs.
"""
from __future__ import annotations

from parsim.specs import ModelSpec, Plan

from .activations import layer_activation_bytes
from .ops import DTYPE_BYTES, padded_vocab


def output_grad_bytes(model: ModelSpec, plan: Plan) -> float:
    """Bytes of the output gradients dY one layer keeps from its I to its W, per microbatch, on one
    device: torch's ``stage_backward_input`` captures the gradient arriving at each weight-bearing
    op for ``stage_backward_weight``. QKV: e s b (h + 2 kv)/t; attention-out and MLP-down (the
    row-parallel outputs, all-gathered under SP): e s b h each; MLP-up: e s b f_up / t (f_up = 2f
    for SwiGLU's gate and up); the two norms: e s b h / sp each."""
    e = DTYPE_BYTES[plan.dtype]
    sb = model.seq_len * plan.mbs
    h, t = model.hidden, plan.tp
    sp = t if plan.sp else 1
    up = (2 if model.activation == "swiglu" else 1) * model.ffn_hidden
    return e * sb * ((h + 2 * model.kv_hidden) / t + 2 * h + up / t + 2 * h / sp)


def head_output_grad_bytes(model: ModelSpec, plan: Plan) -> float:
    """The last stage's dY kept for W: the logits' (e s b V/t, the output layer's weight
    gradient) and the final norm's (e s b h / sp)."""
    e = DTYPE_BYTES[plan.dtype]
    sb = model.seq_len * plan.mbs
    sp = plan.tp if plan.sp else 1
    return e * sb * (padded_vocab(model, plan) / plan.tp + model.hidden / sp)


def weight_grad_working_bytes(model: ModelSpec, plan: Plan, first: bool, last: bool) -> float:
    """What a W holds beyond the stored activations while it runs, on one device: the gradient of
    its largest weight before it is added into ``.grad`` (max(f, h) x h / t elements, as in
    ``activations.layer_working_bytes``), or the dense V/t x h gradient of the embedding / output
    layer on the first / last stage (``activations.vocab_grad_bytes``)."""
    e = DTYPE_BYTES[plan.dtype]
    layer = e * max(model.ffn_hidden, model.hidden) * model.hidden / plan.tp
    vocab = e * padded_vocab(model, plan) * model.hidden / plan.tp
    return max(layer, vocab) if first or last else layer


def w_recomputes(model: ModelSpec) -> int:
    """How many times W re-runs a fully recomputed layer's forward: once per parameter group that
    torch's ``stage_backward_weight`` differentiates in its own graph task, i.e. per weight of the
    layer as torch models hold them -- q, k, v and o, the MLP's up and down (and SwiGLU's gate) as
    separate ``nn.Linear`` (torchtitan's Llama, the executor), and the two norms: 8 for a GeLU
    layer, 9 for SwiGLU. Measured on the executor's layers (torch 2.13, non-reentrant checkpoint;
    forward hooks counting the re-runs): 8 whole-forward re-runs in W on its GPT layer, 9 on its
    Llama layer, and 1 in I on both."""
    return 4 + (3 if model.activation == "swiglu" else 2) + 2


def w_recompute_residue(model: ModelSpec, plan: Plan, recomputed_layers: int) -> float:
    """Bytes a W of a stage whose first ``recomputed_layers`` layers are fully recomputed holds at
    its peak beyond its stored activations, kept output gradients and ``weight_grad_working_bytes``.

    How torch 2.13 runs it: each weight group is its own graph task, and non-reentrant
    ``torch.utils.checkpoint`` re-runs the layer's forward once per task, keeping every tensor it
    recomputes whose saving node is still alive and not yet unpacked by that task in the
    checkpoint's per-task dict (``_CheckpointFrame.recomputed[gid]``) until that node's saved
    tensors are released. A W task releases the saved tensors of the nodes it runs: the weight
    ops' inputs. The weightless ops' (``w_task_kept_bytes``: the attention core's q, k, v and
    output, the activation function's input, dropout masks) are never run in W, so each of the
    layer's R = ``w_recomputes`` tasks keeps them until the stage's graph is freed at W's end.
    Groups run in parameter order, bottom layer first, so the peak is at the last recomputed
    layer's MLP-down task, where the R tasks of that layer also still hold the down projection's
    input (e s b f / t each). There, ``stage_backward_weight``'s ``dweights`` still references the
    previous group's weight gradient (MLP-up's, or SwiGLU's gate: e f h / t) beside the current
    one, and the output gradients of every group run before it are freed (all recomputed layers'
    ``output_grad_bytes`` but the down projection's dY, e s b h). In bytes, for k recomputed
    layers (k >= 1): R (k P + e s b f/t) + e f h/t - (k dY_layer - e s b h).

    Measured (executor tracker, cpu-small fp32 b=1, one middle stage, u = e s b h = 256 KiB):
    W's peak over its start 118.2u, 171.3u, 277.5u for k = 1, 2, 4 layers; this formula plus
    the weight gradient (16u) gives 118u, 171u, 277u (P = 8u, R = 8)."""
    if recomputed_layers <= 0:
        return 0.0
    return recomputed_layers * w_residue_per_layer(model, plan) + w_residue_top(model, plan)


def w_residue_per_layer(model: ModelSpec, plan: Plan) -> float:
    """The part of ``w_recompute_residue`` each recomputed layer adds: R P less its consumed
    output gradients (``output_grad_bytes``)."""
    return w_recomputes(model) * w_task_kept_bytes(model, plan) - output_grad_bytes(model, plan)


def w_residue_top(model: ModelSpec, plan: Plan) -> float:
    """The part of ``w_recompute_residue`` the last recomputed layer adds once: its R tasks' copies
    of the MLP-down input (e s b f / t each), the previous group's weight gradient (e f h / t) and
    the down projection's output gradient, not consumed yet (e s b h, counted back)."""
    e = DTYPE_BYTES[plan.dtype]
    sb = model.seq_len * plan.mbs
    h, f, t = model.hidden, model.ffn_hidden, plan.tp
    return w_recomputes(model) * e * sb * f / t + e * f * h / t + e * sb * h


def w_task_kept_bytes(model: ModelSpec, plan: Plan) -> float:
    """Bytes of one fully recomputed layer's forward that each of its W tasks keeps until W ends
    (``w_recompute_residue``): the layer's stored activations without recomputation
    (``activations.layer_activation_bytes``, Korthikanti et al. 2022 Table 2) less the layer
    input (already stored) and less what only a weight op saves, which its W task releases --
    the second norm's, QKV's and MLP-up's inputs (e s b h / sp each), MLP-down's input
    (e s b f / t), and the attention-out projection's input where the attention core does not
    save it too (FlashAttention / SDPA keeps its output, whose view that input is). GeLU,
    FlashAttention, no dropout: the q, k, v and attention outputs and the GeLU input,
    e s b (h + 2 kv + h + f) / t (8 e s b h on cpu-small)."""
    e = DTYPE_BYTES[plan.dtype]
    sb = model.seq_len * plan.mbs
    h, f, t = model.hidden, model.ffn_hidden, plan.tp
    sp = t if plan.sp else 1
    weight_inputs = 3 * e * sb * h / sp + e * sb * f / t + (0.0 if model.flash_attention else e * sb * h / t)
    return (layer_activation_bytes(model, plan, "none") - layer_activation_bytes(model, plan, "full")
            - weight_inputs)


def overlapped_time(f_compute: float, f_comm: float, b_compute: float, b_comm: float) -> float:
    """Seconds of DualPipe's overlapped slot: a forward (``f_compute`` s of compute, ``f_comm`` s
    of in-line communication) and a backward of another chunk, each chunk's communication hidden
    behind the other's compute (DeepSeek-AI 2024, Sec 3.2.1), on one compute stream and one
    communication stream: max(F_c + B_c, F_comm + B_comm, F_c + F_comm, B_c + B_comm) -- each
    stream carries both passes' work, each pass is a chain. Between max(F, B) and F + B
    (F = F_c + F_comm); F + B without communication. A bound: the SimPy engine plays the two
    chains segment by segment (``sim.compute.overlap_cost``) and stays above it where a chain waits
    for the other's segment to end."""
    return max(f_compute + b_compute, f_comm + b_comm, f_compute + f_comm, b_compute + b_comm)
