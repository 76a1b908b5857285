"""Two ops against what priced them, on one thread.

1. The explicit attention's causal mask (``executor/model.py``: ``scores.masked_fill(causal,
   -inf)`` with a broadcast bool (s, s) mask) against a residual add over the same bytes, the op
   that priced it before the calibration timed it on its own (``costs.timing.OWN_BENCHMARK``):
   the calibration's own forward cases of both (``calibration.compute.membound_case``), warm.
2. Each held-out model's head GEMM (tokens x vocab x hidden) and one of its layer GEMMs (tokens
   x ffn x hidden), each as the forward (``F.linear``) and the backward runs it (input and weight
   gradient, ``costs.ops.executed_gemm``), against the profile's GEMM surface for that form
   (``costs.timing.gemm_time``).

    .venv/bin/python studies/validation_cpu/heldout/head_and_mask.py PROFILE > head_and_mask.txt   # ~40 s

Medians of 7 samples; the GEMMs cold, as a training pass finds them: the operands rotate over
copies spanning twice the last-level cache (``calibration.compute.gemm_callable(cold=True)``)."""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
MASK_SHAPES = ((8, 128), (32, 128), (16, 256), (8, 512))      # (batch x heads, seq)


def mask_rows(clock) -> list[str]:
    import torch

    from parsim.calibration.compute import membound_case
    from parsim.calibration.shapes import MemboundPoint
    from parsim.calibration.timer import measure
    out = []
    for bh, s in MASK_SHAPES:
        masked, added = (measure(membound_case(MemboundPoint(name, (bh, s, s), 0.0, 0.0, "study"), torch.float32,
                                               clock.device)[0], clock, 7, 0.3).median
                         for name in ("causal_mask", "residual_add"))
        out.append(f"mask  {bh:3d} x {s:4d} x {s:4d}  masked_fill {masked * 1e6:8.0f} us  add {added * 1e6:7.0f} us  "
                   f"x{masked / added:5.1f}")
    return out


def gemm_rows(profile: str, clock) -> list[str]:
    import torch

    from parsim.calibration.compute import gemm_callable
    from parsim.calibration.shapes import GemmPoint
    from parsim.calibration.timer import measure
    from parsim.costs.ops import executed_gemm
    from parsim.costs.timing import gemm_time
    from parsim.specs import load_cluster, load_model

    device = load_cluster("cpu:1", profile=profile).device
    out = []
    for name in ("gpt", "llama", "deep", "wide", "long"):
        model = load_model(HERE / f"model_{name}.yaml")
        tokens = model.seq_len
        for role, forward in (("head", (tokens, model.vocab, model.hidden)),
                              ("layer", (tokens, model.ffn_hidden, model.hidden))):
            for form in ("linear", "grad_input", "grad_weight"):
                shape = executed_gemm(forward, form)
                with torch.no_grad():
                    fn = gemm_callable(GemmPoint(shape, 1, form, role), "fp32", clock.device, cold=True,
                                       pool=clock.pool)
                    measured = measure(fn, clock, 7, 1.0).median
                priced = gemm_time(device, *shape, "fp32", form=form)
                m, n, k = shape
                out.append(f"{name:5s} {role:5s} {form:11s} {m:5d} x {n:5d} x {k:5d}  measured {measured * 1e3:7.2f} ms  "
                           f"priced {priced * 1e3:7.2f} ms  measured / priced {measured / priced:4.2f}  "
                           f"{2 * m * n * k / measured / 1e9:5.1f} GFLOP/s")
    return out


def main(profile: str) -> None:
    import os
    os.environ.setdefault("PARSIM_HOST_MEMORY", "keep")
    import torch

    from parsim.calibration.timer import Clock
    from parsim.executor.host_alloc import apply_host_memory_policy

    apply_host_memory_policy()      # as the executor's ranks
    torch.set_num_threads(1)
    clock = Clock(torch.device("cpu"))
    print(f"# fp32, one thread, profile {profile}")
    for line in mask_rows(clock) + gemm_rows(profile, clock):
        print(line, flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
