"""The executor part of the zero-bubble study: cpu-small (8 layers, hidden 512, seq 128) in fp32
on this machine's gloo ranks, each schedule of ``run.SCHEDULES`` at pp = 2 (2 ranks) and pp = 4
(4 ranks) over a few microbatch counts. Measured: the median step time after warm-up, the
bubble of the traced step (``parsim.trace.metrics.bubble_fraction``: idle share of ranks x
step), the peak memory per rank; next to one step of the SimPy engine on the cpu-calibrated
profile (``mode=full``, as ``parsim validate`` runs it). Timings need a quiet machine."""
from __future__ import annotations

from parsim.sim import simulate
from parsim.specs import SpecError, load_cluster, load_model, parse_plan, validate
from parsim.trace.metrics import bubble_fraction

from run import SCHEDULES

MODEL = "cpu-small"
PROFILE = "cpu-calibrated"
FULL = {2: (4, 8, 16), 4: (8, 16)}          # pp -> microbatches per step
QUICK = {2: (4,)}


def plans(quick: bool) -> dict[int, list]:
    """Valid plans by world size (dualpipev needs m >= 2 pp; interleaved m divisible by pp)."""
    model = load_model(MODEL)
    out: dict[int, list] = {}
    for pp, ms in (QUICK if quick else FULL).items():
        for name, vpp in SCHEDULES:
            for m in ms:
                plan = parse_plan(f"pp={pp} vpp={vpp} gbs={m} schedule={name} dtype=fp32")
                try:
                    validate(model, load_cluster(f"cpu:{pp}", profile=PROFILE), plan)
                except SpecError:
                    continue
                out.setdefault(pp, []).append(plan)
    return out


def executor_rows(quick: bool = False) -> list[dict]:
    from parsim.executor import ExecutorConfig, RunSpec, run_plans

    model = load_model(MODEL)
    config = ExecutorConfig(steps=3 if quick else 8, warmup=1 if quick else 3, track_memory=True)
    rows = []
    for pp, ps in plans(quick).items():
        results = run_plans([RunSpec(model, p, config) for p in ps])
        cluster = load_cluster(f"cpu:{pp}", profile=PROFILE)
        for plan, measured in zip(ps, results):
            predicted = simulate(model, cluster, plan, mode="full")
            rows.append({"schedule": plan.schedule, "vpp": plan.vpp, "pp": pp, "microbatches": plan.num_microbatches,
                         "measured_step_s": measured.step_time_s, "predicted_step_s": predicted.step_time_s,
                         "measured_bubble": bubble_fraction(measured.trace),
                         "predicted_bubble": predicted.bubble_fraction,
                         "measured_peak_bytes": max(measured.peak_memory_bytes_by_rank),
                         "predicted_peak_bytes": predicted.peak_memory_bytes,
                         "measured_peak_bytes_by_rank": " ".join(map(str, measured.peak_memory_bytes_by_rank)),
                         "loss_last": measured.losses[-1], "plan": plan.to_string()})
    return rows
