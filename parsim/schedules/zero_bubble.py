"""Zero-bubble schedules with loop placement: ZB-H1, interleaved zero bubble and ZB-H2.

Zero-bubble pipeline parallelism (Qi et al. 2023, "Zero Bubble Pipeline Parallelism",
arXiv:2401.10241) splits a stage's backward into the input gradient I (on the critical
path: the previous stage waits for it) and the weight gradient W (needed only by the
optimizer step), and moves the W passes into the bubbles of 1F1B.

* ``zb-h1`` / ``interleaved-zb``: the handcrafted ZB-H1 (Qi et al. 2023, Sec 3.1, Fig. 3 top)
  and its interleaved form, as torch 2.13 generates them (``ScheduleInterleavedZeroBubble``,
  "ZB1P"): the 1F1B / interleaved-1F1B order with I in place of B, rank r's warm-up of
  ``(v-1) * round + (p-1-r)`` forwards, and each W issued ``r`` backwards after its I (the
  last ``r`` Ws of rank r fill its cool-down). Same activation memory as 1F1B: at most
  p microbatches in flight on rank 0.
* ``zb-h2``: ZB-H2 (Qi et al. 2023, Sec 3.1, Fig. 3 bottom): more forwards in the warm-up
  (2p - 1 on rank 0) and the Ws moved to the tail so the step becomes a parallelogram. Built
  as the paper describes it for equal pass times (T_F = T_B = T_W): at each unit time every
  rank runs its first ready pass in the priority I > F > W, starting a forward only while
  fewer than 2p - 1 microbatches are in flight (the (2p-1) M_B memory of Table 1). For
  m >= 2p - 1 each rank is then busy without a gap from its first forward to its last W.
"""
from __future__ import annotations

from collections import defaultdict

from .ir import Action


def microbatches_per_round(pp: int, m: int) -> int:
    """torch 2.13 interleaved schedules run microbatches in ``max(1, m // pp)`` rounds of
    equal size (``ScheduleInterleavedZeroBubble.microbatches_per_round``)."""
    return m // max(1, m // pp)


def split_backward_1f1b(rank: int, pp: int, m: int, vpp: int) -> list[Action]:
    """Rank ``rank``'s ZB1P order (ZB-H1 for vpp = 1, interleaved zero bubble for vpp >= 2)."""
    per_round = microbatches_per_round(pp, m)
    total = m * vpp
    # torch _get_warmup_ops(multiply_factor=1): the last rank warms up (v-1) rounds, each
    # hop towards rank 0 one forward more, capped at all forwards
    warmup = min((vpp - 1) * per_round + (pp - 1 - rank), total)
    w_lag = rank                      # torch: num_1f1b_microbatches = rank

    def forward_stage(k: int) -> int:      # k-th forward: chunks cycle every round
        return ((k // per_round) % vpp) * pp + rank

    def backward_stage(q: int) -> int:     # q-th backward: chunks cycle in reverse
        return (vpp - 1 - (q // per_round) % vpp) * pp + rank

    next_mb = {kind: defaultdict(int) for kind in "FIW"}
    backward_stages: list[int] = []
    order: list[Action] = []

    def emit(kind: str, stage: int) -> None:
        order.append(Action(kind, stage, next_mb[kind][stage]))
        next_mb[kind][stage] += 1

    for k in range(warmup):
        emit("F", forward_stage(k))
    weights = 0
    for q in range(total):
        if warmup + q < total:
            emit("F", forward_stage(warmup + q))
        backward_stages.append(backward_stage(q))
        emit("I", backward_stages[-1])
        if q >= w_lag:
            emit("W", backward_stages[weights])
            weights += 1
    for stage in backward_stages[weights:]:
        emit("W", stage)
    return order


def zb_h2_orders(pp: int, m: int) -> list[list[Action]]:
    """Every rank's ZB-H2 order: a unit-time list schedule with priority I > F > W and at most
    2 pp - 1 microbatches in flight per rank (see the module docstring)."""
    cap = 2 * pp - 1
    done: dict[Action, int] = {}           # end time of every pass run so far
    count = [dict(F=0, I=0, W=0) for _ in range(pp)]
    orders: list[list[Action]] = [[] for _ in range(pp)]
    t = 0
    while any(c["W"] < m for c in count):
        started = []
        for r in range(pp):
            nxt = _ready_pass(r, pp, m, cap, count[r], done, t)
            if nxt is not None:
                started.append(nxt)
                orders[r].append(nxt)
                count[r][nxt.kind] += 1
        for action in started:             # a pass ends one unit later
            done[action] = t + 1
        t += 1
    return orders


def _ready_pass(r: int, pp: int, m: int, cap: int, count: dict[str, int], done: dict[Action, int],
                t: int) -> Action | None:
    f, i, w = count["F"], count["I"], count["W"]

    def ready(a: Action) -> bool:             # ended by time t
        return done.get(a, t + 1) <= t

    if i < f and (r == pp - 1 or ready(Action("I", r + 1, i))):
        return Action("I", r, i)
    if f < m and f - w < cap and (r == 0 or ready(Action("F", r - 1, f))):
        return Action("F", r, f)
    if w < i:
        return Action("W", r, w)
    return None
