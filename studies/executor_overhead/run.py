"""Executor overhead: what does running a plan through parsim's executor cost compared with
plain PyTorch?

1. dp=tp=pp=1: the executor (pipeline runtime over one stage, step recorder, barrier) against
   a plain single-process training loop of the same model (``parsim.executor.run_reference``:
   forward/backward per microbatch, AdamW step).
2. pp=2, 1F1B, same model and batch on 2 gloo ranks: our IR-driven pipeline runtime against
   torch's own ``torch.distributed.pipelining.Schedule1F1B`` (its PipelineStage does the
   sends/receives; the last stage computes logits and torch's loss_fn the cross-entropy).

Each measurement is the median step time after warm-up of one run. Ours and the baseline are
run back to back, ``REPEATS`` times (so both see the same background load on a shared
machine); reported: the median of each side's runs and the median of the paired ratios
ours / baseline. fp32 throughout (bf16 matmuls are 30-90x slower on this CPU).
Output: stdout and results.txt.

    .venv/bin/python studies/executor_overhead/run.py
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parsim.executor import run_plan, run_reference
from parsim.executor.model import StageModule
from parsim.executor.weights import init_stage
from parsim.executor.optimizer import make_adamw
from parsim.specs import load_model, parse_plan

HERE = Path(__file__).parent
REPEATS = 3
STEPS, WARMUP = 6, 2
CASES = [("tiny", 8), ("cpu-small", 2)]   # (model, global batch in sequences); mbs = 1


def median_after_warmup(times: list[float]) -> float:
    return statistics.median(times[WARMUP:])


def plain_loop(model: str, gbs: int) -> float:
    return median_after_warmup(run_reference(model, f"gbs={gbs} dtype=fp32", steps=STEPS).step_times)


def executor(model: str, plan: str) -> float:
    return run_plan(model, plan + " dtype=fp32", steps=STEPS, warmup=WARMUP, track_memory=False).step_time_s


class LastStageLogits(torch.nn.Module):
    """Our last stage without its built-in loss: torch's schedule applies ``loss_fn`` itself."""

    def __init__(self, stage: StageModule):
        super().__init__()
        self.stage = stage

    def forward(self, x):
        for block in self.stage.layers.values():
            x = block(x)
        return F.linear(self.stage.head.norm(x), self.stage.head.weight)


def _torch_1f1b_rank(rank: int, model_name: str, gbs: int, port: int) -> list[float]:
    """One rank of torch's Schedule1F1B; every rank returns the step times (max over ranks)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=120))
    spec = load_model(model_name)
    half = spec.layers // 2
    chunk = StageModule(spec, rank * half, half, is_first=rank == 0, is_last=rank == 1)
    init_stage(chunk, seed=1234)
    module = chunk if rank == 0 else LastStageLogits(chunk)
    stage = PipelineStage(module, rank, 2, torch.device("cpu"))
    loss_fn = lambda logits, target: F.cross_entropy(logits.flatten(0, 1), target.flatten())  # noqa: E731
    schedule = Schedule1F1B(stage, n_microbatches=gbs, loss_fn=loss_fn)
    optimizer = make_adamw(list(chunk.parameters()))
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(STEPS):
        batch = torch.randint(spec.vocab, (gbs, spec.seq_len + 1), generator=gen)
        optimizer.zero_grad(set_to_none=True)
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            schedule.step(batch[:, :-1])
        else:
            schedule.step(target=batch[:, 1:])
        optimizer.step()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed))
    dist.destroy_process_group()
    return times


def torch_1f1b(model: str, gbs: int) -> float:
    from parsim.executor.processes import free_port, run_ranks

    return median_after_warmup(run_ranks(_torch_1f1b_rank, (model, gbs, free_port()), 2)[0])


def paired(ours, base) -> tuple[float, float, float]:
    """(median ours, median baseline, median of the paired ratios) over REPEATS back-to-back runs."""
    pairs = [(ours(), base()) for _ in range(REPEATS)]
    return (statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs),
            statistics.median(a / b for a, b in pairs))


def main() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    lines = [f"executor overhead (fp32, mbs=1, {STEPS} steps, median after {WARMUP} warm-up, "
             f"{REPEATS} paired runs; {os.cpu_count()} CPU cores, load average {load:.1f} at start, "
             f"torch {torch.__version__})", ""]
    header = f"{'model':10s} {'gbs':>3s}  {'comparison':44s} {'ours ms':>9s} {'base ms':>9s} {'ratio':>6s}"
    lines.append("ratio = median over the runs of (ours / baseline) measured back to back")
    lines += [header, "-" * len(header)]
    print("\n".join(lines), flush=True)
    for model, gbs in CASES:
        rows = [
            ("executor dp=tp=pp=1 vs plain loop",
             paired(lambda: executor(model, f"gbs={gbs}"), lambda: plain_loop(model, gbs))),
            ("executor pp=2 1f1b vs torch Schedule1F1B",
             paired(lambda: executor(model, f"pp=2 gbs={gbs} schedule=1f1b"), lambda: torch_1f1b(model, gbs))),
        ]
        for name, (ours, base, ratio) in rows:
            line = f"{model:10s} {gbs:3d}  {name:44s} {ours * 1e3:9.2f} {base * 1e3:9.2f} {ratio:6.2f}"
            lines.append(line)
            print(line, flush=True)
    (HERE / "results.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
