"""Demo of parsim's plots on a synthetic step, so their look can be reviewed without an engine.

Builds a 1F1B step (p=4 pipeline ranks, m=8 microbatches, 2 layers per stage) by hand: each
F/B action is one whole-action event with per-layer compute events inside, separated by
blocking TP all-reduces (2 per layer per direction, Megatron-style); backward recomputes each
layer's forward first (hatched); PP send/recv after every action; DP gradient all-reduce per
layer bucket after the last backward, then the optimizer. Plus a memory breakdown and memory
over time derived from the same step. Writes PNGs (and the Chrome trace) next to this file.

    .venv/bin/python studies/plots_demo/make_demo_plots.py
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from parsim.plots import plot_memory_breakdown, plot_memory_over_time, plot_timeline, plot_timeline_pair
from parsim.trace import Event, Trace, action_name, save_chrome_trace, summary

OUT = Path(__file__).resolve().parent
MS = 1e-3
GIB = 2.0 ** 30

P, M, LAYERS = 4, 8, 2
T_LAYER_F = 1.0 * MS        # compute of one layer's forward, seconds (synthetic)
T_TP = 0.08 * MS            # one TP all-reduce
T_P2P = 0.15 * MS           # one pipeline send/recv
T_DP = 0.9 * MS             # one layer bucket's DP all-reduce
T_OPT = 0.6 * MS
FLOPS_LAYER_F = 2e12        # per layer forward (synthetic)


def one_f_one_b(rank: int) -> list[tuple[str, int]]:
    """(kind, microbatch) order of PipeDream-Flush 1F1B (Narayanan et al. 2021, Fig. 4)."""
    warm = min(P - 1 - rank, M)
    order = [("F", j) for j in range(warm)]
    for j in range(M - warm):
        order += [("F", warm + j), ("B", j)]
    return order + [("B", j) for j in range(M - warm, M)]


def action_events(rank: int, kind: str, mb: int, start: float) -> list[Event]:
    """The whole-action event, its layer events and its blocking TP all-reduces."""
    out, t = [], start
    for layer in range(LAYERS):
        if kind == "B":    # recompute the layer's forward, then its backward (2x forward FLOPs)
            out.append(Event(rank, rank, "compute", "R", mb, layer, t, t + T_LAYER_F, flops=FLOPS_LAYER_F))
            t += T_LAYER_F
        scale = 2.0 if kind == "B" else 1.0
        for half in range(2):  # attention, then MLP; each ends in a TP all-reduce
            dt = scale * T_LAYER_F / 2
            out.append(Event(rank, rank, "compute", kind, mb, layer, t, t + dt, flops=scale * FLOPS_LAYER_F / 2))
            out.append(Event(rank, rank, "tp", "tp_allreduce", mb, layer, t + dt, t + dt + T_TP, bytes=64e6))
            t += dt + T_TP
    flops = sum(e.flops for e in out)
    out.append(Event(rank, rank, "compute", kind, mb, -1, start, t, flops=flops, name=action_name(kind, rank, mb)))
    return out


def build_1f1b_trace() -> Trace:
    done: dict[tuple[str, int, int], float] = {}      # (kind, stage, mb) -> end time
    free = [0.0] * P
    todo = [one_f_one_b(r) for r in range(P)]
    events: list[Event] = []
    while any(todo):
        for r in range(P):
            while todo[r]:
                kind, mb = todo[r][0]
                dep = (("F", r - 1, mb) if r > 0 else None) if kind == "F" else \
                      (("B", r + 1, mb) if r < P - 1 else ("F", r, mb))
                if dep is not None and dep not in done:
                    break
                ready = done[dep] + (T_P2P if dep and dep[1] != r else 0.0) if dep else 0.0
                evs = action_events(r, kind, mb, max(free[r], ready))
                end = max(e.end for e in evs)
                events += evs
                done[(kind, r, mb)] = free[r] = end
                peer = r + 1 if kind == "F" else r - 1
                if 0 <= peer < P:
                    events.append(Event(r, r, "pp", "send", mb, -1, end, end + T_P2P, bytes=32e6))
                    events.append(Event(peer, peer, "pp", "recv", mb, -1, end, end + T_P2P, bytes=32e6))
                todo[r].pop(0)
    for r in range(P):      # DP all-reduce of each layer's gradient bucket, then the optimizer step
        last_b = [e for e in events if e.rank == r and e.kind == "B" and e.microbatch == M - 1 and e.layer >= 0]
        t = 0.0
        for layer in range(LAYERS):
            ready = max(e.end for e in last_b if e.layer == layer)
            t = max(t, ready)
            events.append(Event(r, r, "dp", "dp_allreduce", -1, layer, t, t + T_DP, bytes=200e6))
            t += T_DP
        events.append(Event(r, -1, "compute", "optimizer", -1, -1, t, t + T_OPT, name="optimizer"))
    return Trace(events, meta={"engine": "synthetic", "plan": f"pp={P} tp=2 dp=2 schedule=1f1b", "world_size": P})


def memory_timeline(trace: Trace) -> dict[int, list[tuple[float, dict[str, float]]]]:
    """Activations grow by one microbatch's worth per F and shrink per B; states are fixed."""
    out = {}
    for r in trace.ranks:
        states = {"params": 2.5 * GIB, "grads": 5 * GIB, "optimizer": 7.5 * GIB, "other": 1.2 * GIB}
        act, samples = 0.0, [(0.0, {**states, "activations": 0.0})]
        for e in trace.action_events(r):
            act += 2.0 * GIB if e.kind == "F" else 0.0
            samples.append((e.start, {**states, "activations": act}))
            act -= 2.0 * GIB if e.kind == "B" else 0.0
            samples.append((e.end, {**states, "activations": act}))
        samples.append((trace.step_time, {**states, "activations": act}))
        out[r] = samples
    return out


def main() -> None:
    trace = build_1f1b_trace()
    s = summary(trace, model_flops_per_step=sum(e.flops for e in trace.events if e.layer == -1 and e.kind != "R"),
                peak_flops_per_device=10e15)
    print(f"step {s['step_time_s'] / MS:.2f} ms, bubble {s['bubble_fraction']:.3f}, "
          f"exposed comm (ms) { {k: round(v / MS, 3) for k, v in s['exposed_comm_s'].items()} }, "
          f"{s['num_events']} events")
    print(plot_timeline(trace, OUT / "timeline_1f1b.png", title="synthetic 1F1B, p=4 m=8, tp=2 dp=2"))
    slower = Trace([replace(e, start=e.start * 1.07, end=e.end * 1.07) for e in trace.events], trace.meta)
    print(plot_timeline_pair(trace, slower, OUT / "timeline_pair.png"))
    print(save_chrome_trace(trace, OUT / "timeline_1f1b.chrome.json"))
    timeline = memory_timeline(trace)
    by_stage = []
    for r, samples in timeline.items():
        peak = max(samples, key=lambda s: sum(s[1].values()))[1]
        by_stage.append({"stage": r, **peak, "total": sum(peak.values())})
    print(plot_memory_breakdown(by_stage, OUT / "memory_breakdown.png", capacity_bytes=24 * GIB))
    print(plot_memory_over_time(timeline, OUT / "memory_over_time.png", capacity_bytes=24 * GIB))


if __name__ == "__main__":
    main()
