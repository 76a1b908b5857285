"""Where the fast path's closed form cannot follow the SimPy engine, row by row.

The fast path prices each stream (compute, TP, DP, PP, host copies) on its own and adds what
each exposes; the engine runs them as processes sharing the device's links and the host. They
agree within 2 % on plans with one communicating stream per link (tests/test_fast_vs_sim.py).
These break that (issue 23: over 2,310 random plans,
118 over 2 %, up to 22 %; in 1,500 sampled here from three spaces, with and without dp=1
fixed, every plan over 2 % had one of them):

* ``offload``: the optimizer step and the host copies of ZeRO-Offload overlap compute and each
  other in the engine, in ways the closed form's per-step sum does not follow;
* ``link contention``: two kinds of parallel traffic sharing a device's links (at least two of
  ``dp``, ``tp``, ``pp`` above 1): the engine queues them on the same ports (``sim.network``),
  the closed form overlaps them freely;
* ``shared host``: the plan's ranks share a calibrated CPU host's cores
  (``costs.host.HostModel.shared``). The engine plays them out under processor sharing; the
  closed form prices each rank alone, at its solo speed (both wait for blocking ZeRO
  collectives in line, ``fast.comm``), and a TP group's shared in-situ premium whole where the
  engine pays it by the share of the step the ranks compute (``CollectiveFit.shared_alpha``);
  it leaves out the pipeline messages' CPU and holds (``costs.host``). On the frozen CPU
  fixture, over the 3,376 plans of the CPU matrix and its model's sweep space on 2 and 4
  ranks, the fast path was median 16 % fast, up to 65 %, and up to 42 % slower on
  127 TP plans (``studies/validation_cpu/fast_vs_sim.txt``); the sweep gives those rows their
  price without the premium as their reach (``parsim.study.sweep.fast_frame``).

Unequal stages (``layers % (pp x vpp) != 0``) were a fourth reason until 2026-11-29: the
interleaved closed form takes every chunk as 1 / vpp of its rank's work and read such plans up to
17 % fast. Those plans are timed by their action graph since (``fast.dag.timed_by_graph``): over
144 pipeline-only plans with unequal stages (every schedule, four stacks, 21-30 layers on 4-8
GPUs) the fast path is within -0.2 to +1.2 % of the engine (it was -17.0 to +2.6 %); with dp or
tp as well, ``link contention`` flags them.

Such rows are ``approximate``; a sweep re-simulates every approximate row that could reach its
shown top before ranking (``parsim.study.sweep``). ``PESSIMISM`` bounds how much slower than
the engine the fast path priced such a plan: over the sample above it was at most 2.1 %
slower (it is almost always faster, i.e. optimistic), so 5 % leaves a margin.

ZeRO-3 under a stack whose NCCL kernels slow the compute beside them (``costs.stack.
comm_compute_slowdown``: deepspeed, fsdp1, and fsdp2, which takes fsdp1's numbers) is followed
since 2026-11-29 (``fast.zero3``): the engine pays the compute a backward owes at the start of
the rank's next action, while that backward's last reduce-scatters drain. Over 224 such plans
(1F1B, interleaved, GPipe; pp 1-4, tp 1-2, four stacks) the fast path is within -6.3 to +5.0 %
of the engine (mean 1.0 %; it was +19 % at worst), over 224 split-schedule ones -9.1 to +3.9 %
(mean 2.4 %; it was -19 %); the plans past 2 % pipeline and shard together, so they are flagged.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from parsim.costs.host import HostModel
from parsim.specs import ClusterSpec

PESSIMISM = 0.05       # the fast path's step time is at most this fraction above the engine's
REASONS = ("offload", "link contention", "shared host")


def approximate_reasons(cols: Mapping[str, np.ndarray],
                        cluster: ClusterSpec | None = None) -> dict[str, np.ndarray]:
    """{reason: boolean array over the plans}; ``cols`` holds dp, tp, pp as integers and
    ``offload`` as its words ("none", ...) or codes (0 = none, ``parsim.specs.codes``);
    ``cluster`` (the one the plans run on) decides ``shared host`` (none without it)."""
    dp, tp, pp = (np.asarray(cols[k]) for k in ("dp", "tp", "pp"))
    offload = np.asarray(cols["offload"])
    offloaded = offload != ("none" if offload.dtype.kind in "OUS" else 0)
    return {
        "offload": offloaded,
        "link contention": (dp > 1).astype(int) + (tp > 1) + (pp > 1) >= 2,
        "shared host": _shared_host(cluster, dp * tp * pp),
    }


def _shared_host(cluster: ClusterSpec | None, world: np.ndarray) -> np.ndarray:
    """Per plan: do its ``world`` ranks slow each other down on one host? (GPUs: never.)"""
    if cluster is None:
        return np.zeros(world.shape, dtype=bool)
    sizes, inverse = np.unique(world, return_inverse=True)
    return np.array([HostModel(cluster, int(n)).shared for n in sizes], dtype=bool)[inverse.reshape(world.shape)]


def approximate_mask(cols: Mapping[str, np.ndarray], cluster: ClusterSpec | None = None) -> np.ndarray:
    """True where the fast path's numbers are approximate (any of ``REASONS``)."""
    reasons = approximate_reasons(cols, cluster)
    return np.logical_or.reduce(list(reasons.values()))
