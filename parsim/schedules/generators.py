"""Generators for the named pipeline schedules, and their textbook bubble fractions.

Every generator returns a Schedule whose ``actions[r]`` is the order in which pipeline rank
``r`` runs its forward (F) and backward (B) passes. Stages are *virtual* stages, placed in a
loop: rank r holds stages r, r + pp, r + 2 pp, ... (DESIGN.md, "The Schedule IR").

* ``naive``       no pipelining: microbatch j goes forward through every stage, then backward,
                  before microbatch j + 1 starts.
* ``gpipe``       all forwards, then all backwards (Huang et al. 2019, GPipe).
* ``1f1b``        PipeDream-Flush, Megatron-LM's non-interleaved schedule (Narayanan et al.
                  2021, Sec 2.2.1; Megatron-LM ``forward_backward_pipelining_without_interleaving``).
* ``interleaved`` Megatron-LM interleaved 1F1B with ``vpp`` model chunks per rank (Narayanan
                  et al. 2021, Sec 2.2.2; ``forward_backward_pipelining_with_interleaving``).
* ``looped-bfs``  breadth-first looping (Lamy-Poirier 2022, arXiv:2211.05953; torch 2.13
                  ``ScheduleLoopedBFS``): each rank runs every microbatch's forward of its
                  first stage, then of its next, ...; then the backwards, last stage first and
                  microbatches in reverse order.
* ``zb-h1``, ``interleaved-zb``, ``zb-h2``  zero-bubble schedules (``zero_bubble``).
* ``zbv``, ``dualpipev``  V-placed zero-bubble and DualPipeV schedules (``v_schedules``).
"""
from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from parsim.specs import ALL_SCHEDULES, Plan, SpecError
from parsim.specs.codes import GPIPE, INTERLEAVED, ONE_F_ONE_B
from parsim.specs.plan import SCHEDULES

from .bubbles import closed_form_bubble_fraction
from .ir import Action, Item, Schedule, loop_placement, v_placement
from .v_schedules import dualpipev_order, zbv_order
from .zero_bubble import split_backward_1f1b, zb_h2_orders

# Schedules whose stages are placed in a V (rank r holds stages r and 2 pp - 1 - r).
V_PLACED = ("zbv", "dualpipev")
# Schedules whose bubble the closed forms of ``bubbles`` give (at F = I = W = 1 unit)
_CLOSED_FORM = ("zb-h1", "zb-h2", "interleaved-zb", "zbv", "dualpipev", "looped-bfs")


def build_schedule(schedule: str, pp: int, num_microbatches: int, vpp: int = 1) -> Schedule:
    """The named schedule for ``pp`` ranks, ``num_microbatches`` microbatches and ``vpp``
    virtual stages per rank. Bad arguments raise SpecError naming the field."""
    _check_arguments(schedule, pp, num_microbatches, vpp)
    if schedule == "zb-h2":
        orders = zb_h2_orders(pp, num_microbatches)
    else:
        rank_actions = _GENERATORS[schedule]
        orders = [rank_actions(rank, pp, num_microbatches, vpp) for rank in range(pp)]
    placement = v_placement(pp, vpp) if schedule in V_PLACED else None
    return Schedule(name=schedule, pp=pp, vpp=vpp, num_microbatches=num_microbatches,
                    actions=tuple(tuple(order) for order in orders), placement=placement)


@lru_cache(maxsize=256)
def cached_schedule(schedule: str, pp: int, num_microbatches: int, vpp: int = 1) -> Schedule:
    """``build_schedule``, remembered (a Schedule is immutable): the engines that walk a
    generated schedule per plan key (``costs.inflight``, ``fast.dag``) build each once."""
    return build_schedule(schedule, pp, num_microbatches, vpp)


def default_vpp(schedule: str) -> int:
    """The vpp a schedule takes when none is given: 2 for the V-placed ones, else 1."""
    return 2 if schedule in V_PLACED else 1


def build_schedule_for_plan(plan: Plan) -> Schedule:
    """The schedule a Plan asks for: ``plan.schedule`` over ``plan.pp`` ranks with
    ``gbs / (dp * mbs)`` microbatches and ``plan.vpp`` virtual stages per rank; for
    ``schedule=csv:FILE``, the checked schedule in the file (``csv_io``), with compute actions
    only (the engines imply the sends; ``lowering.compute_only``)."""
    if plan.gbs % (plan.dp * plan.mbs):
        raise SpecError("gbs", plan.gbs, f"must be divisible by dp*mbs={plan.dp * plan.mbs}")
    m = plan.num_microbatches
    if plan.schedule_file is not None:
        return _csv_schedule(plan.schedule_file, plan.pp, m, plan.vpp)
    if plan.schedule == "interleaved" and plan.vpp >= 2 and plan.pp >= 2 and m % plan.pp:
        raise SpecError("gbs", plan.gbs, f"interleaved schedule needs microbatches (gbs/(dp*mbs)={m}) "
                        f"divisible by pp={plan.pp}")
    return build_schedule(plan.schedule, plan.pp, m, plan.vpp)


def stage_placement(plan: Plan) -> tuple[int, ...]:
    """The pipeline rank of every virtual stage of the plan's schedule: the V for zbv and
    dualpipev, the file's for a CSV schedule, else the loop (rank r holds r, r + pp, ...)."""
    if plan.schedule in V_PLACED:
        return v_placement(plan.pp, plan.vpp)
    if plan.schedule_file is not None:
        schedule = build_schedule_for_plan(plan)
        return tuple(schedule.rank_of_stage(s) for s in range(schedule.num_stages))
    return loop_placement(plan.pp, plan.vpp)


_CSV_CACHE: dict[tuple, Schedule] = {}


def _csv_schedule(path: str, pp: int, m: int, vpp: int) -> Schedule:
    """The compute-only schedule of a CSV file, read once per (file, its modification time, shape)."""
    from .csv_io import load_schedule_csv
    from .lowering import compute_only
    try:
        stamp = Path(path).stat().st_mtime_ns
    except OSError:
        stamp = None
    key = (str(Path(path).resolve()), stamp, pp, m, vpp)
    if stamp is None or key not in _CSV_CACHE:
        schedule = load_schedule_csv(path, pp, num_microbatches=m, vpp=vpp)
        _CSV_CACHE[key] = compute_only(schedule)
    return _CSV_CACHE[key]


def textbook_bubble_fraction(schedule_name: str, pp: int, m: int, vpp: int = 1) -> float | None:
    """Idle fraction of a pipeline step, ``1 - busy / (pp * makespan)``, as the papers give it,
    for ``m`` microbatches, with no communication time and equal-cost stages. The
    zero-bubble family's forms depend on the pass times: they are taken at the unit times of
    ``check_schedule`` (F = I = W = 1 per chunk; ``bubbles``), and None where no published
    form covers the schedule."""
    _check_arguments(schedule_name, pp, m, vpp)
    p, v = pp, vpp
    if schedule_name in _CLOSED_FORM:
        return closed_form_bubble_fraction(schedule_name, pp, m, vpp, t_f=1, t_b=2, t_w=1)
    if schedule_name == "naive":
        # naive model parallelism (Huang et al. 2019, Fig. 2b): one stage busy at a time, so
        # each rank works 1/p of the step
        return (p - 1) / p
    if schedule_name in ("gpipe", "1f1b"):
        # Huang et al. 2019 (GPipe), Sec 2.2: bubble O((p-1)/(m+p-1));
        # Narayanan et al. 2021, Eq. 1: t_pb / t_id = (p-1)/m, i.e. (p-1)/(m+p-1) of the total.
        return (p - 1) / (m + p - 1)
    # interleaved: Narayanan et al. 2021, Sec 2.2.2: bubble time shrinks by v,
    # t_pb / t_id = (p-1)/(v m), i.e. (p-1)/(v m + p - 1) of the total.
    return (p - 1) / (v * m + p - 1)


def warmup_forwards(schedule_name: str, rank: int, pp: int, num_microbatches: int, vpp: int = 1) -> int:
    """Forward passes rank ``rank`` runs before its first backward (1F1B and interleaved:
    Megatron-LM ``num_warmup_microbatches``; counted in model chunks for interleaved)."""
    code = SCHEDULES.index(schedule_name) if schedule_name in SCHEDULES else -1
    return warmup_chunks(code, rank, pp, num_microbatches, vpp)


def warmup_chunks(schedule: int, rank: int, pp: int, num_microbatches: int, vpp: int) -> int:
    """``warmup_forwards`` for the schedule's code (``specs.codes``): plain arithmetic, so the
    fast path's kernels compile it (``fast.rules``)."""
    p, m, v = pp, num_microbatches, vpp
    if schedule == ONE_F_ONE_B:
        return min(p - rank - 1, m)
    if schedule == INTERLEAVED:
        total = m * v
        if m == p:
            # Megatron-LM: with as many microbatches as ranks, every forward runs first.
            return total
        return min(2 * (p - rank - 1) + (v - 1) * p, total)
    if schedule == GPIPE:
        return m
    return 0


# --- per-rank action orders ------------------------------------------------------------------

def _naive(rank: int, pp: int, m: int, vpp: int) -> list[Action]:
    actions = []
    for j in range(m):
        actions.append(Action("F", rank, j))
        actions.append(Action("B", rank, j))
    return actions


def _gpipe(rank: int, pp: int, m: int, vpp: int) -> list[Action]:
    # GPipe (and torch's ScheduleGPipe) runs the backwards in microbatch order.
    return [Action("F", rank, j) for j in range(m)] + [Action("B", rank, j) for j in range(m)]


def _one_f_one_b(rank: int, pp: int, m: int, vpp: int) -> list[Action]:
    # Megatron-LM forward_backward_pipelining_without_interleaving: warm-up forwards, then
    # steady state "one forward, one backward", then cool-down backwards.
    warmup = warmup_forwards("1f1b", rank, pp, m)
    actions = [Action("F", rank, j) for j in range(warmup)]
    steady = m - warmup
    for k in range(steady):
        actions.append(Action("F", rank, warmup + k))
        actions.append(Action("B", rank, k))
    actions.extend(Action("B", rank, k) for k in range(steady, m))
    return actions


def _interleaved(rank: int, pp: int, m: int, vpp: int) -> list[Action]:
    # Megatron-LM forward_backward_pipelining_with_interleaving: warm-up forwards, then
    # "one forward, one backward", then cool-down backwards, each pass on the chunk
    # ``chunk_of_pass`` gives; chunk c of rank r is virtual stage c*pp + r.
    total = m * vpp
    warmup = warmup_forwards("interleaved", rank, pp, m, vpp)

    def forward(k: int) -> Action:
        return Action("F", chunk_of_pass(k, pp, vpp) * pp + rank, _microbatch_of(k, pp, vpp))

    def backward(k: int) -> Action:
        return Action("B", chunk_of_pass(k, pp, vpp, backward=True) * pp + rank, _microbatch_of(k, pp, vpp))

    actions = [forward(k) for k in range(warmup)]
    steady = total - warmup
    for k in range(steady):
        actions.append(forward(warmup + k))
        actions.append(backward(k))
    actions.extend(backward(k) for k in range(steady, total))
    return actions


def chunk_of_pass(k: int, pp: int, vpp: int, backward: bool = False) -> int:
    """Model chunk of a rank's k-th forward (backward) pass in interleaved 1F1B: groups of pp
    microbatches cycle through the chunks 0..v-1 (v-1..0 for backward) (Megatron-LM
    ``get_model_chunk_id``). With one chunk (every other schedule) always 0."""
    position = (k % (pp * vpp)) // pp
    return vpp - 1 - position if backward else position


def passes_by_chunk(n: int, pp: int, vpp: int, backward: bool = False) -> list[int]:
    """How many of a rank's first n forward (backward) passes ran each of its chunks
    (``chunk_of_pass`` counted): p floor(n / pv) + clip(n mod pv - position p, 0, p), position
    = c for forwards, v - 1 - c for backwards. With one chunk: [n]."""
    cycles, rest = divmod(n, pp * vpp)
    done = [pp * cycles + min(max(rest - position * pp, 0), pp) for position in range(vpp)]
    return done[::-1] if backward else done


def held_at_backwards(schedule_name: str, rank: int, pp: int, num_microbatches: int, vpp: int,
                      count: int) -> list[tuple[int, ...]]:
    """For each of the rank's first ``count`` backwards: the microbatches of each of its model
    chunks whose forward has run and whose backward has not as it starts. Every generator here
    runs ``warmup_forwards`` forwards, then forward/backward pairs, then the remaining
    backwards, so as backward k starts min(W + k + 1, m v) forwards and k backwards have run."""
    warmup = warmup_forwards(schedule_name, rank, pp, num_microbatches, vpp)
    total = num_microbatches * vpp
    held = passes_by_chunk(min(warmup + 1, total), pp, vpp)
    out = []
    for k in range(count):
        out.append(tuple(held))
        held[chunk_of_pass(k, pp, vpp, backward=True)] -= 1       # backward k ends
        if warmup + k + 1 < total:
            held[chunk_of_pass(warmup + k + 1, pp, vpp)] += 1      # the next forward starts
    return out


def _microbatch_of(k: int, pp: int, vpp: int) -> int:
    """Microbatch of a rank's k-th chunk pass (Megatron-LM ``get_microbatch_id_in_model_chunk``
    with a group size of pp): groups of pp microbatches, each group visiting every chunk."""
    return (k // (pp * vpp)) * pp + k % pp


def _looped_bfs(rank: int, pp: int, m: int, vpp: int) -> list[Action]:
    # torch 2.13 ScheduleLoopedBFS: breadth first -- all microbatches through one local stage
    # before the next; backwards from the last local stage, microbatches in reverse order
    stages = [rank + c * pp for c in range(vpp)]
    return ([Action("F", s, j) for s in stages for j in range(m)]
            + [Action("B", s, j) for s in reversed(stages) for j in reversed(range(m))])


_GENERATORS: dict[str, Callable[[int, int, int, int], list[Item]]] = {
    "naive": _naive,
    "gpipe": _gpipe,
    "1f1b": _one_f_one_b,
    "interleaved": _interleaved,
    "looped-bfs": _looped_bfs,
    "zb-h1": split_backward_1f1b,
    "interleaved-zb": split_backward_1f1b,
    "zbv": lambda rank, pp, m, vpp: zbv_order(rank, pp, m),
    "dualpipev": lambda rank, pp, m, vpp: dualpipev_order(rank, pp, m),
}
# vpp each schedule accepts: (least, most); None = no upper bound
_VPP_RANGE = {"interleaved": (2, None), "interleaved-zb": (2, None), "looped-bfs": (1, None),
              "zbv": (2, 2), "dualpipev": (2, 2)}


def _check_arguments(schedule: str, pp: int, m: int, vpp: int) -> None:
    if schedule not in ALL_SCHEDULES:
        raise SpecError("schedule", schedule, f"one of {', '.join(ALL_SCHEDULES)}")
    for field, value in (("pp", pp), ("num_microbatches", m), ("vpp", vpp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecError(field, value, "a positive integer")
    least, most = _VPP_RANGE.get(schedule, (1, 1))
    if most == 1 and vpp != 1:
        raise SpecError("vpp", vpp, "vpp > 1 needs schedule=interleaved, interleaved-zb, looped-bfs, zbv or "
                        f"dualpipev (schedule is {schedule})")
    if vpp < least or (most is not None and vpp > most):
        wanted = f"vpp >= {least}" if most is None else f"vpp={most}"
        raise SpecError("vpp", vpp, f"{schedule} schedule needs {wanted}")
    if schedule == "interleaved":
        if pp < 2:
            raise SpecError("pp", pp, "interleaved schedule needs pp >= 2")
        if m % pp:
            raise SpecError("num_microbatches", m, f"interleaved schedule needs a multiple of pp={pp}")
    if schedule == "interleaved-zb" and m % max(1, m // pp):
        rounds = max(1, m // pp)
        raise SpecError("num_microbatches", m, f"interleaved-zb runs microbatches in max(1, m // pp)={rounds} "
                        f"rounds of equal size: needs a multiple of {rounds}")
    if schedule == "dualpipev" and m < 2 * pp:
        raise SpecError("num_microbatches", m,
                        f"dualpipev needs at least as many microbatches as stages, 2*pp={2 * pp}")
