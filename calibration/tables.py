"""Measured samples -> the calibrated tables of a profile (``parsim.specs.CalibratedTables``
and ``CollectiveTables``). Pure: numbers in, typed tables out; ``profile.build_profile``
assembles them, ``layer_terms`` derives the terms that depend on how ops are priced.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from parsim.specs import AttentionTable, CollectiveFit, CollectiveTables, RankCurve
from parsim.specs.collectives import InsituFit
from parsim.specs.surfaces import LeaveOut

from .comm import CALLS
from .fit import AlphaBeta, Summary, fit_alpha_beta_knee, summarize
from .shapes import OP_NAME_ALIASES
from .surface_fit import leave_out

# parsim.costs.ops / timing: causal fused attention executes half of the counted 4 b s^2 h d
# FLOPs (Dao 2023, Sec. 3.1.1) and its backward counts 2.5x the forward (Dao 2022, Sec. 3.1).
CAUSAL_FRACTION = 0.5
ATTENTION_BWD_FACTOR = 2.5


def membound_table(results, overhead: float, norm: str) -> dict[str, dict]:
    """bytes/s per op = counted bytes (fwd + bwd) / (measured time - per-op overhead), so
    timing.membound_time (bytes / bw + overhead per pass) gives back the measured time;
    the median over the model's sizes (tp, mbs) stands for the op. Returns the ops
    ``measured``, the ``table`` (with the aliases of ``shapes.OP_NAME_ALIASES``) and the
    per-size ``detail`` rows (source, fwd bytes, fwd s, bwd s)."""
    per_op: dict[str, list[float]] = {}
    detail: dict[str, list] = {}
    for p, fwd, bwd in results:
        passes = 1 if bwd is None else 2
        seconds = fwd.median + (bwd.median if bwd else 0.0)
        busy = max(seconds - passes * overhead, 0.2 * seconds)   # never credit more than 5x
        per_op.setdefault(p.name, []).append((p.fwd_bytes + p.bwd_bytes) / busy)
        detail.setdefault(p.name, []).append((p.source, float(p.fwd_bytes), fwd.median, bwd.median if bwd else 0.0))
    measured = {k: float(np.median(v)) for k, v in per_op.items()}
    table = dict(measured)
    for alias, target in OP_NAME_ALIASES.items():
        target = target.format(norm=norm)
        if target in measured:
            table[alias] = measured[target]
    return {"measured": measured, "table": table, "detail": {k: tuple(v) for k, v in detail.items()}}


def attention_table(results) -> AttentionTable:
    """Rows (batch x heads, seq, head_dim, forward s, backward s) of measured attention."""
    return AttentionTable(tuple((p.batch_heads, p.seq, p.head_dim, fwd.median, bwd.median) for p, fwd, bwd in results))


def attention_efficiency(results, peak: float, overhead: float) -> float:
    """Achieved fraction of peak on the executed FLOPs of fused causal attention, so that
    timing.op_time's fallback reproduces the measured fwd + bwd time."""
    if not results:
        return 0.5
    effs = []
    for p, fwd, bwd in results:
        executed = CAUSAL_FRACTION * p.fwd_flops * (1.0 + ATTENTION_BWD_FACTOR)
        busy = max(fwd.median + bwd.median - 2 * overhead, 0.2 * (fwd.median + bwd.median))
        effs.append(executed / (peak * busy))
    return float(np.median(effs))


def group_samples(rank_results: list[dict], op: str) -> dict[int, Summary]:
    """Per size: the max over ranks of each sample (a collective ends with its slowest rank)."""
    per_rank = [r["collectives"][op] for r in rank_results if op in r["collectives"]]
    out = {}
    for size in per_rank[0]:
        samples = np.max(np.array([pr[size] for pr in per_rank]), axis=0)
        out[int(size)] = summarize(samples.tolist())
    return out


def collective_fits(comm: dict[int, list[dict]]) -> CollectiveTables:
    """alpha + beta * x per collective and group size from the collectives jobs' results
    {world: per-rank results of ``comm.run_comm_job``}, with the in-situ latencies where the
    job timed them (``insitu_fit``). Fitted to each size's *mean* over its samples, not the
    median: a step pays the sum of its collectives, so their mean, and a 2-rank gloo
    collective's samples on a shared host fall in two groups (0.25-0.4 ms and 1.2-1.8 ms at
    16 KiB on the 2-core VM) whose median jumps between them from one size to the next, where
    the mean moves by half as much (a bootstrap of 316 samples: 14 % against 27 % over 10
    samples a point, leave-one-out over ten sizes)."""
    table = CollectiveTables({})
    for world, ranks in sorted(comm.items()):
        for op in ranks[0]["collectives"]:
            pts = group_samples(ranks, op)
            sizes = sorted(pts)
            ab: AlphaBeta = fit_alpha_beta_knee(sizes, [pts[s].mean for s in sizes])
            n = 2 if op == "send_recv" else world
            fit = CollectiveFit(alpha=ab.alpha, beta=ab.beta, knee=ab.knee, beta_beyond=ab.beta_beyond,
                                call=CALLS.get(op, op),
                                spread=float(np.median([pts[s].rel_spread for s in sizes])), fit_rms_rel=ab.rms_rel,
                                points=tuple((s, pts[s].mean, pts[s].p10, pts[s].p90) for s in sizes))
            insitu = ranks[0].get("insitu", {}).get(op)
            if insitu and n == world:
                fit = fit.with_insitu(insitu_fit(insitu, fit.bytes_seconds))
            table = table.with_fit(op, n, fit)
    # smaller TP groups measured in situ while all ``world`` ranks share the host
    for world, ranks in sorted(comm.items()):
        blocks = ranks[0].get("insitu_group_blocks", {})
        for n, per_op in sorted(ranks[0].get("insitu_groups", {}).items()):
            for op, samples in per_op.items():
                fit = (table.ops.get(op) or {}).get(n)
                if fit is not None:
                    insitu = insitu_fit(samples, fit.bytes_seconds)
                    table = table.with_fit(op, n, fit.with_insitu(insitu, host_ranks=world, block_s=blocks.get(n)))
    return table


def collective_leave_out(table: CollectiveTables) -> dict[str, LeaveOut]:
    """The leave-out error of every collective's alpha + beta x fit (with its knee where the
    other sizes show one, ``fit.fit_alpha_beta_knee``) over its message sizes
    (``collective.<op>.<group size>``): each size's time (``collective_fits``) predicted by the
    fit of the other sizes (leave-one-out; ``surface_fit.leave_out``), |predicted / measured - 1|.
    Needs three sizes: two to fit, one left out."""
    report = {}
    for op, n, fit in table.entries():
        sizes = np.array([p[0] for p in fit.points], dtype=float)
        seconds = np.array([p[1] for p in fit.points], dtype=float)
        if len(sizes) < 3:
            continue
        report[f"collective.{op}.{n}"] = leave_out(
            len(sizes), lambda idx: fit_alpha_beta_knee(sizes[idx], seconds[idx]),
            lambda ab, idx: ab.time(sizes[idx]), seconds, folds=len(sizes))
    return report


def insitu_fit(samples: dict, bytes_seconds: Callable[[float], float]) -> InsituFit:
    """The in-situ latency of one collective and group size from the in-situ samples
    {per-rank bytes: [seconds per collective]} (``insitu.measure_insitu``; every rank holds
    the same, already reduced over the group): the latency that, with the back-to-back fit's
    bytes time ``bytes_seconds(x)`` (the bytes cost the same; ``CollectiveFit.bytes_seconds``),
    gives the in-situ time, alpha_insitu + bytes_seconds(x) [s]. The median over every sample
    of (t - bytes_seconds(x)), so a few slow samples do not move it."""
    pts = {int(x): summarize(v) for x, v in samples.items()}
    alpha = float(np.median([t - bytes_seconds(int(x)) for x, v in samples.items() for t in v]))
    return InsituFit(alpha=max(alpha, 0.0),
                     points=tuple((x, pts[x].median, pts[x].p10, pts[x].p90) for x in sorted(pts)))


def contention_curve(comm: dict[int, list[dict]], key: str) -> RankCurve:
    """Slowdown of one rank when ``world`` ranks run the same kernel at once (1.0 = none): the
    median over the alternating rounds ``key`` of ``comm._alternating_rounds``
    (``round_ratios``), for every group size whose ranks all measured them."""
    return RankCurve(((1, 1.0), *((world, float(np.median(round_ratios(ranks, key))))
                                  for world, ranks in sorted(comm.items()) if all(r.get(key) for r in ranks))))


def round_ratios(ranks: list[dict], key: str) -> list[float]:
    """Per alternating round: the host's seconds per call while every rank calls at once (the
    ranks' calls over one window: the harmonic mean of their seconds per call, what each rank
    gets when the host's rate is shared equally, as the host model shares it) over rank 0's
    solo seconds per call, both timed in the same round (``comm._alternating_rounds``)."""
    rounds = ranks[0][key]
    return [len(ranks) / sum(1.0 / r[key][i][1] for r in ranks) / rounds[i][0] for i in range(len(rounds))]


def message_cpu_curves(comm: dict[int, list[dict]]) -> tuple[RankCurve | None, ...]:
    """(send, receive, per byte) CPU seconds of one pipeline message per group size
    (``p2p_cpu``). A line of ``world`` ranks carries world - 1 messages per block, so at each
    message size one message costs the ranks' summed extra CPU (the median over samples of each
    rank's) over world - 1; two sizes give c0 + k x. c0 is split by the end ranks' ratio at the
    first size (the first rank only sends, the last only receives); k (seconds per byte of one
    message, sender and receiver together) is kept whole. All at least 0; None where no job
    measured them."""
    worlds = [(w, ranks) for w, ranks in sorted(comm.items()) if w > 1 and all(r.get("message_cpu") for r in ranks)]
    if not worlds:
        return None, None, None
    send, recv, per_byte = [], [], []
    for w, ranks in worlds:
        sizes = sorted(ranks[0]["message_cpu"])
        per_rank = {x: [max(float(np.median(r["message_cpu"][x])), 0.0) for r in ranks] for x in sizes}
        total = {x: sum(v) / (w - 1) for x, v in per_rank.items()}
        small, large = sizes[0], sizes[-1]
        k = max((total[large] - total[small]) / (large - small), 0.0) if large > small else 0.0
        c0 = max(total[small] - k * small, 0.0)
        ends = per_rank[small][0] + per_rank[small][-1]
        share = per_rank[small][0] / ends if ends > 0 else 0.5
        send.append((w, c0 * share))
        recv.append((w, c0 * (1 - share)))
        per_byte.append((w, k))
    return RankCurve(tuple(send)), RankCurve(tuple(recv)), RankCurve(tuple(per_byte))


def message_hold_curve(comm: dict[int, list[dict]], cores: int) -> RankCurve | None:
    """Seconds a pipeline receive returns late, beyond the transfer, where the ranks outnumber the
    host's ``cores``, per group size (``p2p_cpu``'s stamps at the first message size). Per sample,
    the mean over every receive of the line of its return less max(its call, the matching send's
    call) (rank r's k-th receive is rank r - 1's k-th send), the median over samples: H(w). Where
    the ranks fit on the cores that is the transfer itself, so the hold is H(w) less H at the
    largest such group (0 there; H(w) whole where no group fits). None where no job measured it."""
    worlds = {w: ranks for w, ranks in sorted(comm.items())
              if w > 1 and all(r.get("message_stamps") for r in ranks)}
    if not worlds:
        return None
    late = {}
    for w, ranks in worlds.items():
        size = min(ranks[0]["message_stamps"])
        samples = zip(*(r["message_stamps"][size] for r in ranks))      # per sample: every rank's stamps
        late[w] = float(np.median([np.mean([ret - max(call, sent)
                                            for r in range(1, w)
                                            for sent, call, ret in zip(sample[r - 1][0], sample[r][1], sample[r][2])])
                                   for sample in samples]))
    fitting = [w for w in late if w <= cores]
    base = late[max(fitting)] if fitting else 0.0
    return RankCurve(tuple((w, 0.0 if w <= cores else max(h - base, 0.0)) for w, h in late.items()))


def send_hold_curve(comm: dict[int, list[dict]], cores: int) -> RankCurve | None:
    """Seconds a pipeline send's ``isend`` call holds its rank's thread beyond the CPU the profile
    charges for it elsewhere, per group size (``p2p_cpu``'s stamps at the first message size).
    Per sample, the mean over every send of the line of its call's wall time, less its thread
    CPU where the ranks outnumber the ``cores`` (that CPU is in ``p2p_send_cpu``, charged there;
    where they fit nothing charges it); the median over samples, at least 0. None where no job
    stamped its sends' returns (``run_line``'s 4th and 5th lists; profiles before format 18).
    On 2026-12-02's Zen 4 VM the executor's 128 KiB sends: 0.23-0.32 ms mean, 0.17-0.19 ms of it
    CPU, on 2 ranks; 0.95-1.03 ms, 0.17-0.20 ms CPU, on 4 over 2 cores
    (``studies/validation_cpu/send_call.txt``)."""
    def stamped(r: dict) -> bool:
        return bool(r.get("message_stamps")) and all(len(x) >= 5 for xs in r["message_stamps"].values() for x in xs)
    worlds = {w: ranks for w, ranks in sorted(comm.items()) if w > 1 and all(stamped(r) for r in ranks)}
    if not worlds:
        return None
    held = []
    for w, ranks in worlds.items():
        size = min(ranks[0]["message_stamps"])
        per_sample = []
        for sample in zip(*(r["message_stamps"][size] for r in ranks)):
            calls = [(done - call) - (cpu if w > cores else 0.0)
                     for stamps in sample for call, done, cpu in zip(stamps[0], stamps[3], stamps[4])]
            per_sample.append(float(np.mean(calls)) if calls else 0.0)
        held.append((w, max(float(np.median(per_sample)), 0.0)))
    return RankCurve(tuple(held))


def interference_curve(comm: dict[int, list[dict]]) -> RankCurve:
    """Compute seconds lost per second of overlapped all-reduce (``interference.measure_interference``), per
    group size: the median over ranks and samples."""
    return RankCurve(tuple((world, float(np.median([x for r in ranks for x in r.get("interference", [])])))
                           for world, ranks in sorted(comm.items()) if any(r.get("interference") for r in ranks)))


def spreads(gemm, attention, membound, collectives: CollectiveTables) -> dict[str, Any]:
    """Median relative spread (p90 - p10) / median of each kind of measurement."""
    def med(xs):
        return float(np.median(xs)) if xs else 0.0
    return {
        "gemm": med([s.rel_spread for _, s in gemm]),
        "attention": med([f.rel_spread for _, f, _ in attention]),
        "membound": med([f.rel_spread for _, f, _ in membound]),
        "collectives": med([f.spread for _, _, f in collectives.entries()]),
        "measure": "median over points of (p90 - p10) / median",
    }
