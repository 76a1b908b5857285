"""Every rule a Plan must satisfy against a model and a cluster: one table, read two ways.

A ``Rule`` names the plan fields it reads, where it applies, the condition that must hold
there, and the SpecError (field, value, what is allowed) raised when it does not. Conditions
are written once, over a view of the plan whose words are their integer codes (``codes.py``),
and use only arithmetic, comparisons, ``&`` and ``|``, so the same expression evaluates on one
plan (Python ints: ``validate``) and element-wise on numpy arrays of many plans (``plan_mask``:
the fast path's vectorised filter, ``parsim.fast.plans.valid_mask``). Rules on list-valued
fields (``partition``, ``recompute_layers``) apply only where the list is given; a table of
plans has none, so there they never apply.

``ADVICE`` lists the legal but questionable choices ``validate`` warns about.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .cluster import ClusterSpec
from .codes import (CSV, DUALPIPEV, INTERLEAVED, INTERLEAVED_ZB, LOOPED_BFS, OFF_OPT, OFF_OPT_PARAMS, SUBPIPE, WORDS,
                    ZBV, code)
from .errors import SpecError
from .layout import stage_layers
from .model import ModelSpec
from .plan import Plan
from .schedule_file import schedule_shape

# (plan view, model, cluster) -> bool, or a boolean array over a table of plans
Condition = Callable[[Any, ModelSpec, ClusterSpec], Any]


def _everywhere(p, model: ModelSpec, cluster: ClusterSpec) -> bool:
    return True


@dataclass(frozen=True)
class Rule:
    field: str                                           # the field the SpecError names
    reads: tuple[str, ...]                               # the plan fields ``applies`` and ``holds`` read
    holds: Condition                                     # true where the plan obeys the rule
    value: Callable[[Plan], object]                      # the value the SpecError shows
    allowed: Callable[[Plan, ModelSpec, ClusterSpec], str]   # what is allowed, in words
    applies: Condition = _everywhere                     # the rule binds only where this is true

    def error(self, plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> SpecError:
        return SpecError(self.field, self.value(plan), self.allowed(plan, model, cluster))


@dataclass(frozen=True)
class Advice:
    applies: Condition
    message: Callable[[Plan, ClusterSpec], str]


class PlanView:
    """One plan as the rules read it: words as their codes, every other field as it is."""

    def __init__(self, plan: Plan):
        self._plan = plan
        if type(plan) is Plan:
            # a Plan's fields are its instance attributes: all but the words are read as they are
            self.__dict__.update(plan.__dict__)
            for key in WORDS:
                del self.__dict__[key]

    def __getattr__(self, key: str):
        value = getattr(self._plan, key)
        value = code(key, value) if key in WORDS else value
        self.__dict__[key] = value       # the rules read a field many times: later reads skip this
        return value


def _joined(values) -> str:
    return ",".join(map(str, values))


def _microbatches(p):
    return p.gbs // (p.dp * p.mbs)


def _divides_tp(name: str) -> Rule:
    return Rule("tp", ("tp",), lambda p, model, cluster: getattr(model, name) % p.tp == 0,
                lambda plan: plan.tp, lambda plan, model, cluster: f"must divide model {name}={getattr(model, name)}")


def _first_overfull_stage(plan: Plan, model: ModelSpec) -> tuple[int, int, int] | None:
    """(stage, recomputed, layers) of the first stage asked to recompute more layers than it holds."""
    for s, (r, n) in enumerate(zip(plan.recompute_layers, stage_layers(model, plan))):
        if r > n:
            return s, r, n
    return None


def _interleaved(p, model, cluster):
    return p.schedule == INTERLEAVED


def _is(*codes: int) -> Condition:
    def applies(p, model, cluster):
        out = p.schedule == codes[0]
        for c in codes[1:]:
            out = out | (p.schedule == c)
        return out
    return applies


_MULTI_CHUNK = _is(INTERLEAVED, INTERLEAVED_ZB, LOOPED_BFS, ZBV, DUALPIPEV, CSV)


def _single_chunk(p, model, cluster):
    """Schedules with one stage per rank (vpp = 1): all but the looping and V-placed ones."""
    multi = _MULTI_CHUNK(p, model, cluster)
    return (not multi) if isinstance(multi, bool) else ~multi


def _rounds(p):
    """torch 2.13's interleaved zero-bubble rounds, max(1, m // pp), written with arithmetic only."""
    m = _microbatches(p)
    return m // p.pp + (m < p.pp)


def _csv(p, model, cluster):
    """A ``schedule=csv:FILE`` plan. A table of plans holds only generated schedules (their codes),
    so on columns this is a plain False and the file rules are never evaluated there."""
    return isinstance(p.schedule, int) and p.schedule == CSV


def _shape(plan: Plan):
    return schedule_shape(plan.schedule_file)


def _given(name: str) -> Condition:
    return lambda p, model, cluster: getattr(p, name) is not None


def _per_stage_entries(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> str:
    return f"needs one entry per virtual stage: pp*vpp={plan.pp * plan.vpp} entries"


def _overfull_message(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> str:
    s, r, n = _first_overfull_stage(plan, model)
    return f"stage {s} has {n} layers; it cannot recompute {r}"


# In the order ``validate`` checks them: the first broken rule is the error a user sees.
RULES: tuple[Rule, ...] = (
    Rule("dp*tp*pp", ("dp", "tp", "pp"), lambda p, model, cluster: p.dp * p.tp * p.pp == cluster.num_devices,
         lambda plan: f"{plan.dp}*{plan.tp}*{plan.pp}={plan.world_size}",
         lambda plan, model, cluster: f"must equal the cluster's device count {cluster.num_devices}"),
    _divides_tp("heads"), _divides_tp("kv_heads"), _divides_tp("ffn_hidden"),
    Rule("pp*vpp", ("pp", "vpp"), lambda p, model, cluster: p.pp * p.vpp <= model.layers,
         lambda plan: plan.pp * plan.vpp,
         lambda plan, model, cluster: f"must not exceed the model's {model.layers} layers"),
    Rule("partition", ("partition", "pp", "vpp"), lambda p, model, cluster: len(p.partition) == p.pp * p.vpp,
         lambda plan: _joined(plan.partition), _per_stage_entries, applies=_given("partition")),
    Rule("partition", ("partition",), lambda p, model, cluster: sum(p.partition) == model.layers,
         lambda plan: _joined(plan.partition),
         lambda plan, model, cluster: f"must sum to the model's {model.layers} layers (sums to {sum(plan.partition)})",
         applies=_given("partition")),
    Rule("gbs", ("gbs", "dp", "mbs"), lambda p, model, cluster: p.gbs % (p.dp * p.mbs) == 0,
         lambda plan: plan.gbs, lambda plan, model, cluster: f"must be divisible by dp*mbs={plan.dp * plan.mbs}"),
    Rule("vpp", ("schedule", "vpp"), lambda p, model, cluster: p.vpp >= 2, lambda plan: plan.vpp,
         lambda plan, model, cluster: "interleaved schedule needs vpp >= 2", applies=_interleaved),
    Rule("pp", ("schedule", "pp"), lambda p, model, cluster: p.pp >= 2, lambda plan: plan.pp,
         lambda plan, model, cluster: "interleaved schedule needs pp >= 2", applies=_interleaved),
    Rule("gbs", ("schedule", "gbs", "dp", "mbs", "pp"), lambda p, model, cluster: _microbatches(p) % p.pp == 0,
         lambda plan: plan.gbs,
         lambda plan, model, cluster: (f"interleaved schedule needs microbatches (gbs/(dp*mbs)={_microbatches(plan)}) "
                                       f"divisible by pp={plan.pp}"),
         applies=_interleaved),
    Rule("vpp", ("schedule", "vpp"), lambda p, model, cluster: p.vpp == 1, lambda plan: plan.vpp,
         lambda plan, model, cluster: ("vpp > 1 needs schedule=interleaved, interleaved-zb, looped-bfs, zbv or "
                                       f"dualpipev (schedule is {plan.schedule})"),
         applies=_single_chunk),
    # torch 2.13 ScheduleInterleavedZeroBubble: several stages per rank (vpp >= 2), microbatches
    # in max(1, m // pp) rounds of equal size
    Rule("vpp", ("schedule", "vpp"), lambda p, model, cluster: p.vpp >= 2, lambda plan: plan.vpp,
         lambda plan, model, cluster: "interleaved-zb schedule needs vpp >= 2", applies=_is(INTERLEAVED_ZB)),
    Rule("gbs", ("schedule", "gbs", "dp", "mbs", "pp"), lambda p, model, cluster: _microbatches(p) % _rounds(p) == 0,
         lambda plan: plan.gbs,
         lambda plan, model, cluster: (f"interleaved-zb runs microbatches (gbs/(dp*mbs)={_microbatches(plan)}) in "
                                       f"max(1, m // pp)={_rounds(plan)} rounds of equal size: needs a multiple "
                                       f"of {_rounds(plan)}"),
         applies=_is(INTERLEAVED_ZB)),
    # ZBV and DualPipeV place two stages per rank in a V (Qi et al. 2023 Sec 6; DeepSeek-AI 2024)
    Rule("vpp", ("schedule", "vpp"), lambda p, model, cluster: p.vpp == 2, lambda plan: plan.vpp,
         lambda plan, model, cluster: f"{plan.schedule} places two stages per rank in a V: needs vpp=2",
         applies=_is(ZBV, DUALPIPEV)),
    # torch 2.13 ScheduleDualPipeV: at least as many microbatches as stages
    Rule("gbs", ("schedule", "gbs", "dp", "mbs", "pp"), lambda p, model, cluster: _microbatches(p) >= 2 * p.pp,
         lambda plan: plan.gbs,
         lambda plan, model, cluster: (f"dualpipev needs microbatches (gbs/(dp*mbs)={_microbatches(plan)}) >= "
                                       f"2*pp={2 * plan.pp}"),
         applies=_is(DUALPIPEV)),
    # schedule=csv:FILE: the file's rows, stages and microbatches must be the plan's
    Rule("pp", ("schedule", "pp"), lambda p, model, cluster: _shape(p).rows == p.pp, lambda plan: plan.pp,
         lambda plan, model, cluster: f"must equal the {_shape(plan).rows} rows (pipeline ranks) of {plan.schedule_file}",
         applies=_csv),
    Rule("vpp", ("schedule", "pp", "vpp"), lambda p, model, cluster: _shape(p).stages == p.pp * p.vpp,
         lambda plan: plan.vpp,
         lambda plan, model, cluster: (f"{plan.schedule_file} uses {_shape(plan).stages} stages: needs "
                                       f"pp*vpp={_shape(plan).stages}"),
         applies=_csv),
    Rule("gbs", ("schedule", "gbs", "dp", "mbs"), lambda p, model, cluster: _shape(p).microbatches == _microbatches(p),
         lambda plan: plan.gbs,
         lambda plan, model, cluster: (f"{plan.schedule_file} runs {_shape(plan).microbatches} microbatches: needs "
                                       f"gbs/(dp*mbs)={_shape(plan).microbatches} (gbs="
                                       f"{_shape(plan).microbatches * plan.dp * plan.mbs})"),
         applies=_csv),
    Rule("sp", ("sp", "tp"), lambda p, model, cluster: p.tp >= 2, lambda plan: "true",
         lambda plan, model, cluster: "sequence parallel needs tp > 1", applies=lambda p, model, cluster: p.sp != 0),
    Rule("sp", ("sp", "tp"), lambda p, model, cluster: model.seq_len % p.tp == 0, lambda plan: "true",
         lambda plan, model, cluster: f"sequence parallel needs seq_len={model.seq_len} divisible by tp={plan.tp}",
         applies=lambda p, model, cluster: p.sp != 0),
    Rule("offload", ("offload", "zero"), lambda p, model, cluster: p.zero >= 1, lambda plan: plan.offload,
         lambda plan, model, cluster: "optimizer offload needs zero >= 1 (ZeRO-Offload shards the optimizer)",
         applies=lambda p, model, cluster: p.offload == OFF_OPT),
    Rule("offload", ("offload", "zero"), lambda p, model, cluster: p.zero == 3, lambda plan: plan.offload,
         lambda plan, model, cluster: "parameter offload needs zero=3 (ZeRO-Infinity)",
         applies=lambda p, model, cluster: p.offload == OFF_OPT_PARAMS),
    Rule("recompute_layers", ("recompute_layers", "pp", "vpp"),
         lambda p, model, cluster: len(p.recompute_layers) == p.pp * p.vpp,
         lambda plan: _joined(plan.recompute_layers), _per_stage_entries, applies=_given("recompute_layers")),
    Rule("recompute_layers", ("recompute_layers", "pp", "vpp", "partition"),
         lambda p, model, cluster: _first_overfull_stage(p, model) is None,
         lambda plan: _joined(plan.recompute_layers), _overfull_message, applies=_given("recompute_layers")),
    Rule("tp_overlap", ("tp_overlap", "tp"), lambda p, model, cluster: p.tp >= 2, lambda plan: plan.tp_overlap,
         lambda plan, model, cluster: "sub-pipelined TP needs tp > 1",
         applies=lambda p, model, cluster: p.tp_overlap == SUBPIPE),
    Rule("tp_overlap", ("tp_overlap", "mbs"), lambda p, model, cluster: p.mbs >= 2, lambda plan: plan.tp_overlap,
         lambda plan, model, cluster: "sub-pipelined TP splits a microbatch in two: needs mbs >= 2",
         applies=lambda p, model, cluster: p.tp_overlap == SUBPIPE),
)

# ``RULES`` as ``validate`` walks them: (where the rule applies, None for everywhere; its condition; the rule)
CHECKS = tuple((None if rule.applies is _everywhere else rule.applies, rule.holds, rule) for rule in RULES)

ADVICE: tuple[Advice, ...] = (
    Advice(lambda p, model, cluster: (p.zero >= 2) & (p.pp > 1),
           lambda plan, cluster: (f"zero={plan.zero} with pp={plan.pp}: gradient sharding fights gradient accumulation "
                                  "across microbatches (DeepSpeed disallows ZeRO-2/3 with pipeline parallelism); "
                                  "expect extra communication")),
    Advice(lambda p, model, cluster: p.tp > cluster.devices_per_node,
           lambda plan, cluster: (f"tp={plan.tp} spans more than one node ({cluster.devices_per_node} devices per "
                                  "node): TP collectives will cross the inter-node network")),
)
