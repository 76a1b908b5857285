"""Published closed forms of the pipeline bubble, as idle time per rank in one step.

Times are per virtual-stage chunk (seconds, or any unit: the forms are linear): ``t_f``
forward, ``t_b`` full backward, ``t_i`` / ``t_w`` its input- and weight-gradient parts
(t_b = t_i + t_w), ``t_fb`` an overlapped forward + backward slot (DualPipe's F&B).
Idle time per rank = makespan - that rank's busy time, with no communication time and
equal-cost stages; the bubble fraction is idle / makespan. Every form here is checked
against the dry run (``dryrun.dry_run``) in tests/test_schedules_zero_bubble.py, inside the
validity range the function enforces (it returns None outside it).

In one step whose optimizer step waits for every rank (as parsim's engines model a step),
no schedule idles less than (p-1) t_f per rank: the last rank's first forward waits for the
p-1 before it, and every rank has the same work. ZB-H2 and ZBV reach that bound; Qi et al.
2023 call them zero-bubble because, once the optimizer synchronisation is bypassed (their
Sec 4), consecutive steps tile and that warm-up ramp overlaps the previous step's tail.
"""
from __future__ import annotations

from numbers import Real


def closed_form_idle_time(schedule: str, pp: int, m: int, vpp: int = 1, *, t_f: Real, t_b: Real,
                          t_w: Real | None = None, t_fb: Real | None = None) -> Real | None:
    """Idle time per rank of ``schedule`` from its published closed form (for DualPipeV
    with a real overlap gain, the largest over the ranks), or None where no published form
    covers these arguments."""
    p = pp
    t_w = t_b / 2 if t_w is None else t_w
    t_i = t_b - t_w
    t_fb = t_f + t_b if t_fb is None else t_fb
    if schedule == "naive":
        # naive model parallelism (Huang et al. 2019, Fig. 2b): one stage busy at a time
        return (p - 1) * m * (t_f + t_b)
    if schedule in ("gpipe", "1f1b"):
        # Narayanan et al. 2021, Eq. 1: bubble time (p-1)(t_f + t_b)
        return (p - 1) * (t_f + t_b)
    if schedule == "interleaved" and m % p == 0:
        # Narayanan et al. 2021, Sec 2.2.2: (p-1)(t_f + t_b) / v with stage times, i.e.
        # (p-1)(t_f + t_b) with the per-chunk times used here
        return (p - 1) * (t_f + t_b)
    if schedule == "looped-bfs" and m >= p:
        # Lamy-Poirier 2022 (arXiv:2211.05953), Sec 3: looping over v stages per rank cuts the
        # bubble v-fold, breadth-first as depth-first: (p-1)(t_f + t_b) per chunk
        return (p - 1) * (t_f + t_b)
    if schedule == "zb-h1" and m >= p and t_w <= min(t_f, t_i):
        # Qi et al. 2023, Table 1: ZB-H1 bubble (p-1)(T_F + T_B - T_W) with T_B the input
        # gradient; DeepSeek-AI 2024, Table 2 writes it (PP-1)(F + B - 2W) with B the full
        # backward. Needs W no longer than F and I (the Ws must fit the 1F1B cool-down gaps).
        return (p - 1) * (t_f + t_i - t_w)
    equal = t_f == t_i == t_w
    if schedule in ("zb-h2", "zbv") and equal and m >= 2 * p - 1:
        # Qi et al. 2023, Sec 3.1 (ZB-H2) and Sec 6 (ZB-V): zero bubble at T_F = T_B = T_W once
        # the optimizer sync is bypassed; within a synchronised step the (p-1) t_f ramp
        return (p - 1) * t_f
    if (schedule == "dualpipev" and m >= 2 * p and t_f == t_i and t_w <= t_f
            and max(t_f, t_b) <= t_fb <= t_f + t_b):
        # DeepSeek-AI 2024 (DeepSeek-V3 report), Table 2, and DeepSeek's DualPipe README for
        # DualPipeV: (PP/2 - 1)(F&B + B - 3W) with PP = 2p stages on p ranks, F&B = t_fb
        return (p - 1) * (t_fb + t_b - 3 * t_w)
    return None


def closed_form_bubble_fraction(schedule: str, pp: int, m: int, vpp: int = 1, *, t_f: Real, t_b: Real,
                                t_w: Real | None = None) -> Real | None:
    """Idle / makespan from ``closed_form_idle_time`` for a schedule whose ranks all do the
    same work, m * vpp * (t_f + t_b) (no overlap gain); None where no closed form applies."""
    idle = closed_form_idle_time(schedule, pp, m, vpp, t_f=t_f, t_b=t_b, t_w=t_w)
    if idle is None:
        return None
    busy = m * vpp * (t_f + t_b)
    return idle / (idle + busy)
