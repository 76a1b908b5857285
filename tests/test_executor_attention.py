"""The executor's attention follows the model's ``flash_attention``: the fused kernel (SDPA)
or the explicit softmax(QK^T)V the cost model counts; both compute the same function."""
import math

import pytest

torch = pytest.importorskip("torch")

from dataclasses import replace  # noqa: E402

from parsim.executor.model import StageModule  # noqa: E402
from parsim.executor.weights import init_stage  # noqa: E402
from parsim.specs import load_model  # noqa: E402


@pytest.mark.parametrize("kv_heads", [4, 2])          # MHA and GQA
def test_explicit_and_fused_attention_give_the_same_loss_and_gradients(kv_heads):
    torch.manual_seed(0)
    base = replace(load_model("tiny"), kv_heads=kv_heads)
    tokens = torch.randint(0, base.vocab, (2, base.seq_len))
    results = []
    for flash in (False, True):
        spec = replace(base, flash_attention=flash)
        model = StageModule(spec, 0, spec.layers, is_first=True, is_last=True)
        init_stage(model, seed=3)
        assert all(b.attn.flash is flash for b in model.layers.values())
        loss = model(tokens, tokens)
        loss.backward()
        results.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (l0, g0), (l1, g1) = results
    assert math.isfinite(l0) and l0 == pytest.approx(l1, rel=1e-5)
    for name in g0:
        assert torch.allclose(g0[name], g1[name], rtol=1e-4, atol=1e-6), name


def test_explicit_attention_is_causal():
    """A later token cannot change an earlier position's output."""
    spec = replace(load_model("tiny"), flash_attention=False)
    model = StageModule(spec, 0, 1, is_first=False, is_last=False)
    init_stage(model, seed=0)
    x = torch.randn(1, spec.seq_len, spec.hidden)
    y = x.clone()
    y[:, -1] += 1.0
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-6) and not torch.allclose(a[:, -1], b[:, -1])
