"""What the executor's layer saves for backward, tensor by tensor, against ``costs.saved`` (the one
list that ``layer_activation_bytes`` sums and ``split_backward.layer_saved_tensors`` reads): every
tensor its autograd nodes save (``torch.autograd.graph.saved_tensors_hooks``, one storage counted
once, parameters left out, the layer input in), in fp32 and in bf16 -- ``torch.autocast`` over fp32
parameters, as the executor runs it: an fp32 residual stream, one 16-bit cast of the input per
GEMM and a 16-bit copy of each GEMM weight per microbatch. With dropout as torch runs it on a CPU:
its scaled noise kept in its input's dtype, and SDPA on its math path (fp32 copies of q, k, v,
fp32 softmax, noise and output, no causal mask kept)."""
from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from parsim.costs.activations import layer_activation_bytes  # noqa: E402
from parsim.costs.saved import layer_saved  # noqa: E402
from parsim.costs.split_backward import layer_saved_tensors  # noqa: E402
from parsim.executor.model import StageModule  # noqa: E402
from parsim.executor.optimizer import autocast_factory  # noqa: E402
from parsim.specs import load_model, parse_plan  # noqa: E402

TINY = load_model("tiny")
GPT = replace(TINY, flash_attention=True, seq_len=64)
LLAMA = replace(GPT, activation="swiglu", norm="rmsnorm", position="rope", bias=False, tied_embeddings=False)
VARIANTS = {"gpt-sdpa": GPT, "gpt-explicit-gqa": replace(GPT, flash_attention=False),
            "gpt-explicit-mha": replace(GPT, flash_attention=False, kv_heads=GPT.heads),
            "llama-sdpa": LLAMA, "llama-explicit": replace(LLAMA, flash_attention=False),
            # with dropout (the CPU's: scaled noise in its input's dtype; SDPA then runs its fp32 math path)
            "gpt-sdpa-dropout": replace(GPT, dropout=True),
            "gpt-explicit-dropout": replace(GPT, flash_attention=False, dropout=True),
            "llama-sdpa-dropout": replace(LLAMA, dropout=True),
            "llama-explicit-dropout": replace(LLAMA, flash_attention=False, dropout=True)}


def saved_by_layer(spec, dtype: str, mbs: int, policy: str = "none") -> dict[int, tuple]:
    """Storage -> (shape, dtype, bytes, what) of every tensor one executor layer's forward saves
    (its input included, its parameters not), under the executor's autocast for ``dtype``."""
    torch.manual_seed(0)
    stage = StageModule(spec, 0, 1, False, False)
    block = stage.layers["0"]
    block.attn.recompute_core = policy == "selective"
    block.recompute_full = policy == "full"
    params = {p.untyped_storage().data_ptr() for p in stage.parameters()}
    x = torch.randn(mbs, spec.seq_len, spec.hidden, requires_grad=True)
    seen: dict[int, tuple] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), (tuple(t.shape), t.dtype, storage.nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with autocast_factory(dtype, torch.device("cpu"))():
            stage(x)
    return seen


@pytest.mark.parametrize("policy", ["none", "selective", "full"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_layer_saves_what_its_list_says(variant, dtype, policy):
    spec = VARIANTS[variant]
    plan = parse_plan(f"mbs=2 gbs=2 dtype={dtype} recompute={policy}")
    measured = sum(n for _, _, n in saved_by_layer(spec, dtype, 2, policy).values())
    assert layer_activation_bytes(spec, plan) == pytest.approx(measured, rel=1e-3)


@pytest.mark.parametrize("variant", ["gpt-sdpa", "llama-explicit"])
def test_the_split_backward_reads_the_same_list(variant):
    """``layer_saved_tensors`` is the layer's list without its input: the two sum to the same
    bytes as the stash (the rule exists once)."""
    spec = VARIANTS[variant]
    for dtype in ("fp32", "bf16"):
        plan = parse_plan(f"mbs=1 gbs=1 dtype={dtype}")
        layer = layer_saved(spec, plan)
        first = layer.tensors[0]
        assert first.part == "input"
        assert sum(n for _, n, _ in layer_saved_tensors(spec, plan)) + first.nbytes == \
            pytest.approx(layer_activation_bytes(spec, plan))
