"""The contention rounds a calibration's collectives job takes (``calibration.comm._contention``:
a GEMM, a streaming add of 3 x 16 MiB, the executor's AdamW, and the real layer), printed round
by round from inside a real ``parsim calibrate`` run on 2 gloo ranks: what ``contention``,
``contention_membound``, ``contention_optimizer`` and ``contention_layer`` are the medians of.

    .venv/bin/python studies/validation_cpu/heldout/stream_contention.py [--quick]   # ~2.5 min; --quick ~40 s

Each line: the round ratios (the ranks' harmonic-mean seconds per call while both call at once
over rank 0's alone, ``calibration.tables.round_ratios``), then rank 0's solo and both ranks'
concurrent microseconds per call."""
from __future__ import annotations

import sys

if __name__ == "__main__":
    import parsim.calibration.runner as runner
    from parsim.calibration.tables import round_ratios

    measure = runner._measure_comm

    def printing(m, *args, **kwargs):
        measure(m, *args, **kwargs)
        for world, ranks in m.comm.items():
            for key in ("gemm_rounds", "stream_rounds", "optimizer_rounds", "layer_rounds"):
                if all(r.get(key) for r in ranks):
                    ratios = ", ".join(f"{x:.2f}" for x in round_ratios(ranks, key))
                    solo = ", ".join(f"{x[0] * 1e6:.0f}" for x in ranks[0][key])
                    both = " | ".join(", ".join(f"{x[1] * 1e6:.0f}" for x in r[key]) for r in ranks)
                    print(f"{world} ranks {key:16s} ratios {ratios}; solo us {solo}; at once us {both}", flush=True)

    runner._measure_comm = printing
    runner.run_calibration(runner.make_options(quick="--quick" in sys.argv[1:], ranks="2"), "stream-contention")
