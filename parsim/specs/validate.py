"""Every rule a Plan must satisfy against a model and a cluster, in one place.

``validate`` raises SpecError (field, value, what is allowed) for the first broken rule and
returns the list of warnings for legal but questionable choices.
"""
from __future__ import annotations

from .cluster import ClusterSpec
from .errors import SpecError
from .model import ModelSpec
from .plan import Plan


def validate(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> list[str]:
    warnings: list[str] = []
    n = cluster.num_devices
    if plan.world_size != n:
        raise SpecError("dp*tp*pp", f"{plan.dp}*{plan.tp}*{plan.pp}={plan.world_size}",
                        f"must equal the cluster's device count {n}")
    for name, size in (("heads", model.heads), ("kv_heads", model.kv_heads), ("ffn_hidden", model.ffn_hidden)):
        if size % plan.tp:
            raise SpecError("tp", plan.tp, f"must divide model {name}={size}")
    stages = plan.pp * plan.vpp
    if stages > model.layers:
        raise SpecError("pp*vpp", stages, f"must not exceed the model's {model.layers} layers")
    if plan.partition is not None:
        if len(plan.partition) != stages:
            raise SpecError("partition", ",".join(map(str, plan.partition)),
                            f"needs one entry per virtual stage: pp*vpp={stages} entries")
        if sum(plan.partition) != model.layers:
            raise SpecError("partition", ",".join(map(str, plan.partition)),
                            f"must sum to the model's {model.layers} layers (sums to {sum(plan.partition)})")
    if plan.gbs % (plan.dp * plan.mbs):
        raise SpecError("gbs", plan.gbs, f"must be divisible by dp*mbs={plan.dp * plan.mbs}")
    m = plan.num_microbatches
    if plan.schedule == "interleaved":
        if plan.vpp < 2:
            raise SpecError("vpp", plan.vpp, "interleaved schedule needs vpp >= 2")
        if plan.pp < 2:
            raise SpecError("pp", plan.pp, "interleaved schedule needs pp >= 2")
        if m % plan.pp:
            raise SpecError("gbs", plan.gbs, f"interleaved schedule needs microbatches (gbs/(dp*mbs)={m}) divisible by pp={plan.pp}")
    elif plan.vpp != 1:
        raise SpecError("vpp", plan.vpp, f"vpp > 1 needs schedule=interleaved (schedule is {plan.schedule})")
    if plan.sp:
        if plan.tp < 2:
            raise SpecError("sp", "true", "sequence parallel needs tp > 1")
        if model.seq_len % plan.tp:
            raise SpecError("sp", "true", f"sequence parallel needs seq_len={model.seq_len} divisible by tp={plan.tp}")
    if plan.offload == "optimizer" and plan.zero < 1:
        raise SpecError("offload", plan.offload, "optimizer offload needs zero >= 1 (ZeRO-Offload shards the optimizer)")
    if plan.offload == "optimizer+params" and plan.zero != 3:
        raise SpecError("offload", plan.offload, "parameter offload needs zero=3 (ZeRO-Infinity)")
    if plan.recompute_layers is not None:
        if len(plan.recompute_layers) != stages:
            raise SpecError("recompute_layers", ",".join(map(str, plan.recompute_layers)),
                            f"needs one entry per virtual stage: pp*vpp={stages} entries")
        per_stage = stage_layers(model, plan)
        for s, (r, l) in enumerate(zip(plan.recompute_layers, per_stage)):
            if r > l:
                raise SpecError("recompute_layers", ",".join(map(str, plan.recompute_layers)),
                                f"stage {s} has {l} layers; it cannot recompute {r}")
    if plan.tp_overlap == "subpipe" and plan.tp < 2:
        raise SpecError("tp_overlap", plan.tp_overlap, "sub-pipelined TP needs tp > 1")
    if plan.tp_overlap == "subpipe" and plan.mbs < 2:
        raise SpecError("tp_overlap", plan.tp_overlap, "sub-pipelined TP splits a microbatch in two: needs mbs >= 2")
    if plan.zero >= 2 and plan.pp > 1:
        warnings.append(f"zero={plan.zero} with pp={plan.pp}: gradient sharding fights gradient accumulation across "
                        "microbatches (DeepSpeed disallows ZeRO-2/3 with pipeline parallelism); expect extra communication")
    if plan.tp > cluster.devices_per_node:
        warnings.append(f"tp={plan.tp} spans more than one node ({cluster.devices_per_node} devices per node): "
                        "TP collectives will cross the inter-node network")
    return warnings


def stage_layers(model: ModelSpec, plan: Plan) -> list[int]:
    """Transformer layers held by each virtual stage (explicit partition, or balanced:
    the remainder goes to the middle stages, since the first and last stages also hold the
    embedding and the output layer)."""
    stages = plan.pp * plan.vpp
    if plan.partition is not None:
        return list(plan.partition)
    base, rem = divmod(model.layers, stages)
    counts = [base] * stages
    # give extra layers to the stages farthest from both ends (they carry no embedding/logits)
    order = sorted(range(stages), key=lambda s: -min(s, stages - 1 - s))
    for s in order[:rem]:
        counts[s] += 1
    return counts
