"""``parsim execute``'s arguments and what it does with them: one code path for the CLI command
and for the executor's own entry under torchrun (``python -m parsim.executor.launch``).

On one machine it starts dp*tp*pp processes itself; under ``torchrun`` (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT set) this process is one rank and rank 0 prints. Importing this
module does not import torch.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from parsim.specs import ModelSpec, Plan, load_model, parse_plan
from parsim.trace.io import jsonable

from .config import ExecutorConfig, FaultInjection
from .results import ExecutionResult


def add_arguments(p: argparse.ArgumentParser) -> None:
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
                   help="make a rank crash|kill|hang|freeze at a step, or be absent (testing only); or "
                        "RANK:STEP:slow=F: its forward/backward compute takes F x as long from STEP on (a straggler)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")


def config_from_args(args: argparse.Namespace) -> ExecutorConfig:
    return ExecutorConfig(
        steps=args.steps, warmup=args.warmup, seed=args.seed, data_file=args.data, trace_dir=args.trace_dir,
        timeout_s=args.timeout, save_dir=args.save, save_at=args.save_at, resume_dir=args.resume,
        inject_fault=FaultInjection.parse(args.inject_fault) if args.inject_fault else None,
        track_memory=not args.no_memory)


def execute(args: argparse.Namespace) -> int:
    """Run the plan the arguments name and print what was measured; the exit code."""
    model = load_model(args.model)
    plan = parse_plan(args.plan)
    config = config_from_args(args)

    from .checks import ExecutorError

    try:
        result = run_plan(model, plan, config, lambda w: print(f"parsim: warning: {w}", file=sys.stderr))
    except ExecutorError as err:
        if args.json:
            print(json.dumps({"error": str(err)}, default=jsonable))
        print(f"parsim: execution failed: {err}", file=sys.stderr)
        return 1
    if result is None:    # a non-zero rank under torchrun
        return 0
    if args.json:
        print(json.dumps(result.to_dict(), default=jsonable))
    else:
        print(summary(result))
    return 0


def run_plan(model: ModelSpec, plan: Plan, config: ExecutorConfig,
             on_warning: Callable[[str], None]) -> ExecutionResult | None:
    """Run one plan: ``dp*tp*pp`` fresh processes here, or this process's rank under torchrun
    (None on ranks other than 0). Warnings about the plan go to ``on_warning`` first; a failed
    run raises ``ExecutorError``. Imports torch."""
    from .checks import check_executable, under_torchrun

    for w in check_executable(model, plan, config):
        on_warning(w)
    torchrun = under_torchrun()
    if not torchrun:
        from .forked import start_early
        start_early()       # its imports run beside ours of torch, below
    from .launch import RunSpec, run_plans, run_this_rank
    runs = [RunSpec(model, plan, config)]
    results = run_this_rank(runs) if torchrun else run_plans(runs)
    return results[0] if results else None


def summary(result: ExecutionResult) -> str:
    """The readable report: step time, losses, peak memory per rank by category (MiB), traces."""
    lines = [f"{result.model}  plan: {result.plan}  world {result.world_size} on {result.backend} ({result.device})",
             f"step time {result.step_time_s * 1e3:.2f} ms (median of steps {result.timed_steps})",
             "losses: " + ", ".join(f"{s}:{l:.5f}" for s, l in zip(result.steps, result.losses))]
    header = ["rank", "params", "grads", "optim", "activ", "other", "peak"]
    rows = [header]
    for rank, (peak, parts) in enumerate(zip(result.peak_memory_bytes_by_rank, result.memory_breakdown_by_rank)):
        rows.append([str(rank)] + [f"{parts.get(k, 0) / 2**20:.2f}"
                                   for k in ("params", "grads", "optimizer", "activations", "other")]
                    + [f"{peak / 2**20:.2f}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    aligned = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    aligned.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"peak memory (step {result.memory_step}), MiB:", *aligned]
    lines += [f"trace: {f}" for f in result.trace_files]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry for ``torchrun ... -m parsim.executor.launch``: run this process's rank."""
    parser = argparse.ArgumentParser(prog="parsim.executor.launch")
    add_arguments(parser)
    return execute(parser.parse_args(argv))
