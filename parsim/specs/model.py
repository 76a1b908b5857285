"""ModelSpec: a decoder-only transformer, described by the numbers every cost formula needs."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from .errors import SpecError

ACTIVATIONS = ("gelu", "swiglu")
# The largest size a field may take: 2**53, below which every integer is exact in float64
# (IEEE 754 binary64 has a 53-bit significand), so the cost formulas' float products of a few
# sizes stay exact enough and finite (2**53 to the 5th power is far below 1.8e308).
MAX_SIZE = 2**53
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope", "none")


@dataclass(frozen=True)
class ModelSpec:
    """A GPT/Llama-style decoder. Sizes are counts (not bytes).

    ``kv_heads`` defaults to ``heads`` (multi-head attention); fewer means GQA.
    ``ffn_hidden`` defaults to 4*hidden for gelu (GPT-2/3) and to Llama's
    2/3*4*hidden rounded up to a multiple of 256 for swiglu (Touvron et al. 2023).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int | None = None
    ffn_hidden: int | None = None
    vocab: int = 51200
    seq_len: int = 2048
    activation: str = "gelu"
    norm: str = "layernorm"
    position: str = "learned"
    tied_embeddings: bool = True
    dropout: bool = True
    flash_attention: bool = False
    bias: bool = True
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpecError("model.name", self.name, "a non-empty string")
        for name in ("layers", "hidden", "heads", "vocab", "seq_len"):
            _check_size(name, getattr(self, name))
        for name in ("tied_embeddings", "dropout", "flash_attention", "bias"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"model.{name}", getattr(self, name), "true or false (a YAML boolean, unquoted)")
        eps = self.norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:   # NaN fails too
            raise SpecError("model.norm_eps", eps, "a number between 0 and 1 (exclusive), e.g. 1e-5")
        if self.activation not in ACTIVATIONS:
            raise SpecError("model.activation", self.activation, f"one of {', '.join(ACTIVATIONS)}")
        if self.norm not in NORMS:
            raise SpecError("model.norm", self.norm, f"one of {', '.join(NORMS)}")
        if self.position not in POSITIONS:
            raise SpecError("model.position", self.position, f"one of {', '.join(POSITIONS)}")
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden is None:
            if self.activation == "swiglu":
                ffn = int(2 * 4 * self.hidden / 3)
                ffn = 256 * ((ffn + 255) // 256)
            else:
                ffn = 4 * self.hidden
            object.__setattr__(self, "ffn_hidden", ffn)
        for name in ("kv_heads", "ffn_hidden"):
            _check_size(name, getattr(self, name))
        if self.hidden % self.heads:
            raise SpecError("model.heads", self.heads, f"must divide hidden={self.hidden}")
        if self.heads % self.kv_heads:
            raise SpecError("model.kv_heads", self.kv_heads, f"must divide heads={self.heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of the K (or V) projection: kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def _check_size(name: str, v: object) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise SpecError(f"model.{name}", v, "a positive integer")
    if v > MAX_SIZE:
        raise SpecError(f"model.{name}", v, f"a positive integer up to 2**53 = {MAX_SIZE:,} (exact in float64)")


def _gpt(name, layers, hidden, heads, seq=2048, vocab=51200):
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq)


def _llama(name, layers, hidden, heads, kv_heads, ffn, vocab, seq):
    return ModelSpec(
        name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn_hidden=ffn,
        vocab=vocab, seq_len=seq, activation="swiglu", norm="rmsnorm", position="rope",
        tied_embeddings=False, dropout=False, flash_attention=True, bias=False,
    )


# GPT-3 family: Brown et al. 2020, Table 2.1 (vocab padded to 51200 as in Megatron-LM).
# 1.3b uses 16 heads (the paper's 24 heads x 128 does not divide d_model=2048);
# 13b uses d_model 5120 (the paper's 5140 is not divisible by its 40 heads).
# Megatron 2021 Table 1 models: Narayanan et al. 2021 (seq 2048, vocab 51200).
# Llama-2: Touvron et al. 2023 (and HF configs); Llama-3: Dubey et al. 2024, Table 3.
MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec(name="tiny", layers=4, hidden=64, heads=4, kv_heads=2, ffn_hidden=128,
                  vocab=128, seq_len=32, dropout=False),
        # fused attention, as torch's CPU SDPA (a flash kernel) runs it in the executor
        ModelSpec(name="cpu-small", layers=8, hidden=512, heads=8, ffn_hidden=2048,
                  vocab=2048, seq_len=128, dropout=False, flash_attention=True),
        _gpt("gpt3-125m", 12, 768, 12),
        _gpt("gpt3-350m", 24, 1024, 16),
        _gpt("gpt3-760m", 24, 1536, 16),
        _gpt("gpt3-1.3b", 24, 2048, 16),
        _gpt("gpt3-2.7b", 32, 2560, 32),
        _gpt("gpt3-6.7b", 32, 4096, 32),
        _gpt("gpt3-13b", 40, 5120, 40),
        _gpt("gpt3-175b", 96, 12288, 96),
        _gpt("megatron-1.7b", 24, 2304, 24),
        _gpt("megatron-3.6b", 30, 3072, 32),
        _gpt("megatron-7.5b", 36, 4096, 32),
        _gpt("megatron-18.4b", 40, 6144, 48),
        _gpt("megatron-39.1b", 48, 8192, 64),
        _gpt("megatron-76.1b", 60, 10240, 80),
        _gpt("megatron-145.6b", 80, 12288, 96),
        _gpt("megatron-310.1b", 96, 16384, 128),
        _gpt("megatron-529.6b", 105, 20480, 128),
        _gpt("megatron-1t", 128, 25600, 160),
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
    ]
}
