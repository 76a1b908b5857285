"""Peak memory per pipeline rank, executor (memory-tracked step, gloo) against the simulator,
for the plans of probe-gqa whose peaks the model used to miss (ZeRO-1's whole-tensor owner,
FSDP2's middle microbatch, the embedding's fp32 gradient under bf16 autocast) and their
neighbours.

    OMP_NUM_THREADS=1 PARSIM_HOST_MEMORY=keep .venv/bin/python studies/validation_cpu/probe_gqa/memory.py  # ~30 s

Memory does not depend on the machine's speed: no profile is needed beyond the shipped
``cpu-calibrated`` (the stack and the backend it names)."""
from __future__ import annotations

from pathlib import Path

from parsim.costs import memory_by_stage
from parsim.specs import load_cluster, load_model, parse_plan

MODEL = Path(__file__).with_name("model.yaml")
PLANS = {2: ["dp=2 mbs=1 gbs=4 zero=2 dtype=fp32", "dp=2 mbs=1 gbs=8 zero=2 dtype=fp32",
             "dp=2 mbs=2 gbs=8 zero=1 dtype=fp32", "dp=2 mbs=2 gbs=8 zero=3 dtype=fp32",
             "pp=2 vpp=2 mbs=1 gbs=8 schedule=interleaved", "pp=2 vpp=2 mbs=1 gbs=8 schedule=interleaved dtype=fp32"],
         4: ["dp=2 pp=2 mbs=1 gbs=8 schedule=1f1b zero=1 dtype=fp32",
             "dp=2 pp=2 mbs=1 gbs=8 schedule=1f1b zero=2 dtype=fp32",
             "dp=2 pp=2 mbs=1 gbs=8 schedule=1f1b zero=2",
             "dp=2 pp=2 mbs=1 gbs=8 schedule=gpipe zero=2 dtype=fp32"]}


def main() -> None:
    from parsim.executor import ExecutorConfig, RunSpec, run_plans

    model = load_model(str(MODEL))
    mib = 2.0 ** 20
    print(f"{'plan':58s} {'pp rank':>7s} {'measured MiB':>12s} {'predicted':>10s} {'error':>7s}")
    worst = 0.0
    for world, texts in PLANS.items():
        plans = [parse_plan(t) for t in texts]
        results = run_plans([RunSpec(model, p, ExecutorConfig(steps=3, warmup=2, track_memory=True)) for p in plans])
        cluster = load_cluster(f"cpu:{world}", profile="cpu-calibrated")
        for text, plan, result in zip(texts, plans, results):
            stages = memory_by_stage(model, plan, cluster)
            for r, stage in enumerate(stages):
                ranks = [g for g in range(world) if g // (world // plan.pp) == r]     # rank layout: PP slowest
                measured = max(result.peak_memory_bytes_by_rank[g] for g in ranks)
                err = stage.total / measured - 1
                worst = max(worst, abs(err))
                print(f"{text:58s} {r:7d} {measured / mib:12.2f} {stage.total / mib:10.2f} {err:+7.2%}", flush=True)
    print(f"largest |error| {worst:.2%}")


if __name__ == "__main__":
    main()
