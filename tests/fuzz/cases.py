"""Generated command lines for the fuzzer (``run.py``): bad and good inputs of every kind.

A case is ``Case(kind, argv, files)``: ``argv`` for ``parsim.cli.main`` with ``{dir}``
standing for the case's scratch folder, and ``files`` the bytes to put there first (``name
-> bytes``; a ``None`` value makes a folder). ``make_case(kind, rng)`` draws one case of a
kind from a seeded ``random.Random``, so case ``i`` of seed ``s`` is always the same.

Every generator mixes valid values (so the cases reach deep into the program) with the
malformed values the issue lists: wrong types, huge and non-finite numbers, repeated keys,
non-UTF-8 bytes, deep nesting, YAML alias bombs, non-string keys, empty files, folders.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import yaml


@dataclass
class Case:
    kind: str
    argv: list[str]
    files: dict[str, bytes | None] = field(default_factory=dict)


PLAN_KEYS = ["dp", "tp", "pp", "vpp", "mbs", "gbs", "schedule", "zero", "offload", "recompute", "sp", "dtype",
             "partition", "dp_bucket_bytes", "dp_overlap", "shifted_critical_path", "tp_overlap", "dp_impl",
             "recompute_layers"]
WORDS = {"schedule": ["naive", "gpipe", "1f1b", "interleaved", "zbv", "dualpipev"],
         "offload": ["none", "optimizer", "optimizer+params"], "recompute": ["none", "full", "selective",
                                                                             "stage-aware"],
         "dtype": ["fp32", "bf16", "fp16"], "tp_overlap": ["none", "subpipe"], "dp_impl": ["allreduce", "ps"],
         "sp": ["true", "false"], "dp_overlap": ["true", "false"], "shifted_critical_path": ["true", "false"]}
MODEL_FIELDS = {"name": "m", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 256,
                "seq_len": 32, "activation": "gelu", "norm": "layernorm", "position": "learned",
                "tied_embeddings": True, "dropout": False, "flash_attention": False, "bias": True, "norm_eps": 1e-5}
HF_FIELDS = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 32, "hidden_act": "silu",
             "model_type": "llama", "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "attention_dropout": 0.0}
PRESETS = ["a100-80g", "a100-40g", "h100-sxm", "h200", "cpu", "cpu-calibrated"]
SMALL_MODELS = ["tiny", "tiny", "cpu-small", "gpt3-125m"]


def weird_number(rng: random.Random) -> str:
    """Numbers as text: small, huge, negative, non-finite, not numbers at all."""
    return rng.choice([
        str(rng.randint(-3, 16)), str(rng.randint(0, 4096)), "0", "-1", "1e3", "2.0", "1.7", "10" * rng.randint(1, 8),
        str(10 ** rng.choice([12, 21, 309, 400])), "9" * rng.choice([20, 400, 5000]), "nan", "inf", "-inf", ".inf",
        "", "abc", "four", "0x10", "1_000", "²", "١٢", "1e400", "4e400", "true", "null", "[1, 2]", "{a: 1}",
        str(2 ** 53), str(2 ** 53 + 1), str(2 ** 63), " 8 ", "+4"])


def weird_value(rng: random.Random, depth: int = 0):
    """A YAML/JSON value of any type."""
    kind = rng.randrange(10 if depth < 3 else 7)
    if kind == 0:
        return rng.randint(-5, 64)
    if kind == 1:
        return rng.choice([10 ** 12, 10 ** 21, 2 ** 53 + 1, -(10 ** 9), 10 ** 309])
    if kind == 2:
        return rng.choice([0.5, 1.7, -1.0, 1e-5, float("nan"), float("inf"), -float("inf"), 1e308, 0.0])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return rng.choice(["", "maybe", "false", "true", "none", "gelu", "swiglu", "x" * 300, "über", "1f1b"])
    if kind == 5:
        return weird_number(rng)
    if kind == 6:
        return rng.choice(["2024-01-01", "~", "null", "1.0e+400"])
    if kind == 7:
        return [weird_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == 8:
        return {rng.choice(["a", "b", "layers", "dp"]): weird_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return rng.choice([[1, 2], [1.7, 2.9], [True], ["1", "2"], {}])


def dump(data, rng: random.Random, as_json: bool = False) -> bytes:
    """``data`` as YAML or JSON text; JSON keeps NaN/inf as its non-standard tokens."""
    if as_json:
        return json.dumps(data).encode()
    try:
        return yaml.safe_dump(data, allow_unicode=rng.random() < 0.5).encode()
    except (yaml.YAMLError, ValueError, OverflowError):
        return json.dumps(data).encode()


def malformed_file(rng: random.Random, template: bytes) -> bytes | None:
    """A broken file: bad bytes, structure bombs, repeated or odd keys, a folder (None)."""
    choice = rng.randrange(14)
    if choice == 0:
        return b"\xff\xfe\x00garbage" + template
    if choice == 1:
        return template[: rng.randint(0, len(template))]                      # truncated
    if choice == 2:
        return ("a: " + "[" * 5000 + "]" * 5000 + "\n").encode()                 # deep nesting
    if choice == 3:
        return ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(                 # billion laughs
            f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))).encode()
    if choice == 4:
        return template + b"\n" + template                                       # repeated keys
    if choice == 5:
        return b"1: 2\n? [a, b]\n: c\n" + template                               # non-string keys
    if choice == 6:
        return b""
    if choice == 7:
        return None                                                              # a folder
    if choice == 8:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 200)))      # binary
    if choice == 9:
        return b"- just\n- a list\n"
    if choice == 10:
        return b"a: b\n---\nc: d\n"                                              # two documents
    if choice == 11:
        return b"x: !!python/object:os.system [ls]\n"
    if choice == 12:
        return b"a: '" + b"x" * 100_000 + b"\n"                                  # unterminated
    return b"\xef\xbb\xbf" + template                                            # BOM


def plan_string(rng: random.Random) -> str:
    """Pairs of plan keys and values, valid or not, sometimes repeated or without '='."""
    parts = []
    for _ in range(rng.randint(0, 6)):
        key = rng.choice(PLAN_KEYS + ["colour", "", "DP", "dp "])
        if key in WORDS and rng.random() < 0.6:
            value = rng.choice(WORDS[key])
        elif key in ("partition", "recompute_layers") and rng.random() < 0.5:
            value = ",".join(str(rng.randint(0, 4)) for _ in range(rng.randint(1, 4)))
        elif key in ("dp", "tp", "pp", "mbs", "vpp", "zero") and rng.random() < 0.6:
            value = str(rng.choice([1, 1, 2, 2, 4]))
        else:
            value = weird_number(rng)
        parts.append(f"{key}={value}" if rng.random() < 0.95 else key)
    if parts and rng.random() < 0.1:
        parts.append(parts[0])
    return " ".join(parts)


def plan_dict(rng: random.Random) -> dict:
    out = {}
    for _ in range(rng.randint(0, 5)):
        key = rng.choice(PLAN_KEYS + ["colour"])
        out[key] = (rng.choice(WORDS[key]) if key in WORDS and rng.random() < 0.5
                    else rng.choice([1, 2, 4]) if rng.random() < 0.4 else weird_value(rng))
    return out


def model_dict(rng: random.Random, fields: dict) -> dict:
    out = dict(fields)
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(list(fields) + ["colour", 1])
        if rng.random() < 0.15:
            out.pop(key, None)
        else:
            out[key] = weird_value(rng)
    return out
