"""Classes of identical ranks: ``full`` mode simulates one device per class, not every device.

The engine treats a device's identity only through (a) its compute slowdown, (b) the links of
its pipeline sends (same node or not: ``network.link_between``, ``timing.p2p_time``) and (c)
the link and shape of its TP and DP groups (``network.group_link`` / ``group_shape``: all
that ``collective_time`` and ``ps_time`` depend on). Everything else (schedule, costs, memory)
depends on the pipeline rank only. Renaming DP indices d <-> d' (the same swap in every
pipeline rank and TP index) maps TP groups to TP groups, DP groups onto themselves and
pipeline chains to pipeline chains; when it also keeps (a)-(c) it maps the whole simulation
onto itself, so the two DP indices play identical timelines. The same holds for TP indices
t <-> t' (PyTorch/Megatron process groups: the layout of ``specs.RankLayout``).

So DP indices with equal *signatures* (a)-(c) over every (pipeline rank, TP index) are
interchangeable, and so are TP indices with equal signatures over every (pipeline rank, DP
index). A rank's class is (pipeline rank, DP-index class, TP-index class), and its
representative is the rank with the smallest DP and TP index of the class. The
representatives form a sub-grid (every pipeline rank x the representative DP indices x the
representative TP indices) closed under the engine's groups: a representative's TP group,
DP group and pipeline neighbours hold only representatives for the other classes. A
collective therefore waits for every class's representative (it completes when the slowest
member arrives; members of one class arrive together and their link ports are free at the
same times), and its cost is that of the whole group (``Communicator.ranks``).

Without stragglers on a uniform cluster each pipeline rank is one class (the devices of
representative mode, which then take its one-timeout actions); a straggler at (p, d, t) splits
the DP indices into {d} and the rest and the TP indices into {t} and the rest: 4 x pp devices.
Where the rank-by-rank run itself breaks the symmetry, every rank is simulated (``exact``):

* a shared CPU host (``costs.host``: ranks slow each other down) couples every rank to the
  count of computing ranks;
* TP and DP collectives on the same link (both groups inside one node, or both across
  nodes): a device's port then serves two overlapping groups, and which of two collectives
  asked for at one instant gets it first follows SimPy's event order across devices, so
  the rank-by-rank run can hand DP replica 0 the TP collective first and replica 1 the DP one
  (e.g. ``tiny`` on a100-80g:8, dp=2 tp=2 pp=2 zero=2 tp_overlap=subpipe: 0.2% apart).

The swap argument says nothing about ties in SimPy's event order; a port shared by one
group's collectives and the device's own pipeline sends (DP and PP on the NICs at scale)
gave the rank-by-rank numbers in every plan compared (tests/test_sim_symmetry.py, the
equivalence corpus's full-mode and straggler plans, GPT-3 175B on 1024 A100 with and without
a straggler: studies/sim_speed).
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.costs.host import HostModel
from parsim.specs import ClusterSpec, Plan, RankLayout

from .network import group_link, group_shape


@dataclass(frozen=True)
class RankClasses:
    """Which ranks are simulated and which simulated rank each rank copies."""
    ranks: tuple[int, ...]                 # every rank the result reports, ascending
    simulated: tuple[int, ...]             # the representatives, ascending
    representative: dict[int, int]         # rank -> its class's representative
    members: dict[int, tuple[int, ...]]    # representative -> its class (itself first), ascending

    @property
    def reduced(self) -> bool:
        return len(self.simulated) < len(self.ranks)


def every_rank(ranks: list[int]) -> RankClasses:
    """Each rank its own class (representative mode's devices, or full mode rank by rank)."""
    ranks = sorted(ranks)
    return RankClasses(tuple(ranks), tuple(ranks), {r: r for r in ranks}, {r: (r,) for r in ranks})


def full_mode_classes(cluster: ClusterSpec, plan: Plan, slowdown: dict[int, float],
                      link_slowdown: dict[int, float] | None = None, symmetric: bool = True) -> RankClasses:
    """The devices full mode simulates: one per class of identical ranks, or every rank
    (``symmetric=False``, and where the rank-by-rank run is not symmetric itself: ``exact``,
    ranks sharing a CPU host)."""
    if symmetric and not HostModel(cluster, plan.world_size).shared and exact(cluster, plan):
        return rank_classes(cluster, plan, slowdown, link_slowdown)
    return every_rank(list(range(plan.world_size)))


def exact(cluster: ClusterSpec, plan: Plan) -> bool:
    """Can classes stand for their ranks with the rank-by-rank run's exact numbers? Not where a
    TP group and a DP group of one rank share a link (see above)."""
    if plan.tp == 1 or plan.dp == 1:
        return True
    layout = RankLayout(plan.dp, plan.tp, plan.pp)
    for p in range(plan.pp):
        tp = {group_link(cluster, [layout.rank(p, d, x) for x in range(plan.tp)]) for d in range(plan.dp)}
        dp = {group_link(cluster, [layout.rank(p, x, t) for x in range(plan.dp)]) for t in range(plan.tp)}
        if tp & dp:
            return False
    return True


def rank_classes(cluster: ClusterSpec, plan: Plan, slowdown: dict[int, float],
                 link_slowdown: dict[int, float] | None = None) -> RankClasses:
    """The classes of identical ranks of ``plan`` on ``cluster`` under per-rank compute
    ``slowdown`` and per-rank NIC ``link_slowdown`` (a degraded NIC is part of a rank's identity)."""
    layout = RankLayout(plan.dp, plan.tp, plan.pp)
    links = link_slowdown or {}
    own = {r: _rank_signature(cluster, layout, r, slowdown) + (float(links.get(r, 1.0)),)
           for r in range(layout.world_size)}
    tp_groups = {(p, d): _group_signature(cluster, [layout.rank(p, d, x) for x in range(plan.tp)])
                 for p in range(plan.pp) for d in range(plan.dp)}
    dp_groups = {(p, t): _group_signature(cluster, [layout.rank(p, x, t) for x in range(plan.dp)])
                 for p in range(plan.pp) for t in range(plan.tp)}
    d_sig = [(tuple(tp_groups[p, d] for p in range(plan.pp)),
              tuple(own[layout.rank(p, d, t)] for p in range(plan.pp) for t in range(plan.tp)))
             for d in range(plan.dp)]
    t_sig = [(tuple(dp_groups[p, t] for p in range(plan.pp)),
              tuple(own[layout.rank(p, d, t)] for p in range(plan.pp) for d in range(plan.dp)))
             for t in range(plan.tp)]
    d_rep, t_rep = _first_equal(d_sig), _first_equal(t_sig)
    representative = {layout.rank(p, d, t): layout.rank(p, d_rep[d], t_rep[t])
                      for p in range(plan.pp) for d in range(plan.dp) for t in range(plan.tp)}
    members: dict[int, list[int]] = {}
    for r in range(layout.world_size):
        members.setdefault(representative[r], []).append(r)
    return RankClasses(tuple(range(layout.world_size)), tuple(sorted(members)), representative,
                       {rep: tuple(m) for rep, m in members.items()})


def _rank_signature(cluster: ClusterSpec, layout: RankLayout, rank: int, slowdown: dict[int, float]) -> tuple:
    """What of a rank's own identity the engine sees: its slowdown and whether its pipeline
    neighbours (both sides, with interleaving's wrap-around) share its node."""
    p, d, t = layout.coords(rank)
    node = cluster.node_of(rank)
    same_node = tuple(cluster.node_of(layout.rank(q % layout.pp, d, t)) == node for q in (p - 1, p + 1))
    return float(slowdown.get(rank, 1.0)), same_node


def _group_signature(cluster: ClusterSpec, ranks: list[int]) -> tuple:
    return group_link(cluster, ranks), group_shape(cluster, ranks)


def _first_equal(signatures: list) -> list[int]:
    """For each index, the smallest index with the same signature."""
    first: dict = {}
    return [first.setdefault(s, i) for i, s in enumerate(signatures)]
