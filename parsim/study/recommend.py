"""``recommend``: the best plans of a sweep, with the reasons in plain words.

It reads the ranked sweep and says, for each recommended plan, where the time goes (bubble,
exposed TP / DP / PP communication) and how much memory is left; how the plan relates to the
rules of thumb practitioners use (Hugging Face Transformers docs, "Efficient training on
multiple GPUs"; Narayanan et al. 2021 Sec. 3.3 takeaways; Rajbhandari et al. 2020/2021):

* one device: plain training if it fits, else ZeRO-Offload (optimizer, then parameters, to host)
* one node: DDP if the model fits one device, else ZeRO (or TP/PP inside the node)
* a layer too big for one device: TP (or ZeRO-3)
* several nodes, fast links: ZeRO-3, or PP + TP + DP
* several nodes, slow links: TP inside a node, PP across nodes, DP with ZeRO-1

When nothing fits, it says how much less memory the smallest plan needs and which levers
(priced with ``costs.memory_by_stage``) would get there.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from parsim.costs import device_capacity, layer_params, memory_by_stage, state_bytes
from parsim.costs.links import nic_share
from parsim.specs import ClusterSpec, ModelSpec, SpecError, parse_plan, validate

from .schedule_advice import layout_verdicts, schedule_summary
from .sweep import SweepResult

GIB = 2.0 ** 30
MS = 1e3
# Inter-node links count as "slow" below this fraction of the intra-node bandwidth per
# device (a heuristic: at 1/20, a DP all-reduce across nodes costs >= 20x the same inside
# a node; DGX A100 / H100 with one NIC per GPU sit at ~1/10, single-NIC nodes at ~1/150).
SLOW_LINK_RATIO = 1.0 / 20.0


@dataclass
class Regime:
    """Which rule of thumb applies to this model on this cluster."""
    name: str            # single-device | single-node | multi-node-fast | multi-node-slow
    description: str
    rule: str            # what the rule of thumb says to do
    model_fits_one_device: bool
    layer_fits_one_device: bool


@dataclass
class Advice:
    rank: int
    plan: str
    metrics: dict
    reasons: list[str] = field(default_factory=list)


@dataclass
class Recommendation:
    model: str
    cluster: str
    num_devices: int
    num_plans: int
    num_fit: int
    regime: Regime
    plans: list[Advice]
    rule_check: str                    # does the sweep's best plan follow the rule?
    memory_advice: list[str]           # when nothing fits: how to make it fit
    schedule_advice: list[str] = field(default_factory=list)   # each schedule vs 1F1B: where it wins, loses

    def to_dict(self) -> dict:
        return {
            "model": self.model, "cluster": self.cluster, "num_devices": self.num_devices,
            "num_plans": self.num_plans, "num_fit": self.num_fit,
            "regime": self.regime.__dict__, "rule_check": self.rule_check, "memory_advice": self.memory_advice,
            "schedule_advice": self.schedule_advice,
            "plans": [{"rank": a.rank, "plan": a.plan, "reasons": a.reasons, **a.metrics} for a in self.plans],
        }


def inter_node_ratio(cluster: ClusterSpec) -> float:
    return nic_share(cluster) / cluster.network.intra_node.bandwidth


def model_state_bytes_one_device(model: ModelSpec, dtype: str = "bf16") -> float:
    """Parameters + gradients + Adam states of the whole model on one device (no sharding)."""
    from parsim.costs import total_params
    sb = state_bytes(dtype)
    return total_params(model) * (sb.param + sb.grad + sb.optimizer)


def classify(model: ModelSpec, cluster: ClusterSpec, headroom: float) -> Regime:
    cap = device_capacity(cluster) * (1.0 - headroom)
    fits_one = model_state_bytes_one_device(model) <= cap
    sb = state_bytes("bf16")
    layer_fits = layer_params(model, 1) * (sb.param + sb.grad + sb.optimizer) <= cap
    n, dpn = cluster.num_devices, cluster.devices_per_node
    if n == 1:
        return Regime("single-device", "one device",
                      "plain training if the model fits, else ZeRO-Offload (optimizer, then parameters, to the host) "
                      "with recomputation", fits_one, layer_fits)
    if n <= dpn:
        return Regime("single-node", f"one node of {n} devices",
                      "DDP if the model fits one device, else ZeRO (or TP/PP inside the node)", fits_one, layer_fits)
    ratio = inter_node_ratio(cluster)
    if ratio >= SLOW_LINK_RATIO:
        return Regime("multi-node-fast", f"{cluster.num_nodes} nodes, fast inter-node links "
                      f"({ratio:.2f} of intra-node bandwidth per device)",
                      "ZeRO (ZeRO-3 if states do not fit) or PP + TP + DP", fits_one, layer_fits)
    return Regime("multi-node-slow", f"{cluster.num_nodes} nodes, slow inter-node links "
                  f"({ratio:.3f} of intra-node bandwidth per device)",
                  "TP inside a node, PP across nodes, DP with ZeRO-1", fits_one, layer_fits)


def follows_rule(regime: Regime, row: dict, devices_per_node: int) -> bool:
    """Whether a plan is of the kind the regime's rule of thumb recommends."""
    dp, tp, pp, zero, offload = row["dp"], row["tp"], row["pp"], row["zero"], row["offload"]
    if regime.name == "single-device":
        return offload == "none" if regime.model_fits_one_device else offload != "none"
    if regime.name == "single-node":
        if regime.model_fits_one_device:
            return tp == 1 and pp == 1                    # DDP or ZeRO: pure data parallel
        return (tp == 1 and pp == 1 and zero >= 1) or tp > 1 or pp > 1
    if regime.name == "multi-node-fast":
        # ZeRO data parallelism (with TP inside a node or not), or the 3-D PP + TP + DP
        return (pp == 1 and zero >= 1 and tp <= devices_per_node) or (tp > 1 and pp > 1 and dp > 1)
    return tp <= devices_per_node and zero <= 1 and (pp > 1 or tp > 1)


def plan_reasons(row: dict, frame: pd.DataFrame, capacity: float) -> list[str]:
    step = row["step_time_s"]
    out = [f"{row['tokens_per_s']:,.0f} tokens/s, step {step * MS:,.1f} ms, MFU {row['mfu'] * 100:.1f}% "
           f"(numbers from the {'SimPy engine' if row['source'] == 'sim' else 'fast path'})"]
    m, pp = row["microbatches"], row["pp"]
    if pp > 1:
        out.append(f"pipeline bubble {row['bubble_fraction'] * 100:.1f}% of the step: {pp} stages, {m} microbatches "
                   f"per step, schedule {row['schedule']}" + (f" with {row['vpp']} chunks per rank" if row["vpp"] > 1 else ""))
    else:
        out.append("no pipeline, so no bubble")
    parts = [f"{name} {row[f'exposed_{k}_s'] * MS:,.1f} ms" for k, name in (("tp", "TP"), ("dp", "DP"), ("pp", "PP"))
             if row[f"exposed_{k}_s"] > 0]
    total = sum(row[f"exposed_{k}_s"] for k in ("tp", "dp", "pp"))
    out.append(f"exposed communication {', '.join(parts)} ({total / step * 100:.1f}% of the step)" if parts
               else "no communication on the critical path")
    out.append(f"peak memory {row['peak_memory_bytes'] / GIB:.1f} GiB of {row['memory_limit_bytes'] / GIB:.1f} GiB "
               f"allowed per device ({row['memory_headroom'] * 100:.0f}% of the {capacity / GIB:.1f} GiB usable is free)")
    out += _counterfactuals(row, frame)
    if pp > 1:
        others = layout_verdicts(row, frame)
        if others:
            out.append("other schedules at this layout: " + "; ".join(others))
    return out


# (key, simpler value, what the key buys)
_LEVERS = (("zero", 0, "ZeRO-{v} shards {g} over the {dp} DP ranks"),
           ("recompute", "none", "recompute={v} trades compute for activation memory"),
           ("offload", "none", "offload={v} moves states to host memory"),
           ("sp", False, "sequence parallel splits the norm/dropout activations over TP"))


def _counterfactuals(row: dict, frame: pd.DataFrame) -> list[str]:
    """What each non-default choice buys, read off the sweep: the same plan without it."""
    out = []
    keys = ["dp", "tp", "pp", "vpp", "mbs", "gbs", "schedule", "zero", "offload", "recompute", "sp", "dtype", "dp_impl"]
    for key, simple, words in _LEVERS:
        if row[key] == simple:
            continue
        alt = {**{k: row[k] for k in keys}, key: simple}
        if key == "zero":
            alt["offload"] = "none"
        match = frame
        for k in keys:
            match = match[match[k] == alt[k]]
        sharded = ("optimizer states", "optimizer states and gradients",
                   "optimizer states, gradients and parameters")[max(row["zero"], 1) - 1]
        what = words.format(v=row[key], dp=row["dp"], g=sharded)
        if match.empty:
            out.append(f"{what} (required by the plan's other choices)")
            continue
        other = match.iloc[0]
        if not other["fits"]:
            out.append(f"{what}: without it the plan needs {other['peak_memory_bytes'] / GIB:.1f} GiB and does not fit")
        else:
            delta = row["tokens_per_s"] / other["tokens_per_s"] - 1.0
            out.append(f"{what}: {abs(delta) * 100:.1f}% {'faster' if delta >= 0 else 'slower'} than without it")
    return out


def memory_advice(model: ModelSpec, cluster: ClusterSpec, frame: pd.DataFrame, headroom: float) -> list[str]:
    """Nothing fits: how far the smallest plan is, and which levers would close the gap."""
    allowed = device_capacity(cluster) * (1.0 - headroom)
    smallest = frame.loc[frame["peak_memory_bytes"].idxmin()]
    factor = smallest["peak_memory_bytes"] / allowed
    plan = parse_plan(smallest["plan"])
    out = [f"nothing fits: the smallest plan ({smallest['plan']}) needs {smallest['peak_memory_bytes'] / GIB:.1f} GiB "
           f"of {allowed / GIB:.1f} GiB allowed, {factor:.1f}x less memory is needed"]
    tries = []
    candidates = [dict(zero=3), dict(recompute="full"), dict(zero=3, offload="optimizer+params"),
                  dict(zero=max(1, plan.zero), offload="optimizer"), dict(mbs=1), dict(zero=3, recompute="full")]
    if plan.tp > 1:
        candidates.append(dict(sp=True))
    for change in candidates:
        if all(getattr(plan, k) == v for k, v in change.items()):
            continue
        alt = plan.replace(**change)
        try:
            validate(model, cluster, alt)
        except SpecError:
            continue
        peak = max(s.total for s in memory_by_stage(model, alt, cluster))
        words = " ".join(f"{k}={str(v).lower()}" for k, v in change.items())
        tries.append((peak, f"try {words}: {peak / GIB:.1f} GiB ({'fits' if peak <= allowed else 'still too big'})"))
    tries.sort()
    out += [t for _, t in tries[:3]]
    if not tries or tries[0][0] > allowed:
        out.append(f"or add devices: ZeRO-3 shards model states over DP, so about {factor:.1f}x the devices; "
                   f"or shorten sequences / lower gbs")
    return out


def recommend(model: ModelSpec, cluster: ClusterSpec, result: SweepResult, top: int = 3) -> Recommendation:
    frame = result.frame
    cap = result.capacity_bytes
    regime = classify(model, cluster, result.headroom)
    rows = result.rows(top) if result.num_fit else []
    advice = [Advice(r["rank"], r["plan"], _metrics(r), plan_reasons(r, frame, cap)) for r in rows if r["fits"]]
    if advice:
        best = rows[0]
        ok = follows_rule(regime, best, cluster.devices_per_node)
        rule_check = (f"rule of thumb for {regime.description}: {regime.rule}. The best plan "
                      + ("follows it." if ok else "departs from it: the sweep found a faster kind of plan."))
        if not ok:
            rule_check += _best_following(regime, frame, cluster.devices_per_node, best)
        mem = []
    else:
        rule_check = f"rule of thumb for {regime.description}: {regime.rule}."
        mem = memory_advice(model, cluster, frame, result.headroom)
    schedules = [s["verdict"] for s in schedule_summary(frame)]
    return Recommendation(model.name, f"{cluster.name}:{cluster.num_devices}", cluster.num_devices, result.num_plans,
                          result.num_fit, regime, advice, rule_check, mem, schedules)


def _best_following(regime: Regime, frame: pd.DataFrame, dpn: int, best: dict) -> str:
    fits = frame[frame["fits"]]
    for rec in fits.to_dict(orient="records"):
        if follows_rule(regime, rec, dpn):
            return (f" The best plan that follows the rule ({rec['plan']}) reaches {rec['tokens_per_s']:,.0f} "
                    f"tokens/s, {(best['tokens_per_s'] / rec['tokens_per_s'] - 1) * 100:.1f}% below the best.")
    return " No fitting plan follows the rule."


def _metrics(row: dict) -> dict:
    keys = ("step_time_s", "tokens_per_s", "mfu", "bubble_fraction", "exposed_comm_s", "peak_memory_bytes",
            "memory_headroom", "fits", "source")
    return {k: row[k] for k in keys}
