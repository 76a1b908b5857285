"""How much work a plan asks of the simulator, estimated from the plan alone, and the limit
above which it is refused before anything runs.

The SimPy engine's time and memory grow with the events it plays: on this project's 2-core
VM ~5 us and ~500 bytes of trace per event (``parsim simulate --json`` on gpt3-1.3b, pp=8,
gbs 512..16384: 11,815..376,871 events, 41..213 MB peak RSS). ``estimate_work`` counts what
makes events, from the plan:

* ``actions``: forward and backward actions of the Schedule IR over the simulated devices
  (2 x microbatches x virtual stages, times dp*tp in ``full`` mode); each action also carries
  its sends and receives (3 events per action in all, an upper envelope of the engine's);
* ``layer_steps``: per-layer work inside those actions (2 x microbatches x layers per
  simulated device chain), which becomes events only where the engine plays layers one by
  one: per-layer ZeRO-3 gathers or TP collectives between data-parallel replicas (~14 events
  per layer step), TP collectives between simulated TP peers (``full``, ``detail``, or pp > 1: ~5),
  per-layer compute spans (``detail`` with pp > 1: ~1);
* ``dp_layers``: gradient buckets reduced once per step, per layer and simulated device (~8);
* ``devices``: the engine lays out the groups of every device of the cluster (1 each), and
  the recomputation policy of every layer of the model (1 each, ``sim.compute.stage_shapes``);
* ``dp_buckets``: gradient buckets reduced over data parallelism (2 events each), counted by
  the caller from the cost model (``parsim.costs.work``: specs cannot price parameters).

These per-kind counts were fitted to the engine's ``num_events`` on 120 random plans (tiny
to llama2-7b, 1..16 devices, both modes): the estimate lands within 0.35x..3x of the count
for all but plans without per-layer events at all (there it over-counts, up to 30x, on
plans of a few dozen events). An engine that knows its own per-action count can pass
``events_per_action`` / ``events_per_layer_step`` (the defaults are the fitted envelopes).

The limit is ``DEFAULT_MAX_EVENTS`` (10,000,000 estimated events), overridden by the
environment variable ``PARSIM_MAX_EVENTS`` or a ``max_events`` argument. The envelope
over-counts big pipelines a lot (megatron-1t on 3,072 A100s, pp=64, gbs=3072: 2.14e6
estimated, 119,772 played, 4 s), and the project's own studies simulate plans estimated at up
to 4.04e6 (megatron-529.6b on 560 A100s: 4 s, 189 MB peak RSS here), so the limit sits above
them; what it refuses is the unbounded (gbs=10^12, 10^9 layers), not the large.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .cluster import ClusterSpec
from .errors import SpecError
from .model import ModelSpec
from .plan import Plan

DEFAULT_MAX_EVENTS = 10_000_000
MAX_EVENTS_ENV = "PARSIM_MAX_EVENTS"
BYTES_PER_EVENT = 500          # measured: see the module docstring
EVENTS_PER_ACTION = 3          # the action, its send and its receive
EVENTS_PER_DP_LAYER = 8        # gradient bucket events per layer and simulated device, once per step
EVENTS_PER_BUCKET = 2          # a DP gradient bucket: its reduction and its wait


@dataclass(frozen=True)
class WorkEstimate:
    """What one simulation of a plan would play (counts; ``events`` is their weighted sum)."""
    microbatches: int          # per pipeline per step
    simulated_devices: int     # devices the engine plays (pp, or every device in full mode)
    actions: int               # forward + backward actions over the simulated devices
    layer_steps: int           # per-layer steps inside those actions
    dp_layers: int             # layers x simulated devices whose gradients are reduced once per step
    devices: int               # devices of the cluster the engine lays out
    dp_buckets: int            # DP gradient buckets over the simulated devices (from the cost model)
    events: int                # estimated engine events

    @property
    def trace_bytes(self) -> int:
        return self.events * BYTES_PER_EVENT


def events_per_layer_step(plan: Plan, mode: str, detail: bool) -> int:
    """Engine events per layer step, by what the engine plays layer by layer (docstring)."""
    if plan.dp > 1 and (plan.zero == 3 or plan.tp > 1):
        return 14
    if plan.tp > 1 and (mode == "full" or detail or plan.pp > 1):
        return 5
    return 1 if detail and plan.pp > 1 else 0


def estimate_work(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, mode: str = "representative",
                  detail: bool = False, events_per_action: float = EVENTS_PER_ACTION,
                  events_per_layer: float | None = None, dp_buckets: int = 0,
                  replicas: int | None = None) -> WorkEstimate:
    """The work of one ``parsim.sim.simulate(model, cluster, plan, mode=mode, detail=detail)``;
    ``replicas``: devices simulated per pipeline rank when known (full mode simulates one per
    class of identical ranks, ``parsim.sim.symmetry``), else every one in full mode."""
    microbatches = plan.gbs // (plan.dp * plan.mbs)
    if replicas is None:
        replicas = plan.dp * plan.tp if mode == "full" else 1
    elif replicas == 1:
        mode = "representative"     # one class per pipeline rank: the engine plays representative mode's actions
    simulated = plan.pp * replicas
    actions = 2 * microbatches * plan.pp * plan.vpp * replicas
    layer_steps = 2 * microbatches * model.layers * replicas
    dp_layers = model.layers * simulated if plan.dp > 1 else 0
    per_layer = events_per_layer_step(plan, mode, detail) if events_per_layer is None else events_per_layer
    events = int(events_per_action * actions + per_layer * layer_steps + EVENTS_PER_DP_LAYER * dp_layers
                 + cluster.num_devices + model.layers + EVENTS_PER_BUCKET * dp_buckets)
    return WorkEstimate(microbatches, simulated, actions, layer_steps, dp_layers, cluster.num_devices, dp_buckets,
                        events)


def max_events(override: int | None = None) -> int:
    """The limit: ``override``, else ``$PARSIM_MAX_EVENTS``, else ``DEFAULT_MAX_EVENTS``."""
    if override is not None:
        value: object = override
    else:
        value = os.environ.get(MAX_EVENTS_ENV, "").strip() or DEFAULT_MAX_EVENTS
    try:
        limit = int(value)
    except (TypeError, ValueError):
        limit = 0
    if isinstance(value, bool) or (isinstance(value, float) and value != limit):
        limit = 0                                   # 2.5 is not a count (nor is True)
    if limit < 1:
        raise SpecError(MAX_EVENTS_ENV if override is None else "max_events", value,
                        "a positive integer (events the simulator may play)")
    return limit


def check_work(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, mode: str = "representative",
               detail: bool = False, limit: int | None = None, dp_buckets: int = 0,
               replicas: int | None = None) -> WorkEstimate:
    """The estimate, or a SpecError saying how big the simulation would be and what to use
    instead when it is above the limit."""
    work = estimate_work(model, cluster, plan, mode=mode, detail=detail, dp_buckets=dp_buckets, replicas=replicas)
    cap = max_events(limit)
    if work.events <= cap:
        return work
    field, value = _culprit(work, model, plan, cluster)
    instead = []
    if field == "cluster":
        instead.append("fewer devices (the engine lays out every device's process groups: ~1 s per million)")
    if work.dp_buckets * EVENTS_PER_BUCKET * 2 > work.events:
        instead.append(f"a smaller model or larger gradient buckets (its gradients make {work.dp_buckets:,} "
                       f"buckets of dp_bucket_bytes={plan.dp_bucket_bytes:,} per step)")
    if mode == "full":
        instead.append("mode=representative (one device per pipeline rank)")
    if detail:
        instead.append("no --detail")
    if work.microbatches > 1:
        instead.append(f"fewer microbatches (gbs/(dp*mbs) is {work.microbatches:,}: a smaller gbs or a larger mbs)")
    instead.append("`parsim sweep` (the closed-form fast path plays no events)")
    raise SpecError(field, value, (
        f"the simulation would play ~{work.events:.3g} events (~{work.trace_bytes / 2**30:.3g} GiB of trace; "
        f"{work.microbatches:,} microbatches x {plan.pp * plan.vpp} stages x {work.simulated_devices // plan.pp} "
        f"device(s) per stage, {model.layers:,} layers, {work.devices:,} devices laid out, {work.dp_buckets:,} "
        f"gradient buckets), above the limit "
        f"{cap:,}: use {'; or '.join(instead)}; or raise the limit with {MAX_EVENTS_ENV}=N"))


def check_schedule_size(pp: int, vpp: int, microbatches: int, limit: int | None = None) -> int:
    """Actions of a schedule of ``pp`` ranks x ``vpp`` chunks x ``microbatches`` (forward and
    backward each), or a SpecError above the event limit: the schedule is built, checked and
    dry-run action by action."""
    actions = 2 * pp * vpp * microbatches
    cap = max_events(limit)
    if actions > cap:
        field, value = max((("microbatches", microbatches), ("pp", pp), ("vpp", vpp)), key=lambda fv: fv[1])
        raise SpecError(field, value, f"a schedule of at most {cap:,} actions (2 x pp x vpp x microbatches = "
                        f"{actions:,}): fewer microbatches or stages, or raise the limit with {MAX_EVENTS_ENV}=N")
    return actions


def _culprit(work: WorkEstimate, model: ModelSpec, plan: Plan, cluster: ClusterSpec) -> tuple[str, object]:
    """The input that makes the simulation big: the device count, the layers or the batch."""
    if work.devices * 2 > work.events:
        return "cluster", f"{cluster.name}:{cluster.num_devices}"
    if work.dp_buckets * EVENTS_PER_BUCKET * 2 > work.events:
        return "model", model.name         # its gradients make the buckets
    if work.microbatches <= 16 and work.layer_steps > work.actions:
        return "model.layers", model.layers
    return "gbs", plan.gbs
