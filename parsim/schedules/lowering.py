"""Make a schedule's communication explicit, as torch 2.13's pipeline runtime does.

``lower_schedule`` turns a compute-only schedule (F, B, I, W, overlapped F&B) into the
"compute_comms" form that torch's ``_PipelineScheduleRuntime`` runs
(``_prepare_schedule_with_comms``), pass by pass:

1. UNSHARD / RESHARD (FSDP): before each compute action, gather the parameters of the next
   3 distinct stages the rank will compute and free the gathered stages that are not among
   them (torch ``_add_unshard_reshard``, ``max_active_stages=3``); free the rest at the end.
2. REDUCE_GRAD: right after the action that completes a stage's last weight gradient (B or W
   of its m-th microbatch), the stage's data-parallel gradient reduction (``_add_reduce_grad``).
3. SEND / RECV: the ranks are stepped round-robin in rank order, each taking its next action
   once its input is there (a RECV it was given, or the producing pass on the same rank); a
   pass whose output goes to a stage on another rank is followed by its SEND, and the matching
   RECV is appended to the receiving rank's list at that moment (``_add_send_recv``).
   Because positions depend on how far each rank has got in this stepping, the UNSHARD,
   RESHARD and REDUCE_GRAD slots of passes 1-2 shift where RECVs land; they are kept so the
   result equals torch's action for action.
4. Optionally (torch ``defer_pp_recv=True``, ``_defer_recv_ops``): each RECV moves down to
   just before the pass that consumes it, except that a rank flushes its pending RECVs from a
   peer of higher rank before it sends to that peer (rank-parity ordering against deadlock).

A RECV's position is where the receive is posted; the runtime waits for its data only at the
consuming pass (``dryrun`` models exactly that).
"""
from __future__ import annotations

from collections import deque
from dataclasses import replace

from .ir import OVERLAP_F_B, Action, Item, Schedule, ScheduleError, compute_items, leaf_actions

FSDP_PREFETCH_STAGES = 3   # torch 2.13 _add_unshard_reshard(max_active_stages=3)


def lower_schedule(schedule: Schedule, *, fsdp: bool = True, reduce_grad: bool = True,
                   defer_recv: bool = False) -> Schedule:
    """``schedule`` with explicit UNSHARD/RESHARD (``fsdp``), REDUCE_GRAD (``reduce_grad``)
    and SEND/RECV actions; with the defaults, equal to torch 2.13's lowering of the same
    compute actions. An already lowered schedule is lowered again from its compute actions."""
    orders = [compute_items(order) for order in schedule.actions]
    if fsdp:
        orders = [_with_unshard_reshard(order) for order in orders]
    if reduce_grad:
        orders = [_with_reduce_grad(order, schedule.num_microbatches) for order in orders]
    orders = _with_send_recv(schedule, orders)
    if defer_recv:
        orders = [_defer_receives(schedule, rank, order) for rank, order in enumerate(orders)]
    return replace(schedule, actions=tuple(tuple(order) for order in orders))


def compute_only(schedule: Schedule) -> Schedule:
    """``schedule`` without its communication, FSDP and gradient-reduction actions."""
    return replace(schedule, actions=tuple(tuple(compute_items(order)) for order in schedule.actions))


def _stages_of(item: Item) -> list[int]:
    return [a.stage for a in leaf_actions([item])]


def _upcoming_stages(order: list[Item], start: int, count: int) -> list[int]:
    """The next ``count`` distinct stages from ``order[start]`` on (an overlapped slot adds
    both of its stages, so the list may end one longer, as in torch)."""
    found: list[int] = []
    for item in order[start:]:
        for stage in _stages_of(item):
            if stage not in found:
                found.append(stage)
                if item.kind != OVERLAP_F_B and len(found) == count:
                    return found
        if len(found) >= count:
            return found
    return found


def _with_unshard_reshard(order: list[Item]) -> list[Item]:
    gathered: set[int] = set()     # a set, as in torch: RESHARD follows its iteration order
    out: list[Item] = []
    for n, item in enumerate(order):
        upcoming = _upcoming_stages(order, n, FSDP_PREFETCH_STAGES)
        for stage in [s for s in gathered if s not in upcoming]:
            gathered.remove(stage)
            out.append(Action("RESHARD", stage, None))
        for stage in upcoming:
            if stage not in gathered:
                gathered.add(stage)
                out.append(Action("UNSHARD", stage, None))
        out.append(item)
    for stage in list(gathered):
        gathered.remove(stage)
        out.append(Action("RESHARD", stage, None))
    return out


def _with_reduce_grad(order: list[Item], m: int) -> list[Item]:
    finished: dict[int, int] = {}  # weight gradients done per stage
    out: list[Item] = []
    for item in order:
        out.append(item)
        for a in leaf_actions([item]):
            if a.kind in ("B", "W"):
                finished[a.stage] = finished.get(a.stage, 0) + 1
                if finished[a.stage] == m:
                    out.append(Action("REDUCE_GRAD", a.stage, None))
    return out


def _comm_of(schedule: Schedule, a: Action) -> tuple[Action, Action] | None:
    """The (SEND, RECV) pair carrying ``a``'s output to a stage on another rank, if any."""
    rank = schedule.rank_of_stage
    if a.kind == "F" and a.stage < schedule.num_stages - 1 and rank(a.stage + 1) != rank(a.stage):
        return Action("SEND_F", a.stage, a.microbatch), Action("RECV_F", a.stage + 1, a.microbatch)
    if a.kind in ("B", "I") and a.stage > 0 and rank(a.stage - 1) != rank(a.stage):
        return Action("SEND_B", a.stage, a.microbatch), Action("RECV_B", a.stage - 1, a.microbatch)
    return None


def _input_ready(schedule: Schedule, a: Action, done: set[Action]) -> bool:
    s, j = a.stage, a.microbatch
    if a.kind == "F" and s > 0:
        return Action("RECV_F", s, j) in done or Action("F", s - 1, j) in done
    if a.kind in ("B", "I") and s < schedule.num_stages - 1:
        return any(x in done for x in (Action("RECV_B", s, j), Action("I", s + 1, j), Action("B", s + 1, j)))
    return True


def _with_send_recv(schedule: Schedule, orders: list[list[Item]]) -> list[list[Item]]:
    queues = [deque(order) for order in orders]
    out: list[list[Item]] = [[] for _ in orders]
    done: list[set[Action]] = [set() for _ in orders]
    while any(queues):
        progressed = False
        for rank, queue in enumerate(queues):
            if not queue:
                continue
            item = queue[0]
            subs = list(leaf_actions([item]))
            if not all(_input_ready(schedule, a, done[rank]) for a in subs):
                continue
            out[rank].append(item)
            for a in subs:
                done[rank].add(a)
                comm = _comm_of(schedule, a)
                if comm is not None:
                    send, recv = comm
                    peer = schedule.rank_of_stage(recv.stage)
                    out[rank].append(send)
                    done[rank].add(send)
                    out[peer].append(recv)
                    done[peer].add(recv)
            queue.popleft()
            progressed = True
        if not progressed:
            waits = "; ".join(f"rank {r} at {q[0]}" for r, q in enumerate(queues) if q)
            raise ScheduleError(schedule, f"cannot place sends and receives: every rank waits for an input ({waits})")
    return out


def _defer_receives(schedule: Schedule, rank: int, order: list[Item]) -> list[Item]:
    def peer_of(a: Action) -> int:     # the rank on the other end of a send or receive
        return schedule.rank_of_stage(a.stage + (1 if a.kind in ("SEND_F", "RECV_B") else -1))

    out: list[Item] = []
    pending: dict[Action, None] = {}   # posted-later receives, in arrival order
    for item in order:
        if item.kind in ("RECV_F", "RECV_B"):
            pending[item] = None
            continue
        if item.kind in ("SEND_F", "SEND_B") and rank < peer_of(item):
            for recv in [r for r in pending if peer_of(r) == peer_of(item)]:
                out.append(recv)
                del pending[recv]
        for a in leaf_actions([item]):
            recv = {"F": "RECV_F", "B": "RECV_B", "I": "RECV_B"}.get(a.kind)
            if recv is not None and Action(recv, a.stage, a.microbatch) in pending:
                out.append(Action(recv, a.stage, a.microbatch))
                del pending[Action(recv, a.stage, a.microbatch)]
        out.append(item)
    if pending:
        raise ScheduleError(schedule, f"rank {rank} receives {', '.join(map(str, pending))} but no pass uses them",
                            rank=rank)
    return out

