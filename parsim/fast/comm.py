"""Data-parallel communication of every pipeline rank, priced once per distinct layout.

The DP collectives of a plan depend only on (dp, tp, pp, vpp, dtype): the communicator's
shape on the cluster and the bytes each pipeline rank holds. They are priced here with
``parsim.costs.timing.collective_time`` itself (memoised on group shape and size), so the
fast path and the SimPy engine price a collective with the very same function.

Per rank, in seconds (buckets back to back on one DP stream, ``costs.dp_buckets``):
    all-reduce of the gradients (all buckets, last bucket)     ZeRO-0 (PyTorch DDP)
    reduce-scatter of the gradients (all, last)                ZeRO-1
    all-gather of the parameters (all buckets)                 ZeRO-1/2 after the step
    ZeRO-3 per-layer all-gather / reduce-scatter               (Rajbhandari et al. 2020 Sec. 7)
    ZeRO-3 root unit (embedding / head) gather and scatter     per forward / backward (both
                                                               ends, and each end alone)
    (the ZeRO collectives of every layer at the stack's share of NCCL bandwidth,
    ``costs.stack.zero_comm_factor``, as the SimPy engine's ``actions.zero3_collective``)
    reduce-scatter of the embedding's / the head's gradients   ZeRO-2, every backward (with the
                                                               per-layer one: Sec. 5.2)
    parameter server: gradient buckets in (all, last), parameters out    (``dp_impl=ps``)
    the tied embedding's gradient all-reduce, first and last pipeline rank, whole / 1/dp shard
    (``costs.optimizer.tied_embedding_sync``; also with dp = 1)
    whether the TP and the DP groups leave the device on the same link (both NVLink inside a
    node, or both the NIC): then their transfers queue for one port, as in the SimPy engine
    compute seconds lost per second of these collectives overlapping compute (NCCL on the
    SMs: ``costs.stack.comm_compute_slowdown``, the SimPy engine's ``Device.ledger``)
    whether the ZeRO collectives block the rank (``C_ZERO_BLOCKING``: 0 on a side stream, 1
    blocking, 2 blocking as FSDP2 runs them, unit by unit with its copies)
    beside a side stream, the compute FSDP2's copies and host work leave the rank per layer
    unit's gather and reduce-scatter, and per microbatch for ZeRO-2's embedding and head
    reduce-scatters (``C_OWED_*``; the SimPy engine's ``Device.ledger``, paid before the next
    compute)

Where ZeRO collectives block (a profile whose ``zero_overlap`` is false: gloo on the host's own
cores, the reference executor's FSDP2), the ZeRO-2/3 columns are what the rank waits, as the
SimPy engine's ``actions.zero3_collective`` charges it: the collective priced in situ (called
right after compute, on the plan's ranks sharing the host) and, under FSDP2, its copies and host
work per unit (``costs.fsdp2.fsdp_unit_time``; the engine also slows those by the host's
memory-bound contention, which the fast path leaves out as it does for compute). Beside a side
stream (a GPU's FSDP2) those copies are compute the rank owes: the layer units' in ``C_OWED_*``,
which ``fast.timing`` adds to the layers' compute, the root units' in their own columns (the
action waits for its root unit's gather and reduce-scatter either way).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from parsim.costs import (embedding_params, head_params, plan_state_bytes, zero3_gather_bytes_per_layer,
                          zero3_reduce_scatter_bytes_per_layer)
from parsim.costs import timing
from parsim.costs.comm import bucket_split, zero1_gradient_op
from parsim.costs.host import HostModel
from parsim.costs.links import group_link
from parsim.costs.optimizer import tied_embedding_sync
from parsim.costs.stack import comm_compute_slowdown, zero_unit_time
from parsim.costs.timing import parameter_server_time
from parsim.specs import ClusterSpec, ModelSpec, Plan, RankLayout

from .plans import WORDS

(C_AR_ALL, C_AR_LAST, C_RS_ALL, C_RS_LAST, C_AG_ALL, C_PS_ALL, C_PS_LAST, C_PS_BCAST, C_Z3_GATHER, C_Z3_SCATTER,
 C_SHARED_LINK, C_Z2_EMB, C_Z2_HEAD, C_Z3_ROOT_GATHER, C_Z3_ROOT_SCATTER, C_COMM_SLOWDOWN, C_TIED, C_TIED_SHARD,
 C_ZERO_BLOCKING, C_Z3_EMB_GATHER, C_Z3_EMB_SCATTER, C_Z3_HEAD_GATHER, C_Z3_HEAD_SCATTER, C_OWED_GATHER,
 C_OWED_SCATTER, C_OWED_EMB, C_OWED_HEAD, C_WIDTH) = range(28)


def dp_group_ranks(dp: int, tp: int, pp: int, pp_rank: int = 0) -> list[int]:
    """The DP communicator of a pipeline rank (TP rank 0; every TP rank's has its shape)."""
    layout = RankLayout(dp=dp, tp=tp, pp=pp)
    return [layout.rank(pp_rank, d, 0) for d in range(dp)]


def tp_group_ranks(dp: int, tp: int, pp: int) -> list[int]:
    """The TP communicator of pipeline rank 0, DP rank 0."""
    layout = RankLayout(dp=dp, tp=tp, pp=pp)
    return [layout.rank(0, 0, t) for t in range(tp)]


class CollectivePricer:
    """``timing.collective_time`` memoised on (op, bytes, group shape).

    The analytic and the calibrated models price a group by its size and the nodes it spans
    (``timing.collective_time``), so groups of equal shape share one price; the fast-vs-costs
    tests price real groups rank by rank and would catch a model that looked further."""

    def __init__(self, cluster: ClusterSpec):
        self.cluster = cluster
        self._price = lru_cache(maxsize=None)(self._uncached)
        self._shapes: dict[tuple[int, int, int], tuple[int, ...]] = {}

    def _uncached(self, op: str, nbytes: float, group: tuple[int, ...], host: int | None) -> float:
        return timing.collective_time(self.cluster, op, nbytes, list(group), host is not None, host)

    def __call__(self, op: str, nbytes: float, group: tuple[int, ...], host: int | None = None) -> float:
        """Seconds; ``host``: priced in situ with that many ranks sharing the host (None: back to back)."""
        return self._price(op, float(nbytes), group, host)

    def dp_group(self, dp: int, tp: int, pp: int, pp_rank: int) -> tuple[int, ...]:
        """A representative of the DP communicator of ``pp_rank``: the first group seen with
        the same size, stride and offset within a node (hence the same nodes spanned)."""
        first = RankLayout(dp=dp, tp=tp, pp=pp).rank(pp_rank, 0, 0)
        key = (dp, tp, first % self.cluster.devices_per_node)
        if key not in self._shapes:
            self._shapes[key] = tuple(dp_group_ranks(dp, tp, pp, pp_rank))
        return self._shapes[key]

    def bucketed(self, op: str, total_bytes: float, bucket_bytes: int, group: tuple[int, ...]) -> tuple[float, float]:
        """(all buckets back to back, the last bucket)."""
        return bucketed(lambda nbytes: self(op, nbytes, group), total_bytes, bucket_bytes)


def bucketed(price, total_bytes: float, bucket_bytes: int) -> tuple[float, float]:
    """(all DDP buckets of ``total_bytes`` back to back, the last one) with ``price(bucket
    bytes)`` seconds each (``costs.dp_buckets`` sizes: all full but the last; counted, not
    listed, by ``costs.comm.bucket_split``: their number may be huge)."""
    n, full_bytes, last_bytes = bucket_split(total_bytes, bucket_bytes)
    if not n:
        return 0.0, 0.0
    full = price(full_bytes) if n > 1 else 0.0
    last = price(last_bytes)
    return full * (n - 1) + last, last


def rank_comm_rows(model: ModelSpec, pricer: CollectivePricer, dp: int, tp: int, pp: int, vpp: int, dtype: int,
                   rank_params: list[float], bucket_bytes: int, with_ps: bool = False,
                   head_rank: int | None = None, stack: str = "auto") -> np.ndarray:
    """(pp, C_WIDTH): the DP communication of each pipeline rank holding ``rank_params``
    (the parameter-server column only when ``with_ps``: it walks every worker); the output head
    on ``head_rank`` (default the last: loop placement; rank 0 under V placement)."""
    head_rank = pp - 1 if head_rank is None else head_rank
    out = np.zeros((pp, C_WIDTH))
    plan = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, dtype=WORDS["dtype"][dtype], stack=stack)
    sb = plan_state_bytes(plan)
    if head_rank != 0:                  # loop placement (a V holds both ends on rank 0: no sync)
        _tied_columns(out, model, pricer, plan, sb.grad)
    if dp == 1:
        return out
    z3_gather = zero3_gather_bytes_per_layer(model, plan)
    z3_scatter = zero3_reduce_scatter_bytes_per_layer(model, plan)
    done: dict[tuple[float, tuple[int, ...]], np.ndarray] = {}
    cluster = pricer.cluster
    tp_link = group_link(cluster, tp_group_ranks(dp, tp, pp))
    zero_price = _ZeroPricer(pricer, dp * tp * pp)
    for r in range(pp):
        group = pricer.dp_group(dp, tp, pp, r)
        n = rank_params[r]
        key = (n, group, r == 0, r == head_rank)
        if key in done:                 # middle ranks repeat: same size, same group shape
            out[r] = done[key]
            continue
        row = out[r]
        row[C_AR_ALL], row[C_AR_LAST] = pricer.bucketed("all_reduce", n * sb.grad, bucket_bytes, group)
        # ZeRO-1's buckets: reduce-scattered, or all-reduced where the stack's ZeRO-1 sits beside DDP
        row[C_RS_ALL], row[C_RS_LAST] = pricer.bucketed(zero1_gradient_op(plan), n * sb.grad, bucket_bytes, group)
        row[C_AG_ALL], _ = pricer.bucketed("all_gather", n * sb.param, bucket_bytes, group)
        if with_ps:
            row[C_PS_ALL], row[C_PS_LAST] = bucketed(lambda x: parameter_server_time(cluster, x, list(group)),
                                                     n * sb.grad, bucket_bytes)
            row[C_PS_BCAST] = parameter_server_time(cluster, n * sb.param, list(group))
        row[C_Z3_GATHER], row[C_OWED_GATHER] = zero_price.split("all_gather", z3_gather, group)
        row[C_Z3_SCATTER], row[C_OWED_SCATTER] = zero_price.split("reduce_scatter", z3_scatter, group)
        emb = embedding_params(model, plan) if r == 0 else 0.0
        head = head_params(model, plan) if r == head_rank else 0.0
        if emb:
            row[C_Z2_EMB], row[C_OWED_EMB] = zero_price.split("reduce_scatter", emb * sb.grad, group)
        if head:
            row[C_Z2_HEAD], row[C_OWED_HEAD] = zero_price.split("reduce_scatter", head * sb.grad, group)
        if emb + head:
            # ZeRO-3: the rank's root unit (embedding and / or final norm + head), gathered before
            # every forward and backward, reduce-scattered after every backward (sim.actions)
            row[C_Z3_ROOT_GATHER] = zero_price("all_gather", (emb + head) * sb.param, group)
            row[C_Z3_ROOT_SCATTER] = zero_price("reduce_scatter", (emb + head) * sb.grad, group)
            # each end alone: V placement puts the first stage and the last on rank 0 in two
            # chunks, and the engine gathers each stage's own edge parameters around it
            row[C_Z3_EMB_GATHER] = zero_price("all_gather", emb * sb.param, group)
            row[C_Z3_EMB_SCATTER] = zero_price("reduce_scatter", emb * sb.grad, group)
            row[C_Z3_HEAD_GATHER] = zero_price("all_gather", head * sb.param, group)
            row[C_Z3_HEAD_SCATTER] = zero_price("reduce_scatter", head * sb.grad, group)
        row[C_ZERO_BLOCKING] = _blocking_code(cluster)
        row[C_SHARED_LINK] = float(tp > 1 and group_link(cluster, list(group)) == tp_link)
        row[C_COMM_SLOWDOWN] = comm_compute_slowdown(cluster)
        done[key] = row.copy()
    return out


def _blocking_code(cluster: ClusterSpec) -> float:
    """``C_ZERO_BLOCKING``: 0 where ZeRO collectives run on a side stream, 1 where they block the
    rank, 2 where they block it as FSDP2 runs them (unit by unit, with its copies)."""
    tables = cluster.device.tables
    return (2.0 if tables.fsdp2_copies else 1.0) if tables.zero_blocking else 0.0


class _ZeroPricer:
    """One ZeRO collective of a unit of ``nbytes`` over ``group`` by the rule the SimPy engine's
    ``actions.zero3_collective`` charges too (``costs.stack.zero_unit_time``): at the stack's
    share of the bandwidth; where ZeRO collectives block the rank, priced in situ on the plan's
    ``world`` ranks sharing the host. Under FSDP2 its copies and host work go around it: in line
    where the collectives block, owed to the compute beside a side stream."""

    def __init__(self, pricer: CollectivePricer, world: int):
        self.pricer = pricer
        self.blocking = bool(pricer.cluster.device.tables.zero_blocking)
        self.host = HostModel(pricer.cluster, world).ranks_on_host

    def split(self, op: str, nbytes: float, group: tuple[int, ...]) -> tuple[float, float]:
        """(seconds the rank's DP stream spends on it, compute seconds the rank owes for it)."""
        before, seconds, after = zero_unit_time(
            self.pricer.cluster, op, nbytes, len(group),
            lambda in_situ: self.pricer(op, nbytes, group, self.host if in_situ else None))
        return (seconds + (before + after), 0.0) if self.blocking else (seconds, before + after)

    def __call__(self, op: str, nbytes: float, group: tuple[int, ...]) -> float:
        """A unit the action waits for whole (a root unit): the collective and its copies."""
        return sum(self.split(op, nbytes, group))


def _tied_columns(out: np.ndarray, model: ModelSpec, pricer: CollectivePricer, plan: Plan, grad_bytes: float) -> None:
    """The tied embedding's gradient all-reduce (``costs.optimizer.tied_embedding_sync``) on the
    first and the last pipeline rank: ``C_TIED`` whole (ZeRO-0/1), ``C_TIED_SHARD`` a 1/dp
    shard (ZeRO-2/3); 0 on every other rank and where nothing is tied."""
    layout = RankLayout(dp=plan.dp, tp=plan.tp, pp=plan.pp)
    for column, zero in ((C_TIED, 0), (C_TIED_SHARD, 2)):
        sync = tied_embedding_sync(model, replace(plan, zero=zero))
        if sync is None:
            return
        group = (layout.rank(sync.first, 0, 0), layout.rank(sync.last, 0, 0))
        out[[sync.first, sync.last], column] = pricer("all_reduce", sync.elements * grad_bytes, group)
