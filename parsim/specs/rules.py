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
from .codes import INTERLEAVED, OFF_OPT, OFF_OPT_PARAMS, SUBPIPE, WORDS, code
from .errors import SpecError
from .layout import stage_layers
from .model import ModelSpec
from .plan import Plan

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

    def __getattr__(self, key: str):
        value = getattr(self._plan, key)
        return code(key, value) if key in WORDS else value


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
         lambda plan, model, cluster: f"vpp > 1 needs schedule=interleaved (schedule is {plan.schedule})",
         applies=lambda p, model, cluster: p.schedule != INTERLEAVED),
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

ADVICE: tuple[Advice, ...] = (
    Advice(lambda p, model, cluster: (p.zero >= 2) & (p.pp > 1),
           lambda plan, cluster: (f"zero={plan.zero} with pp={plan.pp}: gradient sharding fights gradient accumulation "
                                  "across microbatches (DeepSpeed disallows ZeRO-2/3 with pipeline parallelism); "
                                  "expect extra communication")),
    Advice(lambda p, model, cluster: p.tp > cluster.devices_per_node,
           lambda plan, cluster: (f"tp={plan.tp} spans more than one node ({cluster.devices_per_node} devices per "
                                  "node): TP collectives will cross the inter-node network")),
)
