"""What an execution does besides the plan: steps, data, measurement, checkpoints, faults."""
from __future__ import annotations

from dataclasses import dataclass

from parsim.specs import SpecError

FAULT_KINDS = ("crash", "kill", "hang", "absent", "slow")


@dataclass(frozen=True)
class FaultInjection:
    """Injected fault: ``rank`` misbehaves at ``step``.

    ``crash``: raises mid-step (after its first forward action); ``kill``: SIGKILLs itself
    mid-step; ``hang``: stops making progress mid-step; ``absent``: never joins the group;
    ``slow=F``: from ``step`` on, every forward and backward action's compute takes ``F`` x
    as long (a straggler; ``trainer.compute_slowdown``)."""

    rank: int
    step: int
    kind: str = "crash"
    factor: float = 1.0              # slow: compute-time factor

    @classmethod
    def parse(cls, text: str) -> "FaultInjection":
        parts = text.split(":")
        try:
            rank, step = int(parts[0]), int(parts[1])
            kind = parts[2] if len(parts) > 2 else "crash"
            if len(parts) > 3 or rank < 0 or step < 0:
                raise ValueError
        except (ValueError, IndexError):
            raise SpecError("inject_fault", text, "RANK:STEP[:KIND], e.g. 1:2:crash or 1:0:slow=1.5") from None
        kind, _, value = kind.partition("=")
        if kind not in FAULT_KINDS or bool(value) != (kind == "slow"):
            raise SpecError("inject_fault", text, f"kind one of {', '.join(FAULT_KINDS[:-1])} or slow=FACTOR")
        if kind != "slow":
            return cls(rank, step, kind)
        try:
            factor = float(value)
        except ValueError:
            factor = float("nan")
        if not factor >= 1.0:
            raise SpecError("inject_fault", text, "slow=FACTOR with FACTOR >= 1 (compute-time factor), e.g. slow=1.5")
        return cls(rank, step, kind, factor)


@dataclass(frozen=True)
class ExecutorConfig:
    steps: int = 5                   # index one past the last step to run (a resumed run continues to it)
    warmup: int = 1                  # executed steps not timed
    seed: int = 1234                 # weights and data
    data_file: str | None = None     # byte-level text instead of synthetic tokens
    trace_dir: str | None = None     # Chrome trace per rank of the representative step (rank<r>.json;
                                     # runs of one launch sharing a directory write to run<i>/)
    timeout_s: float = 60.0          # rendezvous, every collective, and fault shutdown
    save_dir: str | None = None      # torch.distributed.checkpoint directory ...
    save_at: int | None = None       # ... written after this many steps
    resume_dir: str | None = None    # continue from a checkpoint (any plan)
    inject_fault: FaultInjection | str | None = None   # "RANK:STEP[:KIND]" accepted
    collect_params: bool = False     # gather the full parameters after the last step (tests)
    collect_grads: bool = False      # gather the full gradients of the first step (tests)
    track_memory: bool = True
    # (model: a preset or a ModelSpec, mbs, dtype): re-take the calibration's real-layer probe
    # right before every timed step and after the last (``layer_probe.probe_layer``; ``parsim validate``)
    layer_probe: tuple[Any, int, str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.inject_fault, str):
            object.__setattr__(self, "inject_fault", FaultInjection.parse(self.inject_fault))
        if self.steps < 1:
            raise SpecError("steps", self.steps, "a positive integer")
        if self.warmup < 0:
            raise SpecError("warmup", self.warmup, "a non-negative integer")
        if self.timeout_s <= 0:
            raise SpecError("timeout", self.timeout_s, "a positive number of seconds")
        if (self.save_dir is None) != (self.save_at is None):
            raise SpecError("save_at", self.save_at, "--save DIR and --save-at N go together")
        if self.save_at is not None and not 1 <= self.save_at <= self.steps:
            raise SpecError("save_at", self.save_at, f"a step boundary between 1 and steps={self.steps}")
