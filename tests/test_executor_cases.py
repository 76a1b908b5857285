"""Models and helpers shared by the executor tests (holds no tests itself)."""
from __future__ import annotations

import functools
import os

import torch

from parsim.specs import ModelSpec, load_model, parse_plan

# GPT-style: gelu, layernorm, learned positions, tied embeddings, biases.
TINY_GPT = load_model("tiny")
# Llama-style: swiglu, rmsnorm, rope, untied embeddings, no biases, GQA (4 heads, 2 kv heads).
TINY_LLAMA = ModelSpec(name="tiny-llama", layers=4, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, vocab=128,
                       seq_len=32, activation="swiglu", norm="rmsnorm", position="rope", tied_embeddings=False,
                       dropout=False, bias=False)
MODELS = {"gpt": TINY_GPT, "llama": TINY_LLAMA}
STEPS = 3


@functools.lru_cache(maxsize=None)
def reference(model_key: str, plan_text: str, steps: int = STEPS):
    """The single-process plain training loop for this model, batch and dtype."""
    from parsim.executor import run_reference
    return run_reference(MODELS[model_key], parse_plan(plan_text), steps=steps)


def relative_errors(values: list[float], expected: list[float]) -> list[float]:
    return [abs(a - b) / abs(b) for a, b in zip(values, expected)]


def worst_tensor_error(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """max over tensors of ||got - expected|| / ||expected||, the denominator floored at 1e-4 of
    the whole model's norm: a gradient that vanishes mathematically (the attention key bias:
    softmax ignores a per-query constant) is pure rounding noise in every plan."""
    assert set(got) == set(expected), set(got) ^ set(expected)
    floor = 1e-4 * torch.cat([v.flatten() for v in expected.values()]).norm()
    return max(((got[k] - v).norm() / torch.maximum(v.norm(), floor)).item() for k, v in expected.items())


def max_abs_difference(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    assert set(got) == set(expected), set(got) ^ set(expected)
    return max((got[k] - v).abs().max().item() for k, v in expected.items())


def model_relative_error(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """||got - expected|| / ||expected|| over all tensors of the model together."""
    diff = torch.cat([(got[k] - v).flatten() for k, v in expected.items()])
    ref = torch.cat([v.flatten() for v in expected.values()])
    return (diff.norm() / ref.norm()).item()


def gone(pid: int) -> bool:
    """No process ``pid`` exists any more."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
