"""What the aten ops of one traced node cost: each becomes a ``parsim.costs.Op``, priced by
``parsim.costs.timing.op_time`` like every op of the simulator (torch imported lazily).

* matrix products (mm, addmm, bmm, baddbmm, convolution): 2 m n k FLOP per product; the
  backward has the input-gradient and weight-gradient GEMMs, each only if that operand
  needs a gradient (Narayanan et al. 2021 Sec. 5.1: backward = 2x forward for a Linear);
  a convolution is its implicit GEMM (Chetlur et al. 2014, cuDNN: m = N Ho Wo,
  n = C_out / groups, k = C_in / groups x kh x kw, ``groups`` products).
* ``F.scaled_dot_product_attention``: one fused attention op of 4 b h s_q s_k d FLOP
  (QK^T and PV), backward 2.5x (Dao et al. 2022, Sec. 3.1; as ``parsim.costs.ops``). The
  timing model executes half of it for causal attention (Dao 2023), so a non-causal call
  counts twice the FLOPs to be priced in full. Its saved tensors are FlashAttention's
  (q, k, v, output and the fp32 log-sum-exp), whatever kernel runs on the tracing device.
* views and metadata ops: free. Every other op is memory-bound: it reads its tensor inputs
  and writes its outputs (roofline, Williams et al. 2009); its backward moves 1.5x that if
  any input needs a gradient (``parsim.costs.ops`` convention). Ops the calibration measures
  are named as in its ``membound_table`` and counted as ``parsim.costs.ops`` counts them, so
  a calibrated bytes/s applies unchanged.
"""
from __future__ import annotations

import math

from parsim.costs import Op
from parsim.costs.ops import embedding_bwd_bytes

GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm", "convolution")
FREE_OPS = {"detach", "alias", "lift_fresh", "_unsafe_view", "view", "_reshape_alias", "t", "transpose",
            "permute", "expand", "unsqueeze", "squeeze", "select", "slice", "as_strided", "split",
            "split_with_sizes", "unbind", "chunk", "sym_size", "sym_stride", "sym_numel", "empty", "empty_like",
            "scalar_tensor", "_local_scalar_dense", "unfold", "diagonal", "reshape"}
# aten op -> the calibration's memory-bound op name (calibration/shapes.py, membound_table keys)
MEMBOUND_NAMES = {"native_layer_norm": "layernorm", "layer_norm": "layernorm", "gelu": "gelu",
                  "add": "residual_add", "_softmax": "softmax", "_safe_softmax": "softmax",
                  "_log_softmax": "cross_entropy", "embedding": "embedding",
                  # dropout: on a CPU (and on meta, where the trace runs) ``at::dropout`` draws
                  # ``bernoulli_`` into an empty tensor, scales it (div_) and multiplies; the
                  # calibration's "dropout" times the three, so the draw stands for them, read +
                  # write of the noise as its bytes count (the div_ and mul priced beside it)
                  "bernoulli_": "dropout", "native_dropout": "dropout"}
BWD_BYTES_FACTOR = 1.5          # parsim.costs.ops: a memory-bound op's backward moves 1.5x its forward
FLASH_BWD_FACTOR = 2.5          # Dao et al. 2022, Sec. 3.1 (backward recomputes the scores)
LSE_BYTES = 4                   # FlashAttention keeps one fp32 log-sum-exp per query row


def _tensors(xs):
    import torch
    out = []
    for x in xs:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out += _tensors(x)
    return out


def _nbytes(t) -> float:
    return float(t.numel() * t.element_size())


def aten_op(func, args, kwargs, out) -> Op | None:
    """The Op of one dispatched aten call (None when it costs nothing)."""
    base = func._overloadpacket.__name__
    if getattr(func, "is_view", False) or base in FREE_OPS:
        return None
    if base in GEMM_OPS:
        return _gemm_op(base, args)
    ins = _tensors(list(args) + list((kwargs or {}).values()))
    outs = _tensors([out])
    grad = any(t.requires_grad for t in ins)
    label = MEMBOUND_NAMES.get(base, base)
    out_bytes = sum(_nbytes(t) for t in outs)
    if label in ("layernorm", "gelu", "softmax", "cross_entropy"):
        fwd = 2.0 * (_nbytes(outs[0]) if outs else 0.0)      # read + write one tensor (ops.py)
    elif label == "residual_add" and len(ins) == 2 and ins[0].shape == ins[1].shape:
        fwd = 3.0 * out_bytes                                  # read two, write one (ops.py)
    elif label == "embedding":
        fwd = 2.0 * out_bytes                                  # gather rows: read + write (ops.py)
    elif base == "nll_loss_forward":
        fwd = out_bytes + sum(_nbytes(t) for t in ins[1:])     # reads one logit per token
    else:
        fwd = sum(_nbytes(t) for t in ins) + out_bytes
    if fwd <= 0:
        return None
    if label == "embedding" and grad:     # the table's dense gradient is written too (ops.embedding_ops)
        table = ins[0]
        return Op(label, "membound", 0.0, 0.0, 0.0, fwd_bytes=fwd,
                  bwd_bytes=embedding_bwd_bytes(fwd, table.numel(), table.element_size()))
    return Op(label, "membound", 0.0, 0.0, 0.0, fwd_bytes=fwd, bwd_bytes=BWD_BYTES_FACTOR * fwd if grad else 0.0)


def _gemm_op(base: str, args) -> Op:
    if base == "convolution":
        x, w = args[0], args[1]
        groups = int(args[8]) if len(args) > 8 else 1
        n_img, c_in = x.shape[0], x.shape[1]
        c_out, kernel = w.shape[0], int(math.prod(w.shape[2:]))
        out_spatial = _conv_out_spatial(x, w, args)
        m, n, k, batch = n_img * out_spatial, c_out // groups, (c_in // groups) * kernel, groups
        a_grad, b_grad = x.requires_grad, w.requires_grad
    else:
        a, b = (args[1], args[2]) if base in ("addmm", "baddbmm") else (args[0], args[1])
        batch = a.shape[0] if a.dim() == 3 else 1
        m, k = a.shape[-2], a.shape[-1]
        n = b.shape[-1]
        a_grad, b_grad = a.requires_grad, b.requires_grad
    f = 2.0 * m * n * k * batch
    return Op(base, "gemm", f, f if a_grad else 0.0, f if b_grad else 0.0, shape=(int(m), int(n), int(k)),
              batch=int(batch))


def _conv_out_spatial(x, w, args) -> int:
    stride, padding, dilation = args[3], args[4], args[5]
    out = 1
    for i, size in enumerate(x.shape[2:]):
        kk = w.shape[2 + i]
        s, p, d = stride[i % len(stride)], padding[i % len(padding)], dilation[i % len(dilation)]
        out *= (size + 2 * p - d * (kk - 1) - 1) // s + 1
    return int(out)


def attention_op(q, k, is_causal: bool) -> Op:
    """Fused scaled-dot-product attention on q [..., s_q, d], k [..., s_k, d]."""
    batch_heads = int(math.prod(q.shape[:-2]))
    s_q, d = q.shape[-2], q.shape[-1]
    s_k = k.shape[-2]
    fwd = 4.0 * batch_heads * s_q * s_k * d
    if not is_causal:
        fwd *= 2.0   # timing.op_time executes half of a fused attention's FLOPs (the causal half)
    return Op("flash_attention", "attention", fwd, FLASH_BWD_FACTOR * fwd, 0.0, shape=(int(s_q), int(s_k), int(d)),
              batch=batch_heads, attention_core=True)


def attention_saved_bytes(q) -> float:
    """The fp32 log-sum-exp FlashAttention keeps besides q, k, v and the output."""
    return float(LSE_BYTES * math.prod(q.shape[:-1]))
