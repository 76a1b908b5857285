"""What a TP collective costs on a host with more ranks than cores, by what ran before it.

    .venv/bin/python studies/validation_cpu/tp_gap.py TRACE.measured.json --profile P.yaml [...]

tp_gap.txt: the cpu-small tp=2 pp=2 SP 1F1B trace kept in
../zero_bubble/validation_intel_split_i/traces/ with that run's profile.

For every TP collective in measured executor traces (``parsim validate``'s traces/), the call's
length against (a) the compute its rank ran since its previous TP collective ended (the
"gap") and (b) the share of the other pipeline stage's ranks computing over the call (inside
an action, outside their own TP collectives). Beside them, the profile's in-situ prices of the
call: the group's own (``alpha_insitu``, measured on a 2-rank host) and the shared one
(``alpha_insitu_shared``, every rank of the host computing a block of two MLP GEMMs before
each call), each with the bytes term. Reads files only; no timing.
"""
from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from parsim.specs.parse import load_profile_dict
from parsim.specs.profile_parse import cluster_from_dict
from parsim.trace.io import load_trace

OPS = {"tp_allgather": "all_gather", "tp_reducescatter": "reduce_scatter", "tp_allreduce": "all_reduce"}
GAP_BINS_MS = ((0.0, 0.3), (0.3, 0.6), (0.6, 1.2), (1.2, 2.5), (2.5, 20.0))
SHARE_BINS = ((0.0, 0.1), (0.1, 0.5), (0.5, 0.9), (0.9, 1.01))


def overlap(intervals, a: float, b: float) -> float:
    return sum(max(0.0, min(e, b) - max(s, a)) for s, e in intervals)


def calls(trace):
    """(kind, gap s, other stage's compute share, duration s) per TP collective."""
    ev = trace.events
    stage_of = {e.rank: e.stage for e in ev if e.stage >= 0}
    acts = defaultdict(list)
    tps = defaultdict(list)
    for e in ev:
        if e.stream == "compute" and e.layer == -1:
            acts[e.rank].append((e.start, e.end))
        elif e.stream == "tp" and e.end > e.start:
            tps[e.rank].append((e.start, e.end, e.kind))
    out = []
    for r, mine in tps.items():
        mine.sort()
        others = [o for o in tps if stage_of.get(o) != stage_of.get(r)]
        prev_end = None
        for s, e, kind in mine:
            share = statistics.fmean(
                (overlap(acts[o], s, e) - overlap([(a, b) for a, b, _ in tps[o]], s, e)) / (e - s)
                for o in others) if others else float("nan")
            gap = s - prev_end if prev_end is not None else float("nan")
            prev_end = e
            if kind in OPS:
                out.append((kind, gap, share, e - s))
    return out


def price_ms(fit, nbytes: float, shared: bool, host: int) -> float:
    return 1e3 * fit.seconds(nbytes, in_situ=True, host_ranks=host if shared else None, group=2)


def table(rows, index: int, bins, unit: float, label: str) -> None:
    for lo, hi in bins:
        ys = [r[3] * 1e3 for r in rows if lo <= r[index] * unit < hi]
        if ys:
            print(f"    {label} [{lo:g}, {hi:g}): {len(ys):4d} calls, mean {statistics.fmean(ys):5.2f} ms, "
                  f"median {statistics.median(ys):5.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--profile", required=True)
    args = ap.parse_args()
    cluster = cluster_from_dict(load_profile_dict(args.profile), num_devices=4)
    colls = cluster.network.collectives.ops
    for path in args.traces:
        trace = load_trace(path)
        rows = calls(trace)
        host = len(trace.ranks)
        print(f"{path}: {trace.meta.get('plan')} on {host} ranks")
        for kind in sorted({r[0] for r in rows}):
            mine = [r for r in rows if r[0] == kind]
            nbytes = statistics.median(e.bytes for e in trace.events if e.kind == kind)
            per = nbytes / 2 if kind == "tp_allgather" else nbytes      # comm.CALLS: the shard
            fit = colls[OPS[kind]][2]
            ys = [r[3] * 1e3 for r in mine]
            gaps = [r[1] * 1e3 for r in mine if r[1] == r[1]]
            shares = [r[2] for r in mine if r[2] == r[2]]
            print(f"  {kind}: {len(ys)} calls, mean {statistics.fmean(ys):.2f} ms, median "
                  f"{statistics.median(ys):.2f} ms; priced own {price_ms(fit, per, False, host):.2f} ms, "
                  f"shared {price_ms(fit, per, True, host):.2f} ms; gap median {statistics.median(gaps):.2f} ms; "
                  f"other stage computing {statistics.fmean(shares):.2f} of the call")
            table(mine, 1, GAP_BINS_MS, 1e3, "gap ms")
            table(mine, 2, SHARE_BINS, 1.0, "share")


if __name__ == "__main__":
    main()
