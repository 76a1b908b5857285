"""``parsim execute``: run a plan for real with the torch reference executor and print what
was measured (step time, losses, peak memory per rank with its breakdown, trace files).

On one machine it spawns dp*tp*pp processes itself; under ``torchrun`` (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT set) this process is one rank and rank 0 prints.
"""
from __future__ import annotations

import sys

from .common import add_json_argument, emit_json, table

HELP = "run a plan with the torch executor (gloo on CPU, NCCL on GPU); prints measured metrics"


def add_arguments(p) -> None:
    p.add_argument("--model", default="tiny", help="preset name, model YAML, or HF config.json [tiny]")
    p.add_argument("--plan", default="dp=2 dtype=fp32", help="'k=v ...' plan string or plan YAML ['dp=2 dtype=fp32']")
    p.add_argument("--steps", type=int, default=5, help="train until this step index [5]")
    p.add_argument("--warmup", type=int, default=1, help="executed steps left out of the timing [1]")
    p.add_argument("--seed", type=int, default=1234, help="seed of the weights and the data [1234]")
    p.add_argument("--data", default=None, metavar="FILE", help="train on the bytes of a text file (vocab >= 256)")
    p.add_argument("--trace-dir", default=None, metavar="DIR", help="write a Chrome trace per rank (rank<r>.json)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a missing or stuck peer fails the run [60]")
    p.add_argument("--save", default=None, metavar="DIR", help="write a checkpoint (torch.distributed.checkpoint)")
    p.add_argument("--save-at", type=int, default=None, metavar="N", help="... after N steps")
    p.add_argument("--resume", default=None, metavar="DIR", help="continue from a checkpoint (any plan)")
    p.add_argument("--no-memory", action="store_true", help="skip the memory-tracked step")
    p.add_argument("--inject-fault", default=None, metavar="RANK:STEP[:KIND]",
                   help="testing only: make a rank crash|kill|hang at a step, or be absent")
    add_json_argument(p)


def run(args) -> int:
    from parsim.api import execute

    try:
        result = execute(args.model, args.plan, steps=args.steps, warmup=args.warmup, seed=args.seed, data=args.data,
                         trace_dir=args.trace_dir, timeout_s=args.timeout, save=args.save, save_at=args.save_at,
                         resume=args.resume, track_memory=not args.no_memory, inject_fault=args.inject_fault,
                         on_warning=lambda w: print(f"parsim: warning: {w}", file=sys.stderr))
    except Exception as err:
        from parsim.executor.launch import ExecutorError   # torch: imported once a run has started
        if not isinstance(err, ExecutorError):
            raise
        if args.json:
            emit_json({"error": str(err)})
        print(f"parsim: execution failed: {err}", file=sys.stderr)
        return 1
    if result is None:    # a non-zero rank under torchrun
        return 0
    if args.json:
        emit_json(result.to_dict())
        return 0
    print(f"{result.model}  plan: {result.plan}  world {result.world_size} on {result.backend} ({result.device})")
    print(f"step time {result.step_time_s * 1e3:.2f} ms (median of steps {result.timed_steps})")
    print("losses: " + ", ".join(f"{s}:{l:.5f}" for s, l in zip(result.steps, result.losses)))
    rows = []
    for rank, (peak, parts) in enumerate(zip(result.peak_memory_bytes_by_rank, result.memory_breakdown_by_rank)):
        rows.append([rank] + [f"{parts.get(k, 0) / 2**20:.2f}" for k in ("params", "grads", "optimizer", "activations", "other")]
                    + [f"{peak / 2**20:.2f}"])
    print(f"peak memory (step {result.memory_step}), MiB:")
    print(table(rows, ["rank", "params", "grads", "optim", "activ", "other", "peak"]))
    for f in result.trace_files:
        print(f"trace: {f}")
    return 0
