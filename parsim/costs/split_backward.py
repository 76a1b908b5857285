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

Running the split costs more than the fused backward: torch's W calls ``autograd.grad`` once per
parameter group, each walking the retained graph below it (``split_weight_overhead``: a cost per
layer and one growing with the layers of the chunk, measured by ``parsim calibrate``; every split
W but the first stage's pays it).

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

from dataclasses import dataclass

from parsim.specs import ModelSpec, Plan

from .activations import layer_activation_bytes, score_gradient_bytes, vocab_grad_bytes
from .footprint import weight_working
from .ops import DTYPE_BYTES, padded_vocab
from .saved import layer_saved, precision




def output_grad_bytes(model: ModelSpec, plan: Plan) -> float:
    """Bytes of the output gradients dY one layer keeps from its I to its W, per microbatch, on one
    device: torch's ``stage_backward_input`` captures the gradient arriving at each weight-bearing
    op for ``stage_backward_weight`` (``weight_groups``). QKV: e s b (h + 2 kv)/t; attention-out and
    MLP-down (the row-parallel outputs, all-gathered under SP): e s b h each; MLP-up: e s b f_up / t
    (f_up = 2f for SwiGLU's gate and up); the two norms: e s b h / sp each."""
    return sum(g.output_grad for g in weight_groups(model, plan))


def input_attention_bytes(model: ModelSpec, plan: Plan, policy: str = "none") -> float:
    """What an I holds at its lowest layer's unfused attention backward beyond the output
    gradients it captures for W, per microbatch on one device (``footprint.input_grad_end``): I
    runs ``autograd.grad(..., retain_graph=True)``, so nothing it passes is freed, and the score
    gradients (``activations.score_gradient_bytes(retained=True)``) and the residual stream's
    gradient (r s b h / sp) sit on the dYs captured so far -- all of the stage's but the
    attention-in groups' (the first norm's, q's, k's and v's, captured after the core). 0 for
    flash attention. Measured (2 gloo ranks, pp = 2 ZB-H1, the last rank, GPT-style, explicit
    attention, fp32, s = h = 384): the peak 8.0 s h x 4 B over the end of I with 6 heads (4.73 MB,
    the same at 2, 4 and 8 microbatches and at f = 1024 or 1536), 20.0 with 12 heads: 2u - 4 e s h,
    which this gives with u the (b, a, s, s) scores' bytes. ``policy``: the lowest layer's
    recomputation; a selective one re-runs the attention core as I unpacks it, and what the
    re-run saves (the core's bytes, ``layer_activation_bytes`` none - selective) stays beside
    (measured as above: 1.05 u over the end of I, 3.699 MB against the core's 3.686 MB; full
    recomputation read exact without it)."""
    scores = score_gradient_bytes(model, plan, retained=True)
    if not scores:
        return 0.0
    rows = model.seq_len * plan.mbs / (plan.tp if plan.sp else 1)
    after = sum(g.output_grad for g in weight_groups(model, plan) if g.name in ("attn_norm", "q", "k", "v"))
    rerun = (layer_activation_bytes(model, plan, "none") - layer_activation_bytes(model, plan, "selective")
             if policy == "selective" else 0.0)
    return scores + precision(plan).res * rows * model.hidden - after + rerun


def head_output_grad_bytes(model: ModelSpec, plan: Plan) -> float:
    """The last stage's dY kept for W: the logits' (e s b V/t, the output layer's weight
    gradient) and the final norm's (r s b h / sp, the residual stream's precision, as
    ``weight_groups``' norms)."""
    e, r = DTYPE_BYTES[plan.dtype], precision(plan).res
    sb = model.seq_len * plan.mbs
    sp = plan.tp if plan.sp else 1
    return sb * (e * padded_vocab(model, plan) / plan.tp + r * model.hidden / sp)


def weight_grad_working_bytes(model: ModelSpec, plan: Plan, last: bool, layers: int = 0) -> float:
    """``footprint.weight_working`` of a stage of ``layers`` layers on one device: a layer's W at
    its peak (``layer_weight_peak``), the output layer's dense V/t x h gradient
    (``activations.vocab_grad_bytes``), the layers' output gradients (``output_grad_bytes``)."""
    return weight_working(layer_weight_peak(model, plan), vocab_grad_bytes(model, plan) if last else 0.0,
                          layers * output_grad_bytes(model, plan), last)


def layer_weight_peak(model: ModelSpec, plan: Plan) -> float:
    """Bytes over its start a layer's W (no recomputation) reaches: its groups run in order
    (``weight_groups``), each allocating its working set beside the previous group's weight
    gradient, after the groups before it have freed their output gradients and the saved tensors
    no later node needs (``stage_backward_weight``'s calls with ``retain_graph=False``). The
    stage's first layer peaks highest (later ones start with more freed). Measured (executor
    tracker, heldout-gpt, pp = 4, ZB-H1, a middle rank, fp32): 1.57 MB over W's start, at
    MLP-down beside MLP-up's gradient; this walk 1.58 MB; the largest weight's gradient, counted
    before, 4.19 MB (the middle ranks then read 2.5 % high)."""
    freed, previous, peak = 0.0, 0.0, 0.0
    for g in weight_groups(model, plan):
        peak = max(peak, g.working + previous - freed)
        freed += g.output_grad + g.releases
        previous = g.weight_grad
    return peak


def w_recomputes(model: ModelSpec) -> int:
    """How many times W re-runs a fully recomputed layer's forward: once per parameter group that
    torch's ``stage_backward_weight`` differentiates in its own graph task and whose node unpacks a
    saved tensor, i.e. per weight of the layer as torch models hold them -- q, k, v and o, the MLP's
    up and down (and SwiGLU's gate) as separate ``nn.Linear`` (torchtitan's Llama, the executor), and
    the two norms (``weight_groups``): 8 for a GeLU layer, 9 for SwiGLU. A bias added outside its
    GEMM (attention-out's and MLP-down's) is a group of its own whose ``AddBackward`` saves nothing:
    no re-run. Measured on the executor's layers (torch 2.13, non-reentrant checkpoint; forward
    hooks counting the re-runs): 8 whole-forward re-runs in W on its GPT layer, 9 on its Llama
    layer, and 1 in I on both."""
    return len(_group_names(model))


def _group_names(model: ModelSpec) -> tuple[str, ...]:
    """The layer's weight groups in the order W runs them: the order the layer registers its
    parameters (``get_param_groups`` keys its groups by first appearance in ``module.parameters()``;
    the executor's ``MLP`` registers up before gate)."""
    mlp = ("up", "gate", "down") if model.activation == "swiglu" else ("up", "down")
    return ("attn_norm", "q", "k", "v", "o", "mlp_norm") + mlp


@dataclass(frozen=True)
class WeightGroup:
    """One parameter group of a layer: its own graph task in W. Bytes, per microbatch, on one
    device."""
    name: str
    output_grad: float    # the dY captured for it in I, freed when its task ends
    weight_grad: float    # its weight gradient, still referenced (``dweights``) through the next task
    working: float        # what its backward allocates: the weight gradient, or RMSNorm's dY * y
    releases: float       # re-run tensors saved by its node and by no later one, freed when it ends
    reruns: bool = True   # its node unpacks saved tensors: its task re-runs the layer


def weight_groups(model: ModelSpec, plan: Plan) -> list[WeightGroup]:
    """The layer's weight groups in the order W runs them, with the output gradient captured at
    each group's node (q: e s b h/t, k and v: e s b kv/t; attention-out and MLP-down, the
    row-parallel outputs before their reduce(-scatter): e s b h; MLP-up and gate: e s b f/t each;
    the norms: r s b h/sp, in the residual stream's precision r, ``saved.precision``), its weight
    gradient (h x h/t, h x kv/t, f x h/t elements; a norm's h) and what it releases of a re-run
    (``layer_saved_tensors``). A bias inside its op's node (QKV's and MLP-up's ``addmm``,
    LayerNorm's) joins its weight's group; attention-out's and MLP-down's are added after their
    exit collective, by an ``AddBackward`` that saves nothing: groups of their own that re-run
    nothing and hold the dY of that add, r s b h/sp, which is the GEMM's own where both are one
    tensor (one precision, no SP; freed when the later of the two groups ends). Under autocast a
    16-bit GEMM output plus an fp32 bias is fp32: the add's dY (fp32) and the GEMM's (its 16-bit
    cast) are two tensors, and so are they under SP (the add's is the sequence shard). Measured
    (torch's ``stage_backward_input`` on the executor's last stage, heldout-gpt, bf16 autocast):
    per layer the norms' and the two biases' captured dYs are fp32, 0.52 MB each, beside q, k, v,
    o, MLP-down 0.26 MB and MLP-up 1.05 MB in bf16; in fp32 each bias add's dY is its GEMM's."""
    e, r = DTYPE_BYTES[plan.dtype], precision(plan).res
    sb = model.seq_len * plan.mbs
    h, kv, f, t = model.hidden, model.kv_hidden, model.ffn_hidden, plan.tp
    rows = sb / (t if plan.sp else 1)                 # tokens a norm sees
    b = 1 if model.bias else 0                        # a bias row joining its weight's gradient
    norm = (r * rows * h, e * h * (1 + b if model.norm == "layernorm" else 1))
    shared = r == e and rows == sb                    # a row-parallel bias add's dY is its GEMM's
    sizes = {"attn_norm": norm, "q": (e * sb * h / t, e * (h + b) * h / t),     # (dY, weight gradient)
             "k": (e * sb * kv / t, e * (h + b) * kv / t), "v": (e * sb * kv / t, e * (h + b) * kv / t),
             "o": (e * sb * h, e * h * h / t), "mlp_norm": norm, "up": (e * sb * f / t, e * f * (h + b) / t),
             "gate": (e * sb * f / t, e * f * (h + b) / t), "down": (e * sb * h, e * f * h / t)}
    released = dict.fromkeys(_group_names(model), 0.0)
    for _, nbytes, last in layer_saved_tensors(model, plan):
        if last is not None:
            released[last] += nbytes
    groups = []
    for name in _group_names(model):
        dy, dw = sizes[name]
        # RMSNorm's weight ``mul`` forms dY * (x * rstd) before summing it into the weight gradient
        working = dw + dy if name.endswith("norm") and model.norm == "rmsnorm" else dw
        bias_apart = model.bias and name in ("o", "down")
        groups.append(WeightGroup(name, 0.0 if bias_apart and shared else dy, dw, working, released[name]))
        if bias_apart:
            groups.append(WeightGroup(f"{name}.bias", r * rows * h, e * h, e * h, 0.0, reruns=False))
    return groups


def layer_saved_tensors(model: ModelSpec, plan: Plan) -> list[tuple[str, float, str | None]]:
    """What one re-run of the executor's layer forward saves for backward beyond its input (which
    the checkpoint stores) and its weights: (tensor, bytes per microbatch on one device, the last
    weight group whose node saves it, or None where a weightless op's node saves it too -- no W
    task runs that node, so nothing releases it before W ends). The layer's own list
    (``saved.layer_saved``, which ``activations.layer_activation_bytes`` sums) without the input.
    So SwiGLU's MLP keeps its gate output, SiLU output and up output (3 e s b f/t) where
    Korthikanti et al.'s Table 2 counts two, and RMSNorm's weightless ``pow`` and ``mul`` keep the
    second norm's input (the residual), which LayerNorm's node -- a weight op -- releases."""
    return [(x.name, x.nbytes, x.last) for x in layer_saved(model, plan).tensors if x.part != "input"]


def _rerun_peak(model: ModelSpec, plan: Plan) -> float:
    """The most one re-run of the layer holds: all it saves, at its early stop, or, where the
    explicit core's s x s temporaries outweigh what is saved after the core, the core's peak."""
    layer = layer_saved(model, plan)
    saved = [x.nbytes for x in layer.tensors if x.part != "input"]
    return max(sum(saved), sum(saved[:layer.core_end]) + layer.core_transient)


def w_task_kept_bytes(model: ModelSpec, plan: Plan) -> float:
    """Bytes of one fully recomputed layer's forward that each of its W tasks keeps until W ends:
    what weightless ops save (``layer_saved_tensors`` with no releasing group). GeLU, LayerNorm,
    FlashAttention, no rope, no dropout: q, k, v, the attention output, the log-sum-exp and the
    GeLU input, e s b (2h + 2kv + f)/t + 4 a s b/t (5.06 e s b h on tiny). SwiGLU, RMSNorm, rope
    instead of GeLU, LayerNorm, learned positions: the gate output, SiLU output and up output
    (3 e s b f/t for GeLU's f), the residual (e s b h/sp), both norms' rstd (4 s b/sp each) and
    rope's cos and sin (4 s d bytes): 10.34 e s b h on tiny, against 5.06 + 2 (a second f)
    before the SiLU output, the residual, rstd and rope were counted."""
    return sum(nbytes for _, nbytes, last in layer_saved_tensors(model, plan) if last is None)


def w_recompute_residue(model: ModelSpec, plan: Plan, recomputed_layers: int) -> float:
    """Bytes a W of a stage whose first ``recomputed_layers`` layers are fully recomputed holds at
    its peak over its start beyond ``weight_grad_working_bytes``: (k - 1) ``w_residue_per_layer``
    + the top layer's peak (``_top_layer_peak``) for k recomputed layers.

    How torch 2.13 runs it. ``stage_backward_weight`` (``distributed/pipelining/_backward.py``)
    calls ``autograd.grad`` once per parameter group (``weight_groups``), from the nodes whose
    input gradients I captured to the group's weights, ``retain_graph=False``: each call is a
    new graph task (``torch._C._current_graph_task_id``) that runs only the group's own node(s)
    and, freeing their saved tensors as it goes, releases them for good. Non-reentrant
    ``torch.utils.checkpoint`` (``utils/checkpoint.py``) saves ``_Holder`` placeholders in the
    forward; its ``unpack_hook`` re-runs the layer forward the first time a task unpacks one
    (``frame.is_recomputed[gid]``), and ``_recomputation_hook.pack_hook`` files every re-run
    tensor whose holder is still alive in ``frame.recomputed[gid]``, a ``WeakKeyDictionary``
    keyed by the ``_Handle`` that ``holder.handles[gid]`` owns. The task unpacks (and drops the
    handles of) only its own node's holders; the others' entries live as long as their holders,
    i.e. until the saving node is released -- by the W task that runs it, or never before the
    stage's graph dies at W's end for the weightless ops' nodes (``layer_saved_tensors``). So
    while group j (of R) runs, each of the j earlier tasks holds K_j = ``w_task_kept_bytes`` plus
    what groups j..R release (a tensor many nodes save counts once per task), and two moments
    bound the top layer (``_top_layer_peak``):

    * (A) group j's re-run at its peak: at its early stop (``_StopRecomputationError`` at the last
      saved tensor) the re-run graph (``pack_hook`` returns the tensor, so the nodes it records
      save it) still holds everything the layer saves, released groups' inputs too; the explicit
      core's s x s temporaries can peak higher (``_rerun_peak``): j K_j + the re-run's peak;
    * (B) group j's node computing its weight gradient: (j + 1) K_j + its working set;

    each beside the previous group's weight gradient (``dweights`` is re-bound only when the
    call returns) and less the output gradients of the groups run before (their ``grads`` are
    deleted, their ``valid_grad_outputs`` re-bound). The layers below keep R
    ``w_task_kept_bytes`` each (``w_residue_per_layer``).

    Measured (executor tracker, one middle stage, fp32; u = e s b h, tiny: u = 8 KiB): the
    GeLU/LayerNorm/SDPA layer of tiny peaks at (B) of MLP-down, 57.56u for one layer, the
    SwiGLU/RMSNorm/rope/SDPA one at (A) of MLP-down, 111.09u, with MHA explicit attention at
    128.66u; cpu-small (GeLU, SDPA, u = 256 KiB) 118.16u, 171.28u, 277.53u for k = 1, 2, 4. This
    derivation gives each to the byte, and so for k = 1, 2, 4 on tiny with GeLU or SwiGLU,
    LayerNorm or RMSNorm, learned or rope positions, SDPA or the explicit core (MHA or GQA), b = 1
    or 2, s = 32 or 128, f = 32 or 128 (f = 32 peaks at (A) of the second norm's task; s = 128
    with the explicit core in its softmax). Not checked: dropout (the executor's CPU runs keep
    dropout masks in the activation dtype and fall back from SDPA to the explicit path) and TP
    (one process)."""
    if recomputed_layers <= 0:
        return 0.0
    return recomputed_layers * w_residue_per_layer(model, plan) + w_residue_top(model, plan)


def w_residue_per_layer(model: ModelSpec, plan: Plan) -> float:
    """What each recomputed layer below the top one leaves while the top one's W runs: its R tasks'
    ``w_task_kept_bytes`` less its freed output gradients (``output_grad_bytes``)."""
    return w_recomputes(model) * w_task_kept_bytes(model, plan) - output_grad_bytes(model, plan)


def w_residue_top(model: ModelSpec, plan: Plan) -> float:
    """The part of ``w_recompute_residue`` the top recomputed layer adds once, over a layer below:
    its peak (``_top_layer_peak``) less ``w_residue_per_layer`` and the weight gradient that
    ``weight_grad_working_bytes`` counts."""
    return (_top_layer_peak(model, plan) - w_residue_per_layer(model, plan)
            - weight_grad_working_bytes(model, plan, False))


def _top_layer_peak(model: ModelSpec, plan: Plan) -> float:
    """The largest of the top recomputed layer's moments (A) and (B) (``w_recompute_residue``)
    over its W tasks, in bytes over W's start. Its first task also sees the weight gradient of the
    layer below's last group (none for a stage's first layer: at most e f h/t too much there, on a
    moment that a single task's copies never make the largest)."""
    groups = weight_groups(model, plan)
    rerun = _rerun_peak(model, plan)
    alive = w_task_kept_bytes(model, plan) + sum(g.releases for g in groups)       # all a re-run saves
    prev_grad, freed, peak = groups[-1].weight_grad, 0.0, 0.0
    tasks = 0                           # re-runs so far; alive: K_j, what each of them still holds
    for g in groups:
        if g.reruns:
            peak = max(peak, tasks * alive + rerun + prev_grad - freed)           # (A) re-run's peak
            tasks += 1
        peak = max(peak, tasks * alive + g.working + prev_grad - freed)           # (B) weight gradient
        alive -= g.releases
        freed += g.output_grad
        prev_grad = g.weight_grad
    return peak


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


def split_weight_overhead(model: ModelSpec, cluster, plan: Plan, layers: int) -> float:
    """Seconds a weight-gradient pass W of a chunk of ``layers`` layers costs beyond its ops,
    run after its I as torch 2.13 runs the split (not the first stage's W, a whole backward).

    ``stage_backward_weight`` calls ``autograd.grad`` once per parameter group (9-10 a
    transformer layer), each a new graph task whose dependency pass walks the retained graph
    reachable from that group's outputs, the layers below it included: a cost per layer and one
    that grows with the layers below each group. Measured by ``parsim calibrate`` on stages of 1
    and 4 reference layers (the split's I + W less the fused backward; ``calibration.compute.
    split_extra``) as fractions of one layer's fused backward: ``split_overhead`` {per_layer: a,
    per_layer_squared: b}; here B_layer (a L + b L^2) with B_layer this model's layer backward as
    priced (``timing.op_time`` "bwd"), seconds (studies/zero_bubble/split_overhead.txt: a 18-33 %,
    b 1-3 % over three models on a 2-vCPU VM). Profiles without it: 0."""
    from .ops import layer_ops
    from .timing import op_time

    if not cluster.device.tables.split_overhead or layers <= 0:
        return 0.0
    return split_chunk_overhead(
        cluster, sum(op_time(cluster.device, op, "bwd", plan.dtype) for op in layer_ops(model, plan)), layers)


def split_chunk_overhead(cluster, layer_bwd_s: float, layers: int) -> float:
    """``split_weight_overhead`` of a chunk of ``layers`` layers, each one's fused backward
    priced ``layer_bwd_s`` seconds: B_layer (a L + b L^2), seconds (0 without a measured
    ``split_overhead`` or layers). The partitioner reads B_layer off its graph's layer nodes."""
    if layers <= 0:
        return 0.0
    per_layer, per_layer_squared = split_weight_terms(cluster, layer_bwd_s)
    return per_layer * layers + per_layer_squared * layers * layers


def split_weight_terms(cluster, layer_bwd_s: float) -> tuple[float, float]:
    """``split_weight_overhead``'s two terms for a layer whose fused backward is priced
    ``layer_bwd_s`` seconds: (seconds per layer, seconds per layer squared) of the chunk; (0, 0)
    without a measured ``split_overhead``. The fast path keeps them per layer shape."""
    fit = cluster.device.tables.split_overhead
    if not fit:
        return 0.0, 0.0
    return fit["per_layer"] * layer_bwd_s, fit["per_layer_squared"] * layer_bwd_s
