"""How many bytes do the memory-bound ops of a Llama layer move when a stack runs them as eager
PyTorch instead of one fused kernel? (issue 19: the stack is part of the model)

Megatron-Core / Transformer Engine run RMSNorm, SwiGLU and RoPE each as one fused kernel that
reads its inputs and writes its outputs once. Eager PyTorch (the executor; HF's LlamaRMSNorm,
LlamaMLP and rotate_half RoPE under llm-foundry; torchtitan's FeedForward and complex RoPE)
runs a chain of aten ops, each a kernel of its own on a GPU that reads and writes whole tensors,
some in fp32. This script runs each implementation forward and backward on 16-bit activations
under a ``TorchDispatchMode`` and counts, op by op, the kernels (ops that write a new tensor or
one in place; views move nothing) and the bytes they read and write. It prints each as bytes
per element of the op's tensor and as a multiple of the fused kernel's bytes
(``parsim.costs.ops``: a norm reads and writes x, 2 x 2 B forward, 1.5 x that backward; SwiGLU
reads gate and up and writes one, 3 x 2 B, 1.5 x backward; RoPE reads and writes q and k,
2 x 2 B each way): the ``EAGER_TRAFFIC`` multiples ``costs.ops`` prices on GPUs. The aten ops
are the same on every device (CUDA runs one kernel per op); ``F.rms_norm`` is the one
exception: on CUDA it dispatches to the fused ``aten::_fused_rms_norm`` (torch 2.13's op
registry), so torchtitan's ``nn.RMSNorm`` is a fused norm there, while on CPU it is the
composite counted here.

    .venv/bin/python studies/public_record/eager_kernels.py     # ~2 s; writes eager_kernels.txt
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from executor.model import RMSNorm, apply_rope, rope_tables  # noqa: E402

TOKENS, HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM = 512, 256, 704, 4, 2, 64
BF16 = torch.bfloat16
# the tables both Llama codes build once per model, not per layer call
FREQS = torch.polar(torch.ones(TOKENS, HEAD_DIM // 2), torch.randn(TOKENS, HEAD_DIM // 2))
COS, SIN = torch.randn(TOKENS, HEAD_DIM, dtype=BF16), torch.randn(TOKENS, HEAD_DIM, dtype=BF16)


class Kernels(TorchDispatchMode):
    """Every aten op that writes memory: (name, bytes read, bytes written)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [a for a in tree_flatten(out)[0] if isinstance(a, torch.Tensor)]
        storages = {a.untyped_storage().data_ptr() for a in ins}
        new = [o for o in outs if o.untyped_storage().data_ptr() not in storages]
        if new or func._schema.name.endswith("_"):
            read = sum(a.numel() * a.element_size() for a in ins)
            self.ops.append((str(func), read, sum(o.numel() * o.element_size() for o in new or outs)))
        return out


def count(fn, inputs: list[torch.Tensor], elements: int) -> tuple[int, float, int, float]:
    """(forward kernels, forward bytes per element, backward kernels, backward bytes per element)."""
    xs = [x.detach().requires_grad_(True) for x in inputs]
    with Kernels() as fwd:
        ys = fn(*xs)
    ys = ys if isinstance(ys, tuple) else (ys,)
    grads = [torch.randn_like(y) for y in ys]
    with Kernels() as bwd:
        torch.autograd.backward(ys, grads)
    per = lambda ops: sum(r + w for _, r, w in ops) / elements  # noqa: E731
    return len(fwd.ops), per(fwd.ops), len(bwd.ops), per(bwd.ops)


def hf_rmsnorm(x, w):
    """HF ``LlamaRMSNorm.forward`` (transformers/models/llama/modeling_llama.py)."""
    hs = x.to(torch.float32)
    hs = hs * torch.rsqrt(hs.pow(2).mean(-1, keepdim=True) + 1e-5)
    return w * hs.to(x.dtype)


def torchtitan_rope(q, k):
    """torchtitan ``apply_rotary_emb``: q, k as complex pairs in fp32 times the complex table."""
    def one(x):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * FREQS.view(1, TOKENS, 1, -1)).flatten(3).type_as(x)
    return one(q), one(k)


def hf_rope(q, k):
    """HF ``apply_rotary_pos_emb``: q cos + rotate_half(q) sin, tables in the model's dtype."""
    cos, sin = COS.view(1, TOKENS, 1, -1), SIN.view(1, TOKENS, 1, -1)
    half = HEAD_DIM // 2
    rot = lambda x: torch.cat((-x[..., half:], x[..., :half]), -1)  # noqa: E731
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def executor_rope(q, k):
    """The executor's ``apply_rope`` (``executor/model.py``), tables built per call as it does."""
    cos, sin = rope_tables(TOKENS, HEAD_DIM, q.device)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


def measure() -> list[tuple[str, str, int, float, float, int, float, float]]:
    """Every implementation counted: (op, implementation, forward kernels, forward bytes per
    element, x the fused kernel's, backward kernels, backward bytes per element, x fused)."""
    x, w = torch.randn(1, TOKENS, HIDDEN, dtype=BF16), torch.ones(HIDDEN, dtype=BF16)
    gate, up = torch.randn(1, TOKENS, FFN, dtype=BF16), torch.randn(1, TOKENS, FFN, dtype=BF16)
    q = torch.randn(1, TOKENS, HEADS, HEAD_DIM, dtype=BF16)
    k = torch.randn(1, TOKENS, KV_HEADS, HEAD_DIM, dtype=BF16)
    qt, kt = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()   # the executor's (b, a, s, d)
    norm = RMSNorm(HIDDEN, 1e-5).to(BF16)
    qk = TOKENS * (HEADS + KV_HEADS) * HEAD_DIM
    # (op, implementation, fn, inputs, elements, fused bytes per element forward, backward)
    cases = [
        ("rmsnorm", "HF LlamaRMSNorm", hf_rmsnorm, [x, w], TOKENS * HIDDEN, 4.0, 6.0),
        ("rmsnorm", "executor RMSNorm", lambda x: norm(x), [x], TOKENS * HIDDEN, 4.0, 6.0),
        ("rmsnorm", "F.rms_norm on CPU (composite)", lambda x, w: F.rms_norm(x, (HIDDEN,), w, 1e-5), [x, w],
         TOKENS * HIDDEN, 4.0, 6.0),
        ("layernorm", "F.layer_norm (one kernel)", lambda x, w: F.layer_norm(x, (HIDDEN,), w, None, 1e-5), [x, w],
         TOKENS * HIDDEN, 4.0, 6.0),
        ("swiglu", "silu(gate) * up", lambda g, u: F.silu(g) * u, [gate, up], TOKENS * FFN, 6.0, 9.0),
        ("rope", "torchtitan complex", torchtitan_rope, [q, k], qk, 4.0, 4.0),
        ("rope", "HF rotate_half", hf_rope, [q, k], qk, 4.0, 4.0),
        ("rope", "executor stack of halves", executor_rope, [qt, kt], qk, 4.0, 4.0),
    ]
    out = []
    for op, impl, fn, inputs, elements, fused_f, fused_b in cases:
        kf, bf, kb, bb = count(fn, inputs, elements)
        out.append((op, impl, kf, bf, bf / fused_f, kb, bb, bb / fused_b))
    return out


def main() -> int:
    lines = ["op | implementation | fwd kernels | fwd B/elem | x fused | bwd kernels | bwd B/elem | x fused",
             "---|---|---:|---:|---:|---:|---:|---:"]
    lines += [f"{op} | {impl} | {kf} | {bf:.1f} | {xf:.2f} | {kb} | {bb:.1f} | {xb:.2f}"
              for op, impl, kf, bf, xf, kb, bb, xb in measure()]
    text = "\n".join(lines)
    print(text)
    (HERE / "eager_kernels.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
