"""Run logs -> what the simulator must reproduce: one ``Observation`` per usable row.

A row of a run log (the columns of ``../shared/validation/public_runs_train.csv``: model
shape, GPUs, tp / pp / dp, ZeRO stage, microbatch, global batch, schedule, recompute,
precision, one measured metric) becomes the run's model, cluster and candidate plans (one,
or several where the log leaves a key its authors tuned open: the fastest that fits is
taken), its stack, and the measured value in SI units. Rows the simulator cannot model are
kept as ``Skipped`` with the reason (context or expert parallelism, FP8, a GPU without a
profile, missing fields, numbers that are not measurements of one run).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pandas as pd

from parsim.costs import eq3_flops, model_flops_per_step
from parsim.specs import ModelSpec, Plan, SpecError, known_profiles, validate, load_cluster
from parsim.specs.stack import AUTO, STACKS, get_stack

from .sources import GPU_PROFILES, SIXTEEN_BIT_GRADS, STACK_BY_ZERO_WORD, SourceFacts, source_facts

# metric word -> (kind, factor to SI)
METRICS = {
    "iteration_time": ("step_time", 1.0), "step_time": ("step_time", 1.0),
    "tokens_per_sec_per_gpu": ("tokens_per_gpu", 1.0),
    "tflops_per_gpu": ("flops_per_gpu", 1e12), "achieved_tflops_per_gpu": ("flops_per_gpu", 1e12),
    "model_tflops_per_gpu": ("flops_per_gpu", 1e12),
    "MFU": ("mfu", 0.01), "pct_of_peak": ("mfu", 0.01), "aggregate_pflops": ("flops_total", 1e15),
    "max_gpu_memory_used": ("memory", 2.0**30), "peak_memory_gib": ("memory", 2.0**30), "oom": ("oom", 1.0),
    "layer_forward_time": ("layer_fwd", 1e-3), "layer_backward_time": ("layer_bwd", 1e-3),
    "layer_fwd_plus_bwd_time": ("layer_fwd_bwd", 1e-3),
}
TIME_KINDS = ("step_time", "tokens_per_gpu", "flops_per_gpu", "mfu", "flops_total", "layer_fwd", "layer_bwd",
              "layer_fwd_bwd")
MBS_SEARCH = (1, 2, 4, 8)


@dataclass(frozen=True)
class Observation:
    """One measured number of one run, and how to simulate the run."""
    row: int                         # 0-based data row of the CSV
    source: str
    group: str                       # what errors are reported by (the source, or a named group)
    kind: str                        # TIME_KINDS, "memory" or "oom"
    value: float                     # SI (s, tokens/s, FLOP/s, fraction, bytes)
    model: ModelSpec
    profile: str
    gpus: int
    stack: str
    plans: tuple[Plan, ...]          # candidates: the fastest that fits is the run's plan
    flops_per_step: float = 0.0      # the source's FLOP count of one step (FLOP-type metrics)
    peak_flops: float = 0.0          # the source's peak FLOP/s (MFU)
    features: dict = field(default_factory=dict)   # seq_len, params, dp, tp_pp (for residual plots)
    network: tuple = ()              # (key, value) pairs replacing the profile's network section

    @property
    def run_key(self) -> tuple:
        return (self.model, self.profile, self.gpus, self.network, self.stack, self.plans)

    @property
    def cluster_key(self) -> tuple:
        return (self.profile, self.gpus, self.network)

    def network_overrides(self) -> dict:
        """``network`` as the profile's ``network`` keys it replaces (``_frozen`` undone)."""
        return {k: dict(v) if isinstance(v, tuple) else v for k, v in self.network}


@dataclass(frozen=True)
class Skipped:
    row: int
    source: str
    metric: str
    reason: str


def read_runs(path: str | Path, group_column: str | None = None) -> tuple[list[Observation], list[Skipped]]:
    """Every row of a run log: an Observation, or Skipped with its reason."""
    try:
        frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError) as e:
        raise SpecError("runs", str(path), f"a readable CSV run log ({e.__class__.__name__})") from None
    missing = [c for c in ("source", "metric", "value", "gpus", "gpu_type") if c not in frame.columns]
    if missing:
        raise SpecError("runs", str(path), f"a CSV with the columns of public_runs_train.csv (missing {missing})")
    if group_column and group_column not in frame.columns:
        raise SpecError("group", group_column, f"a column of {path} ({', '.join(frame.columns)})")
    obs, skipped = [], []
    for i, row in enumerate(frame.to_dict("records")):
        try:
            o = observation(i, row, group_column)
        except _Skip as s:
            skipped.append(Skipped(i, str(row["source"]), str(row["metric"]), str(s)))
            continue
        obs.append(o)
    return obs, skipped


class _Skip(Exception):
    """A row the simulator cannot model (the message says why)."""


def _num(row: dict, key: str) -> float | None:
    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _text(row: dict, key: str) -> str:
    v = row.get(key)
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _note_int(notes: str, key: str) -> int | None:
    m = re.search(rf"\b{key}=(\d+)", notes)
    return int(m.group(1)) if m else None


def observation(i: int, row: dict, group_column: str | None = None) -> Observation:
    source, metric, notes = _text(row, "source"), _text(row, "metric"), _text(row, "notes")
    if metric not in METRICS:
        raise _Skip(f"metric {metric!r} is not a measurement of one run's time, throughput or memory")
    kind, factor = METRICS[metric]
    if "derived by paper" in notes:
        raise _Skip("derived by the source from another row of the same run")
    facts = source_facts(source) or SourceFacts(_text(row, "stack") or AUTO, _text(row, "flop_count") or "model")
    profile = _profile(_text(row, "gpu_type"))
    precision = _text(row, "precision").lower()
    if "fp8" in precision:
        raise _Skip(f"FP8 training ({_text(row, 'precision')}): not modelled")
    for key, what in (("cp", "context parallelism"), ("ep", "expert parallelism")):
        n = _note_int(notes, key)
        if n is not None and n > 1:
            raise _Skip(f"{what} ({key}={n}): not modelled")
    if "MoE" in notes:
        raise _Skip("mixture of experts: not modelled")
    if "precision not stated" in notes and source.startswith("MegatronBridge"):
        raise _Skip("precision not stated; the numbers equal the FP8 table's (725 model TFLOP/s/GPU is 73 % of "
                    "the H100's BF16 peak): taken as FP8, not modelled")
    model = _model(row, facts, notes)
    gpus = _int(row, "gpus")
    stack = _stack(row, facts, notes, profile)
    plans = _plans(row, facts, model, gpus, notes, profile, stack)
    value = _num(row, "value")
    if value is None or value < 0:
        raise _Skip("no value")
    flops, peak = _flop_count(facts, row, model, plans[0], profile, kind)
    features = {"seq_len": model.seq_len, "params": _params(model), "dp": plans[0].dp, "tp_pp": plans[0].tp * plans[0].pp}
    return Observation(i, source, _text(row, group_column) if group_column else source, kind, value * factor,
                       model, profile, gpus, stack, plans, flops, peak, features,
                       tuple((k, _frozen(v)) for k, v in sorted(facts.network.items())))


def _frozen(v):
    """A network value hashable (a dict as its sorted items), for ``Observation.network``."""
    return tuple(sorted(v.items())) if isinstance(v, dict) else v


def _int(row: dict, key: str) -> int:
    v = _num(row, key)
    if v is None or v < 1 or v != int(v):
        raise _Skip(f"missing {key}")
    return int(v)


def _profile(gpu_type: str) -> str:
    for word, name in GPU_PROFILES:
        if word in gpu_type and name in known_profiles():
            return name
    raise _Skip(f"no shipped profile for GPU {gpu_type!r}")


def _model(row: dict, facts: SourceFacts, notes: str) -> ModelSpec:
    layers, hidden, heads, seq = (_num(row, k) for k in ("layers", "hidden", "heads", "seq_len"))
    if None in (layers, hidden, heads, seq):
        raise _Skip("missing model shape (layers, hidden, heads or seq_len)")
    extra = dict(facts.model)
    vocab = extra.pop("vocab", None) or _num(row, "vocab")
    if vocab is None:
        raise _Skip("missing vocab")
    kv = re.search(r"(\d+) (?:KV heads|query groups)", notes)
    ffn = _num(row, "ffn_hidden")
    try:
        return ModelSpec(name=_text(row, "model"), layers=int(layers), hidden=int(hidden), heads=int(heads),
                         kv_heads=int(kv.group(1)) if kv else None, ffn_hidden=int(ffn) if ffn else None,
                         vocab=int(vocab), seq_len=int(seq), **extra)
    except SpecError as e:
        raise _Skip(f"model: {e}") from None


def _stack(row: dict, facts: SourceFacts, notes: str, profile: str) -> str:
    stack = _text(row, "stack") or facts.stack
    for word, name in STACK_BY_ZERO_WORD.items():
        if word in notes:
            stack = name
    if stack == AUTO:                   # not stated: the stack the GPU's shipped profile defaults to
        stack = _cluster(profile, 1).device.default_stack
    if stack not in STACKS:
        raise SpecError("stack", stack, f"one of {', '.join(STACKS)} (the log's stack column)")
    return stack


def _zero(word: str) -> int:
    if not word:
        return 0
    if word[0].isdigit():
        return int(word[0])
    if "shard optimizer+grads" in word or "SHARD_GRAD_OP" in word:
        return 2
    return 3 if "FSDP" in word else 0


def _plans(row: dict, facts: SourceFacts, model: ModelSpec, gpus: int, notes: str, profile: str,
           stack: str) -> tuple[Plan, ...]:
    base = dict(facts.plan)
    tp, pp = _num(row, "tp"), _num(row, "pp")
    mp = re.search(r"model-parallel size \(t\*p\)=(\d+)", notes)
    if (tp is None or pp is None) and mp:
        size = int(mp.group(1))              # the paper's rule: t = 8 inside a node, the rest pipeline
        tp, pp = (min(8, size), max(1, size // 8)) if size > 1 else (1, 1)
    if tp is None or pp is None:
        raise _Skip("missing tp / pp")
    tp, pp = int(tp), int(pp)
    if gpus % (tp * pp):
        raise _Skip(f"gpus={gpus} not divisible by tp*pp={tp * pp}")
    dp = gpus // (tp * pp)
    gbs = _num(row, "global_batch")
    if gbs is None and METRICS[_text(row, "metric")][0].startswith("layer_"):
        gbs = dp * (_num(row, "microbatch") or base.get("mbs", 1))     # one layer: the batch is one microbatch
    if gbs is None:
        raise _Skip("missing global_batch")
    base.update(dp=dp, tp=tp, pp=pp, gbs=int(gbs), zero=_zero(_text(row, "zero_stage")))
    marker = SIXTEEN_BIT_GRADS.get(_text(row, "source"))
    if marker and marker not in notes:
        base["dtype"] = "fp16"
    rc = _text(row, "recompute").lower()
    if rc.startswith(("full", "selective", "none")):
        base["recompute"] = rc.split()[0]
    sp = _text(row, "sequence_parallel").lower()
    if sp in ("yes", "true"):
        base["sp"] = True
    elif sp in ("no", "false"):
        base["sp"] = False
    mbs = _num(row, "microbatch")
    mbs_choices = [int(mbs)] if mbs else ([base.pop("mbs")] if "mbs" in base else list(MBS_SEARCH))
    sched = _text(row, "schedule").lower()
    vp = re.search(r"vp=(\d+)", sched)
    plans = []
    for b in mbs_choices:
        if base["gbs"] % (dp * b):
            continue
        for vpp in ([int(vp.group(1))] if vp else _vpps(model, pp, sched, facts, stack)):
            schedule = "interleaved" if vpp > 1 else base.get("schedule", "1f1b")
            plan = Plan(**{**base, "mbs": b, "vpp": vpp, "schedule": schedule})
            try:
                validate(model, _cluster(profile, gpus), plan)
            except SpecError:
                continue
            plans.append(plan)
    if not plans:
        raise _Skip("no valid plan for the logged tp / pp / dp / batch")
    return tuple(plans)


@lru_cache(maxsize=None)
def _cluster(profile: str, gpus: int):
    return load_cluster(f"{profile}:{gpus}")


MAX_VPP = 8           # interleaving depths a tuned schedule is searched up to


def _vpps(model: ModelSpec, pp: int, sched: str, facts: SourceFacts, stack: str) -> list[int]:
    """Interleaving depths to try: the logged one, else (if the source tuned the schedule)
    every vpp up to ``MAX_VPP`` the stack accepts: equal layers per virtual stage, or any split
    with a layer per virtual stage where its pipeline takes unequal ones (``Stack.uneven_stages``)."""
    if pp == 1 or "schedule" not in facts.search or sched:
        return [1]
    uneven = get_stack(stack).uneven_stages
    return [v for v in range(1, MAX_VPP + 1)
            if (pp * v <= model.layers if uneven else model.layers % (pp * v) == 0)] or [1]


def _params(model: ModelSpec) -> float:
    from parsim.costs import total_params
    return total_params(model)


def _flop_count(facts: SourceFacts, row: dict, model: ModelSpec, plan: Plan, profile: str,
                kind: str) -> tuple[float, float]:
    """The source's FLOPs per step and its peak FLOP/s (for TFLOP/s- and MFU-type metrics)."""
    if kind not in ("flops_per_gpu", "mfu", "flops_total"):
        return 0.0, 0.0
    if facts.flops == "eq3-recompute":
        flops = eq3_flops(model, plan.gbs, full_recompute=True)
    elif facts.flops == "6n-attention":
        n = _num(row, "params_b")
        if n is None:
            raise _Skip("6N count needs params_b")
        flops = plan.gbs * model.seq_len * (6.0 * n * 1e9 + 12.0 * model.layers * model.hidden * model.seq_len)
    else:
        flops = model_flops_per_step(model, plan.gbs)
    peak = _cluster(profile, 1).device.flops(plan.dtype)
    return flops, peak


def published_from_step(o: Observation, step_s: float) -> float:
    """The number the source would have printed for a step of ``step_s`` seconds (SI)."""
    if o.kind == "step_time":
        return step_s
    if o.kind == "tokens_per_gpu":
        return o.plans[0].gbs * o.model.seq_len / (step_s * o.gpus)
    if o.kind == "flops_per_gpu":
        return o.flops_per_step / (step_s * o.gpus)
    if o.kind == "flops_total":
        return o.flops_per_step / step_s
    if o.kind == "mfu":
        return o.flops_per_step / (step_s * o.gpus * o.peak_flops)
    raise ValueError(o.kind)


def time_like(o: Observation) -> bool:
    return o.kind in TIME_KINDS
