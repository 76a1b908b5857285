"""Seeded random plans: every plan key, every preset family, every shipped GPU and CPU profile
plus the studies' profiles, representative and full mode, stragglers; valid by construction
(a few deliberately invalid ones check that error messages stay the same)."""
from __future__ import annotations

import math
import random

from corpus_items import SEED, SLOW_LINKS, plan_items, plan_string

RANDOM_PLANS = 1900
GPU_CLUSTERS = ("a100-80g", "a100-40g", "h100-sxm", "h200")
GPU_MODELS = {   # name: (layers, heads, kv_heads, ffn_hidden, seq_len)
    "gpt3-125m": (12, 12, 12, 3072, 2048), "gpt3-350m": (24, 16, 16, 4096, 2048),
    "gpt3-760m": (24, 16, 16, 6144, 2048), "gpt3-1.3b": (24, 16, 16, 8192, 2048),
    "gpt3-2.7b": (32, 32, 32, 10240, 2048), "gpt3-6.7b": (32, 32, 32, 16384, 2048),
    "gpt3-13b": (40, 40, 40, 20480, 2048), "gpt3-175b": (96, 96, 96, 49152, 2048),
    "megatron-1.7b": (24, 24, 24, 9216, 2048), "megatron-3.6b": (30, 32, 32, 12288, 2048),
    "megatron-7.5b": (36, 32, 32, 16384, 2048), "megatron-18.4b": (40, 48, 48, 24576, 2048),
    "megatron-39.1b": (48, 64, 64, 32768, 2048), "megatron-76.1b": (60, 80, 80, 40960, 2048),
    "megatron-145.6b": (80, 96, 96, 49152, 2048), "megatron-310.1b": (96, 128, 128, 65536, 2048),
    "megatron-529.6b": (105, 128, 128, 81920, 2048), "megatron-1t": (128, 160, 160, 102400, 2048),
    "llama2-7b": (32, 32, 32, 11008, 4096), "llama2-13b": (40, 40, 40, 13824, 4096),
    "llama2-70b": (80, 64, 8, 28672, 4096), "llama3-8b": (32, 32, 8, 14336, 8192),
    "llama3-70b": (80, 64, 8, 28672, 8192), "llama3-405b": (126, 128, 8, 53248, 8192),
    "tiny": (4, 4, 2, 128, 32), "cpu-small": (8, 8, 8, 2048, 128),
}
CPU_MODELS = {"tiny": GPU_MODELS["tiny"], "cpu-small": GPU_MODELS["cpu-small"],
              "{BEFORE}/studies/merak/merak-cpu.yaml": (8, 8, 8, 2048, 128),
              "gpt3-125m": GPU_MODELS["gpt3-125m"]}
CPU_PROFILES = (  # (cluster preset, --profile or None)
    ("cpu", None), ("cpu-calibrated", None), ("cpu", "cpu-calibrated"),
    ("cpu", "{BEFORE}/studies/merak/profiles/cpu-merak.yaml"),
    ("cpu", "{BEFORE}/studies/validation_cpu/cpu-calibrated-insitu.yaml"),
    ("cpu", "{BEFORE}/studies/validation_cpu/recheck_2300/cpu-calibrated.yaml"),
)
# The SimPy engine's work grows with layers x microbatches (every layer of every microbatch,
# forward and backward) times the devices it plays (pp; every device in full mode), and with
# the DP buckets per step. Random plans above this many layer-microbatch steps are drawn again,
# so the whole corpus runs in a few minutes; small buckets go to the small models only.
MAX_LAYER_STEPS = 3000
SMALL_MODEL_LAYERS = 12


def divisors(n: int, cap: int) -> list[int]:
    return [d for d in range(1, cap + 1) if n % d == 0]


def balanced_layers(layers: int, stages: int) -> list[int]:
    """specs.validate.stage_layers's balanced split (the remainder to the middle stages)."""
    base, rem = divmod(layers, stages)
    counts = [base] * stages
    for s in sorted(range(stages), key=lambda s: -min(s, stages - 1 - s))[:rem]:
        counts[s] += 1
    return counts


def random_partition(rng: random.Random, layers: int, stages: int) -> list[int]:
    cuts = sorted(rng.sample(range(1, layers), stages - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, layers])]


def random_plan(rng: random.Random, shape: tuple, max_world: int, max_dp: int) -> tuple[dict, int]:
    """One valid-by-construction plan (keys as strings) for a model of ``shape``; and its
    microbatches per step."""
    layers, heads, kv, ffn, seq = shape
    tp = rng.choice([d for d in divisors(math.gcd(heads, kv, ffn), 16) if d <= max_world])
    pp = rng.choice([p for p in (1, 1, 2, 2, 3, 4, 4, 6, 8, 16) if p <= layers and tp * p <= max_world])
    dp = rng.choice([d for d in (1, 1, 2, 2, 3, 4, 8, 16, 32)[:max_dp] if d * tp * pp <= max_world] or [1])
    mbs = rng.choice((1, 1, 2, 2, 4))
    p: dict = {"dp": dp, "tp": tp, "pp": pp, "mbs": mbs}
    vpp = 1
    if pp > 1 and rng.random() < 0.3 and 2 * pp <= layers:
        vpp = rng.choice([v for v in (2, 3, 4) if pp * v <= layers])
        m = pp * rng.choice((1, 1, 2, 3))
        p.update(vpp=vpp, schedule="interleaved")
    else:
        m = rng.choice((1, 2, 3, 4, 6, 8, 12, 16, 24))
        if pp > 1 or rng.random() < 0.3:
            p["schedule"] = rng.choice(("naive", "gpipe", "1f1b", "1f1b"))
    p["gbs"] = dp * mbs * m
    p["zero"] = rng.choice((0, 0, 1, 2, 3))
    if p["zero"] >= 1 and rng.random() < 0.25:
        p["offload"] = "optimizer+params" if p["zero"] == 3 and rng.random() < 0.5 else "optimizer"
    p["recompute"] = rng.choice(("none", "none", "full", "selective", "stage-aware"))
    stages = pp * vpp
    if rng.random() < 0.15 and stages > 1:
        p["partition"] = ",".join(map(str, random_partition(rng, layers, stages)))
    if p["recompute"] == "stage-aware" and rng.random() < 0.5:
        per = [int(x) for x in p["partition"].split(",")] if "partition" in p else balanced_layers(layers, stages)
        p["recompute_layers"] = ",".join(str(rng.randint(0, n)) for n in per)
    if tp > 1 and seq % tp == 0 and rng.random() < 0.5:
        p["sp"] = "true"
    p["dtype"] = rng.choice(("bf16", "bf16", "bf16", "fp16", "fp32"))
    if rng.random() < 0.15:
        small = (2**20, 4 * 2**20) if layers <= SMALL_MODEL_LAYERS else ()
        p["dp_bucket_bytes"] = rng.choice((*small, 100 * 2**20, 2**30))
    if dp > 1 and rng.random() < 0.2:
        p["dp_overlap"] = "false"
    if pp > 1 and rng.random() < 0.2:
        p["shifted_critical_path"] = "true"
    if tp > 1 and mbs >= 2 and rng.random() < 0.3:
        p["tp_overlap"] = "subpipe"
    if dp > 1 and rng.random() < 0.15:
        p["dp_impl"] = "ps"
    return p, m


def engine_flags(rng: random.Random, world: int) -> tuple:
    """Representative (most), ``--mode full``, or ``--slowdown`` stragglers (full mode)."""
    r = rng.random()
    if world <= 32 and r < 0.06:
        ranks = rng.sample(range(world), min(world, rng.randint(1, 2)))
        return "--slowdown", ",".join(f"{k}={rng.choice((1.1, 1.25, 1.5, 2.0))}" for k in sorted(ranks))
    if world <= 32 and r < 0.10:
        return "--mode", "full"
    if r > 0.97:
        return ("--detail",)
    return ()


def random_case(rng: random.Random) -> tuple[str, str, str | None, dict, tuple, int]:
    """(model, cluster, profile, plan, engine flags, layer-microbatch steps the engine plays)."""
    if rng.random() < 0.22:
        model = rng.choice(sorted(CPU_MODELS))
        shape = CPU_MODELS[model]
        preset, profile = rng.choice(CPU_PROFILES)
        plan, m = random_plan(rng, shape, max_world=8, max_dp=4)
    else:
        model = rng.choice(sorted(GPU_MODELS))
        shape = GPU_MODELS[model]
        preset, profile = rng.choice(GPU_CLUSTERS), None
        if preset == "a100-80g" and rng.random() < 0.1:
            profile = SLOW_LINKS
        plan, m = random_plan(rng, shape, max_world=1024, max_dp=9)
    world = plan["dp"] * plan["tp"] * plan["pp"]
    flags = engine_flags(rng, world)
    devices = plan["dp"] * plan["tp"] if flags[:1] in (("--slowdown",), ("--mode",)) else 1
    steps = shape[0] * m * devices * (2 if "tp_overlap" in plan else 1)
    return model, f"{preset}:{world}", profile, plan, flags, steps


def random_plans(n: int = RANDOM_PLANS, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = []
    while len(out) < 2 * n:
        model, cluster, profile, plan, flags, steps = random_case(rng)
        if steps <= MAX_LAYER_STEPS:
            out += plan_items(model, cluster, plan_string(plan), profile, flags, weight=steps / 300, tag="random")
    # a few invalid plans: the error messages must not change either
    for model, cluster, plan in (("gpt3-1.3b", "a100-80g:8", "dp=4 tp=3 gbs=8"),
                                 ("gpt3-1.3b", "a100-80g:8", "dp=8 gbs=12"),
                                 ("llama3-8b", "h100-sxm:16", "dp=2 tp=8 schedule=interleaved vpp=2 gbs=4"),
                                 ("tiny", "cpu:2", "pp=2 partition=1,1 gbs=4"),
                                 ("tiny", "cpu:2", "dp=2 offload=optimizer gbs=4"),
                                 ("gpt3-125m", "a100-80g:2", "tp=2 tp_overlap=subpipe gbs=2"),
                                 ("gpt3-125m", "a100-80g:4", "pp=4 recompute=stage-aware recompute_layers=9,0,0,0")):
        out += plan_items(model, cluster, plan, tag="invalid")
    return out
