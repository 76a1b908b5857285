"""Single-device micro-benchmarks: GEMMs, attention core, memory-bound ops, per-op overhead,
host copies. Each returns a ``Summary`` of seconds (see ``timer.measure``).

Ops run the way the executor's layers run them (nn.Linear forward and its two backward
GEMMs, ``F.scaled_dot_product_attention`` causal, LayerNorm/RMSNorm/GELU/SwiGLU/softmax,
the executor's AdamW), with autograd on, so what is timed is what a training step
pays. Backward passes are timed with ``torch.autograd.grad(..., retain_graph=True)`` on one
recorded forward.
"""
from __future__ import annotations

import math
import statistics
import time
from itertools import cycle
from typing import Callable

import torch
import torch.nn.functional as F

from parsim.executor.layer_probe import TORCH_DTYPES, layer_step

from .cache import OperandPool, copies_for
from .fit import Summary, summarize
from .shapes import AttentionPoint, GemmPoint, MemboundPoint
from .timer import Clock, measure, measure_many

NORM_EPS = 1e-5


def _rand(shape, dtype, device, grad: bool = False, pool: OperandPool | None = None) -> torch.Tensor:
    """Normal random numbers of ``shape``: a fresh tensor, or the next view of ``pool``."""
    if pool is not None:
        return pool.take(shape, dtype, grad)
    return torch.randn(*shape, dtype=dtype, device=device).requires_grad_(grad)


# ----------------------------------------------------------------------------- GEMMs

def gemm_callable(point: GemmPoint, dtype: str, device: torch.device, cold: bool = False,
                  pool: OperandPool | None = None) -> Callable[[], torch.Tensor]:
    """The GEMM of ``point`` as torch runs it; ``cold``: each call takes the next of enough
    operand copies to span twice the last-level cache (``OperandPool.rotation``, from ``pool``
    or a new one), as a model pass finds its weights in memory, not in cache."""
    dt = TORCH_DTYPES[dtype]
    m, n, k = point.key
    shapes = {"linear": ((m, k), (n, k)), "grad_input": ((m, k), (k, n)), "grad_weight": ((k, n), (k, m)),
              "bmm": ((point.batch, m, k), (point.batch, n, k))}.get(point.form)
    if shapes is None:
        raise ValueError(f"unknown GEMM form {point.form!r}")
    if cold:
        operands = (pool or OperandPool(device)).rotation(shapes, dt)
    else:
        fixed = [_rand(s, dt, device) for s in shapes]
        operands = lambda: fixed      # noqa: E731
    op = {"linear": lambda a, b: F.linear(a, b), "grad_input": lambda a, b: a @ b,
          "grad_weight": lambda a, b: a.t() @ b, "bmm": lambda a, b: a @ b.transpose(1, 2)}[point.form]
    return lambda: op(*operands())


def bench_gemm(point: GemmPoint, dtype: str, clock: Clock, repeats: int, budget_s: float,
               cold: bool = False) -> Summary:
    with torch.no_grad():
        return measure(gemm_callable(point, dtype, clock.device, cold, clock.pool), clock, repeats, budget_s)


def bench_gemms(points: list[GemmPoint], dtype: str, clock: Clock, repeats: int, budget_s: float,
                on_round: Callable[[], None] = lambda: None, cold: bool = True) -> list[Summary]:
    """All shapes, sampled round-robin (``timer.measure_many``); ``budget_s`` per shape; cold
    operands (``gemm_callable``)."""
    with torch.no_grad():
        fns = [gemm_callable(p, dtype, clock.device, cold, clock.pool) for p in points]
        return measure_many(fns, clock, repeats, budget_s, on_round=on_round)


def stream_callable(numel: int, dtype: str, device: torch.device) -> tuple[Callable[[], object], float]:
    """A residual add ``c = a + b`` over ``numel`` elements and the bytes it moves (2 reads + 1 write)."""
    dt = TORCH_DTYPES[dtype]
    a, b, c = _rand((numel,), dt, device), _rand((numel,), dt, device), torch.empty(numel, dtype=dt, device=device)
    return (lambda: torch.add(a, b, out=c)), 3.0 * numel * a.element_size()


# the optimizer the contention rounds step: the executor's AdamW over OPTIMIZER_TENSORS fp32
# tensors of OPTIMIZER_ELEMENTS each (8 x 1 Mi parameters: 128 MiB of parameters, gradients and
# moments, past any last-level cache, as a model's step is)
OPTIMIZER_TENSORS, OPTIMIZER_ELEMENTS = 8, 2**20
# calls per phase at least: a step takes ~15 ms alone on a 2-vCPU VM, 2-3x that with 4 ranks on
# 2 cores; quick mode's budget would give 2, and 4 ranks then read 1.63x (below the 2x that
# sharing 2 cores takes at least) as the first to finish left the window
OPTIMIZER_CALLS = 8


def optimizer_step_callable(device: torch.device) -> Callable[[], object]:
    """One step of the executor's AdamW (``parsim.executor.optimizer.make_adamw``, the update a
    training step runs) over ``OPTIMIZER_TENSORS`` matrices: how much ranks stepping at once slow
    each other down is measured on the optimizer itself (``contention_optimizer``), not read off
    the streaming add: its elementwise passes are short enough that a core's own issue rate,
    not only the shared memory bandwidth, bounds them (``costs.host.host_contention``'s
    "optimizer"; ``calibration.comm._contention``)."""
    from parsim.executor.optimizer import make_adamw
    rows = OPTIMIZER_ELEMENTS // 1024
    params = [torch.nn.Parameter(torch.full((rows, 1024), 0.5, device=device)) for _ in range(OPTIMIZER_TENSORS)]
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt = make_adamw(params)
    opt.step()      # allocates the moments
    return opt.step


# ----------------------------------------------------------------------------- a whole layer
# ``layer_step`` (the executor's own layer, forward and backward) lives with the executor's probe
# that re-takes this measurement inside a launch (``parsim.executor.layer_probe``).

def bench_layer(spec, mbs: int, dtype: str, clock: Clock, repeats: int, warmup: int = 2) -> tuple[Summary, Summary]:
    """Forward and backward seconds of one real layer (``layer_step``), ``repeats`` samples
    after ``warmup`` unrecorded ones (the first backward allocates ``.grad``)."""
    fwd, bwd = layer_samples(spec, mbs, dtype, clock, repeats, warmup)
    return summarize(fwd), summarize(bwd)


def layer_samples(spec, mbs: int, dtype: str, clock: Clock, repeats: int,
                  warmup: int = 2) -> tuple[list[float], list[float]]:
    """``bench_layer``'s raw forward and backward samples (seconds), in the order taken."""
    forward, backward, _ = layer_step(spec, mbs, dtype, clock.device)
    return pass_samples(forward, backward, clock, repeats, warmup)


SPLIT_LAYERS = (1, 4)      # stages the backward split is timed on (``split_extra``)


def split_samples(spec, mbs: int, dtype: str, clock: Clock, layers: tuple[int, ...], repeats: int,
                  warmup: int = 2) -> dict[int, dict[str, list[float]]]:
    """A stage's backward run whole and split as the zero-bubble schedules run it
    (``parsim.executor.split_backward``: torch 2.13's ``stage_backward_input``, then
    ``stage_backward_weight``), for stages of each of ``layers`` layers of the executor's own
    model (tp=1): each repeat, for every stage in turn, a forward then the fused backward, and a
    forward then I and W, each pass timed. Returns {L: {"B", "I", "W": seconds per repeat}}
    after ``warmup`` untimed repeats."""
    from parsim.executor.split_backward import backward_input, backward_weight
    from parsim.executor.weights import initialised_stage
    dt = TORCH_DTYPES[dtype]
    x = torch.randn(mbs, spec.seq_len, spec.hidden, dtype=dt, device=clock.device).requires_grad_(True)
    dy = torch.randn(mbs, spec.seq_len, spec.hidden, dtype=dt, device=clock.device)
    stages = {}
    for n in layers:
        stages[n] = initialised_stage(spec, 0, n, False, False, seed=0).to(device=clock.device, dtype=dt)
    samples = {n: {"B": [], "I": [], "W": []} for n in layers}
    for i in range(warmup + repeats):
        for n, stage in stages.items():
            out = stage(x)
            b = clock.per_call(lambda: out.backward(dy), 1)
            out = stage(x)
            pending = []
            i_s = clock.per_call(lambda: pending.append(backward_input(out, dy, x, stage)), 1)
            w_s = clock.per_call(lambda: backward_weight(pending.pop(), stage), 1)
            x.grad = None
            if i >= warmup:
                for key, seconds in (("B", b), ("I", i_s), ("W", w_s)):
                    samples[n][key].append(seconds)
    return samples


def split_extra(spec, mbs: int, dtype: str, clock: Clock, repeats: int, warmup: int = 2) -> dict[str, float]:
    """What running a stage's backward split costs over running it whole (``split_samples`` on
    stages of ``SPLIT_LAYERS`` layers): {"b1": one layer's fused backward, "e1", "e4": the
    median I + W less the median B at 1 and 4 layers}, seconds."""
    samples = split_samples(spec, mbs, dtype, clock, SPLIT_LAYERS, repeats, warmup)
    med = {n: (statistics.median(s["B"]), statistics.median(i + w for i, w in zip(s["I"], s["W"])))
           for n, s in samples.items()}
    return {"b1": med[1][0], **{f"e{n}": med[n][1] - med[n][0] for n in SPLIT_LAYERS}}


def pass_samples(forward, backward, clock: Clock, repeats: int, warmup: int = 2,
                 before_pass=None) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of ``repeats`` steps after ``warmup`` untimed ones, each
    pass timed between device syncs; ``before_pass`` (untimed) runs before each pass."""
    fwd, bwd = [], []
    for i in range(warmup + repeats):
        for which, run in ((fwd, forward), (bwd, backward)):
            if before_pass is not None:
                before_pass()
            clock.sync()
            t0 = time.perf_counter()
            run()
            clock.sync()
            if i >= warmup:
                which.append(time.perf_counter() - t0)
    return fwd, bwd


# ----------------------------------------------------------------------------- attention

def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


def _explicit_attention(q, k, v):
    """scores = q k^T / sqrt(d), causal mask, softmax, @ v (Vaswani et al. 2017, Eq. 1)."""
    s = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu_(1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


def bench_attention(point: AttentionPoint, dtype: str, clock: Clock, repeats: int, budget_s: float,
                    kind: str = "sdpa", cold: bool = True) -> tuple[Summary, Summary]:
    """(forward, backward) seconds of the causal attention core at ``point`` (``cold``: rotating
    over copies of q, k, v, ``cold_cases``)."""
    return _fwd_bwd(attention_case(point, dtype, clock, kind), clock, repeats, budget_s, cold)


def attention_case(point: AttentionPoint, dtype: str, clock: Clock, kind: str = "sdpa"):
    """A function returning (forward, [q, k, v]) of the causal attention core at ``point`` on the
    next operands of ``clock.pool``."""
    if kind == "explicit" and point.kv_heads != point.heads:
        raise ValueError("the explicit attention benchmark needs kv_heads == heads")
    fn = _sdpa if kind == "sdpa" else _explicit_attention
    dt = TORCH_DTYPES[dtype]

    def case():
        q = _rand((point.mbs, point.heads, point.seq, point.head_dim), dt, clock.device, True, clock.pool)
        k = _rand((point.mbs, point.kv_heads, point.seq, point.head_dim), dt, clock.device, True, clock.pool)
        v = _rand((point.mbs, point.kv_heads, point.seq, point.head_dim), dt, clock.device, True, clock.pool)
        return (lambda: fn(q, k, v)), [q, k, v]
    return case


def _fwd_bwd(case: Callable[[], tuple[Callable[[], torch.Tensor], list[torch.Tensor]]], clock: Clock,
             repeats: int, budget_s: float, cold: bool = True) -> tuple[Summary, Summary]:
    """Forward and backward seconds of ``case()`` = (forward, its inputs): with ``cold``, over
    enough independent cases to span twice the last-level cache, one after the other; backward
    as ``torch.autograd.grad`` on each case's recorded forward."""
    cases = cold_cases(case, clock.pool, cold)
    fwd = measure(forward_rotation(cases), clock, repeats, budget_s / 2)
    return fwd, measure(backward_rotation(cases, clock.pool), clock, repeats, budget_s / 2)


def forward_rotation(cases: list) -> Callable[[], torch.Tensor]:
    """The next case's forward at each call."""
    forwards = cycle([fn for fn, _ in cases])
    return lambda: next(forwards)()


def backward_rotation(cases: list, pool: OperandPool) -> Callable[[], object]:
    """The next case's backward at each call (``torch.autograd.grad`` on its recorded forward,
    the graph kept), output gradients from ``pool``. Holds every case's output and graph."""
    ys = [fn() for fn, _ in cases]
    pool.reserve(ys[0].dtype, sum(pool.aligned(y.numel(), y.dtype) for y in ys))
    backwards = cycle([(y, inputs, pool.take(y.shape, y.dtype)) for y, (_, inputs) in zip(ys, cases)])

    def backward():
        y, inputs, g = next(backwards)
        return torch.autograd.grad(y, inputs, g, retain_graph=True)
    return backward


def cold_cases(case, pool: OperandPool, cold: bool) -> list:
    """``case()`` once, or (``cold``) enough times that the inputs, outputs and gradients span twice
    the last-level cache (``cache.copies_for``), all inputs in one contiguous stretch of ``pool``
    (every tensor a case draws is one of its inputs, in one dtype)."""
    first = case()
    if not cold:
        return [first]
    dt = first[1][0].dtype
    numel = sum(pool.aligned(t.numel(), dt) for t in first[1])
    count = copies_for(3 * numel * first[1][0].element_size(), pool.device)    # inputs, output, grads
    if pool.reserve(dt, count * numel):       # back to the start: the first case may overlap the next
        first = case()
    return [first] + [case() for _ in range(count - 1)]


# ----------------------------------------------------------------------------- memory-bound ops

def membound_case(point: MemboundPoint, dt: torch.dtype, dev: torch.device, pool: OperandPool | None = None):
    """(forward, inputs) of one memory-bound op on fresh tensors, as the executor's layers run it."""
    shape = point.shape

    def draw(dims):     # an input that requires grad (fresh, or the next view of ``pool``)
        return _rand(dims, dt, dev, True, pool)
    if point.name in ("layernorm", "rmsnorm"):
        x, w = draw(shape), draw(shape[-1:])
        if point.name == "layernorm":
            b = draw(shape[-1:])
            return (lambda: F.layer_norm(x, shape[-1:], w, b, NORM_EPS)), [x, w, b]
        # Zhang & Sennrich 2019, computed as the executor's RMSNorm does
        return (lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * w), [x, w]
    if point.name in ("residual_add", "swiglu"):
        a, b = draw(shape), draw(shape)
        return ((lambda: a + b) if point.name == "residual_add" else (lambda: F.silu(a) * b)), [a, b]  # Shazeer 2020
    if point.name in ("gelu", "softmax"):
        x = draw(shape)
        return ((lambda: F.gelu(x)) if point.name == "gelu" else (lambda: torch.softmax(x, dim=-1))), [x]
    if point.name == "dropout":
        # the executor's F.dropout at its probability (``executor/model.py`` DROPOUT_P), training
        from parsim.executor.model import DROPOUT_P
        x = draw(shape)
        return (lambda: F.dropout(x, DROPOUT_P, True)), [x]
    if point.name == "causal_mask":
        # the executor's explicit attention (``Attention.core``): a bool (s, s) mask built per
        # call, masked_fill out of place; its backward fills the gradient's masked entries
        x = draw(shape)
        return (lambda: x.masked_fill(torch.ones_like(x[0], dtype=torch.bool).triu(1), float("-inf"))), [x]
    if point.name == "cross_entropy":
        tokens, vocab = shape
        logits = draw((tokens, vocab))
        target = torch.randint(0, vocab, (tokens,), device=dev)
        return (lambda: F.cross_entropy(logits.float(), target, reduction="none")), [logits]
    if point.name == "rope":
        # the executor's own tables and rotation (``executor/model.py``), q and k heads as one tensor
        from parsim.executor.model import apply_rope, rope_tables
        x = draw(shape)
        return (lambda: apply_rope(x, *rope_tables(shape[2], shape[3], dev))), [x]
    if point.name == "embedding":
        tokens, vocab, hidden = shape
        table = draw((vocab, hidden))
        idx = torch.randint(0, vocab, (tokens,), device=dev)
        return (lambda: F.embedding(idx, table)), [table]
    raise ValueError(f"unknown memory-bound op {point.name!r}")


def bench_membound(point: MemboundPoint, dtype: str, clock: Clock, repeats: int,
                   budget_s: float) -> tuple[Summary, Summary | None]:
    """(forward, backward) seconds of one memory-bound op on cold inputs; AdamW and gradient
    accumulation have no backward (None)."""
    if point.name == "adamw":
        return bench_adamw(list(point.tensors), clock, repeats, budget_s), None
    if point.name == "grad_accumulate":
        return bench_grad_accumulate(list(point.tensors), dtype, clock, repeats, budget_s), None
    return _fwd_bwd(lambda: membound_case(point, TORCH_DTYPES[dtype], clock.device, clock.pool), clock, repeats,
                    budget_s)


def bench_adamw(shapes: list[tuple[int, ...]], clock: Clock, repeats: int, budget_s: float) -> Summary:
    """One step of the executor's own AdamW (``parsim.executor.optimizer.make_adamw``: torch's
    ``foreach=False`` update written out, weight decay on matrices) over fp32 master params of
    ``shapes``: the optimizer a training step runs, not torch.optim's. Cold, as in a training
    step, where the backward has gone through the cache since the last update: the steps rotate
    over independent copies (params, grads, state) spanning twice the last-level cache
    (``cache.copies_for``; 16 bytes per element: ``costs.timing.OPTIMIZER_WORKING_SET_BYTES``)."""
    from parsim.costs.timing import OPTIMIZER_WORKING_SET_BYTES
    from parsim.executor.optimizer import make_adamw
    elements = sum(math.prod(s) for s in shapes)
    optimizers = []
    for _ in range(copies_for(OPTIMIZER_WORKING_SET_BYTES * elements, clock.device)):
        # constant values: the update's elementwise ops take as long on any normal numbers, and
        # a fill costs a fraction of drawing random ones over hundreds of MB
        params = [torch.nn.Parameter(torch.full(s, 0.5, device=clock.device)) for s in shapes]
        for p in params:
            p.grad = torch.full_like(p, 1e-3)
        opt = make_adamw(params)
        opt.step()   # allocates exp_avg / exp_avg_sq
        optimizers.append(opt)
    turn = cycle(optimizers)
    return measure(lambda: next(turn).step(), clock, repeats, budget_s, warmup=1)


def bench_grad_accumulate(shapes: list[tuple[int, ...]], dtype: str, clock: Clock, repeats: int,
                          budget_s: float) -> Summary:
    """``grad += new`` over gradients of ``shapes`` (what autograd's AccumulateGrad does for
    every microbatch after the first, or every one into a DDP bucket view)."""
    from parsim.costs import state_bytes
    dt = torch.float32 if state_bytes(dtype).grad == 4 else torch.float16
    grads = [torch.randn(*s, dtype=dt, device=clock.device) for s in shapes]
    new = [torch.randn(*s, dtype=dt, device=clock.device) for s in shapes]

    def step():
        for g, n in zip(grads, new):
            g.add_(n)
    return measure(step, clock, repeats, budget_s, warmup=1)


# ----------------------------------------------------------------------------- overheads

def bench_op_overhead(clock: Clock, repeats: int, budget_s: float) -> dict[str, Summary]:
    """Seconds per call of ops on 1-element tensors, autograd recording on: the fixed cost of
    one op of a training forward (dispatcher + autograd node; on CUDA, the launch)."""
    dev = clock.device
    a, b = _rand((1, 1), torch.float32, dev, True), _rand((1, 1), torch.float32, dev, True)
    w, bias = _rand((1,), torch.float32, dev, True), _rand((1,), torch.float32, dev, True)
    ops = {
        "add": lambda: a + b,
        "mul": lambda: a * b,
        "linear": lambda: F.linear(a, b),
        "layer_norm": lambda: F.layer_norm(a, (1,), w, bias),
    }
    return {name: measure(fn, clock, repeats, budget_s / len(ops), min_sample_s=5e-3) for name, fn in ops.items()}


def bench_host_copy(clock: Clock, nbytes: int, repeats: int, budget_s: float) -> Summary:
    """Device <- host copy of ``nbytes`` (pinned memory on CUDA; a memcpy on CPU)."""
    numel = max(1, nbytes // 4)
    src = torch.randn(numel)
    if clock.is_cuda:
        src = src.pin_memory()
    dst = torch.empty(numel, device=clock.device)
    return measure(lambda: dst.copy_(src, non_blocking=clock.is_cuda), clock, repeats, budget_s)
