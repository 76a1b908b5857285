"""What does a stage cost that its ops, priced one by one, leave out? Three measurements, by
timing alone (``torch.profiler``'s self times of ops that allocate large outputs moved 1-6x
between calls on this VM, so no profiler):

1. **vocab**: each stage timed with its vocabulary and again with 128 words; the difference
   (embedding, logits GEMM, loss, the tied table's gradients) against its price.
2. **floor**: each stage's architecture at vanishing width (8 per head, 8 tokens, 64 words)
   with 1 layer and with ``layers + 4``: what a layer and what a stage cost beyond their ops'
   priced sum when there is almost no work (Python, autograd, dispatch).
3. **logits GEMMs**: the output layer's GEMM shape (few tokens x a wide vocabulary x a narrow
   hidden) measured cold against the profile's GEMM surface.

Priced without the composition terms (``layer_composition``) with the profile's tables, timed
as the calibration times its stages (``calibration.stages.bench_stage``, one thread, the
executor's host-memory policy ``keep``).

    .venv/bin/python studies/validation_cpu/stage_gaps.py --profile P.yaml > stage_gaps.txt   # ~20 s

P: a profile of this machine from ``parsim calibrate`` (no ``--model``). A timing script: run
it on an idle machine.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

import torch

from parsim.calibration.grid import STAGES
from parsim.calibration.layer_terms import stage_ops, stage_prices
from parsim.calibration.stages import bench_stage
from parsim.calibration.timer import Clock, measure
from parsim.specs import load_cluster, load_model

HELDOUT = Path(__file__).parent / "heldout"
REPEATS = 8


def cases() -> list:
    """The profile's synthetic stages and the held-out models' whole stages (mbs 1)."""
    out = [(spec, mbs) for spec, mbs in STAGES["cpu"]]
    return out + [(load_model(str(HELDOUT / f"model_{name}.yaml")), 1) for name in ("gpt", "llama", "deep")]


def split_prices(device, spec, mbs: int) -> dict[str, tuple[float, float]]:
    """Per pass: (GEMM + attention, memory-bound) seconds of the stage priced op by op."""
    from parsim.costs.timing import op_time

    ops = stage_ops(spec, mbs, "fp32")
    return {p: (sum(op_time(device, o, p, "fp32") for o in ops if o.kind != "membound"),
                sum(op_time(device, o, p, "fp32") for o in ops if o.kind == "membound")) for p in ("fwd", "bwd")}


def vocab_gaps(device, clock: Clock) -> None:
    print("1. vocabulary-dependent work: stage(vocab) - stage(vocab 128), ms; gap = measured - priced")
    print(f"{'stage':16s} {'vocab':>6s} {'hidden':>6s} tied | pass  measured  GEMM pr  membound pr    gap")
    for spec, mbs in cases():
        small = replace(spec, vocab=128)
        big_t, small_t = bench_stage(spec, mbs, "fp32", clock, REPEATS), bench_stage(small, mbs, "fp32", clock, REPEATS)
        big_p, small_p = split_prices(device, spec, mbs), split_prices(device, small, mbs)
        for i, p in enumerate(("fwd", "bwd")):
            meas = (big_t[i].median - small_t[i].median) * 1e3
            gemm, mem = ((big_p[p][j] - small_p[p][j]) * 1e3 for j in (0, 1))
            print(f"{spec.name:16s} {spec.vocab:6d} {spec.hidden:6d} {'yes ' if spec.tied_embeddings else 'no  '} | "
                  f"{p}  {meas:8.2f} {gemm:8.2f} {mem:12.2f} {meas - gemm - mem:+6.2f}", flush=True)


def floor(device, clock: Clock) -> None:
    print("\n2. the floor at vanishing width (8 per head, 8 tokens, 64 words), us: unpriced = measured - priced")
    print(f"{'architecture of':16s} | per layer fwd: meas  priced  unpriced | bwd: meas  priced  unpriced"
          " | rest of a stage fwd / bwd unpriced")
    for spec, _ in cases():
        points = []
        for layers in (1, spec.layers + 4):
            tiny = replace(spec, hidden=spec.heads * 8, ffn_hidden=spec.heads * 16, seq_len=8, vocab=64, layers=layers)
            f, b = bench_stage(tiny, 1, "fp32", clock, 2 * REPEATS)
            priced = stage_prices(device, "fp32", tiny, 1)
            points.append((layers, f.median, b.median, priced["fwd"][0], priced["bwd"][0]))
        (l1, f1, b1, pf1, pb1), (l2, f2, b2, pf2, pb2) = points
        lf, lb, lpf, lpb = ((y - x) / (l2 - l1) * 1e6 for x, y in ((f1, f2), (b1, b2), (pf1, pf2), (pb1, pb2)))
        rest_f, rest_b = (f1 - pf1) * 1e6 - (lf - lpf), (b1 - pb1) * 1e6 - (lb - lpb)
        print(f"{spec.name:16s} | {lf:21.0f} {lpf:7.0f} {lf - lpf:9.0f} | {lb:9.0f} {lpb:7.0f} {lb - lpb:9.0f}"
              f" | {rest_f:6.0f} / {rest_b:.0f}", flush=True)


def logits_gemms(device, clock: Clock) -> None:
    from parsim.calibration.compute import gemm_callable
    from parsim.calibration.shapes import GemmPoint
    from parsim.costs.ops import Op
    from parsim.costs.timing import op_time

    print("\n3. output-layer GEMMs (F.linear, m tokens x n vocab x k hidden), cold: measured vs the GEMM surface")
    print("    m     k      n | measured ms  GFLOP/s | priced ms  error")
    for m, k in ((128, 256), (256, 512)):
        for n in (2048, 4096, 8192, 16384, 32768):
            point = GemmPoint((m, n, k), 1, "linear", "logits")
            with torch.no_grad():
                t = measure(gemm_callable(point, "fp32", clock.device, True, clock.pool), clock, REPEATS, 0.3).median
            op = Op("logits", "gemm", point.flops, 0.0, 0.0, shape=(m, n, k))
            priced = op_time(device, op, "fwd", "fp32")
            print(f"{m:5d} {k:5d} {n:6d} | {t * 1e3:11.3f} {point.flops / t / 1e9:8.1f} | {priced * 1e3:9.3f} "
                  f"{priced / t - 1:+6.1%}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", required=True)
    ap.add_argument("--only", choices=("vocab", "floor", "logits"))
    args = ap.parse_args()
    os.environ.setdefault("PARSIM_HOST_MEMORY", "keep")
    from parsim.executor.host_alloc import apply_host_memory_policy
    apply_host_memory_policy()
    torch.set_num_threads(1)
    device = load_cluster("cpu:1", profile=args.profile).device
    device = replace(device, tables=device.tables.replace(layer_composition=None))
    clock = Clock(torch.device("cpu"))
    print(f"profile {args.profile}; priced without its composition terms\n")
    for name, run in (("vocab", lambda: vocab_gaps(device, clock)), ("floor", lambda: floor(device, clock)),
                      ("logits", lambda: logits_gemms(device, clock))):
        if args.only in (None, name):
            run()


if __name__ == "__main__":
    main()
