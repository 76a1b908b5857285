"""What an execution does besides the plan: steps, data, measurement, checkpoints, faults."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parsim.specs import ModelSpec, SpecError
from parsim.specs.files import check_output_dir, path_exists

FAULT_KINDS = ("crash", "kill", "hang", "freeze", "absent", "slow")
# torch.optim.AdamW keeps its step count in a float32 tensor (torch.optim.optimizer._get_scalar_dtype),
# exact up to 2**24: beyond that the bias correction would use a wrong step.
MAX_STEPS = 2**24
MAX_TIMEOUT_S = 7 * 86_400.0      # a week: datetime.timedelta and the stores take any finite value below
MAX_SEED = 2**32                  # seeds are 32-bit (numpy's convention); the data seeds seed*7919+step


@dataclass(frozen=True)
class FaultInjection:
    """Injected fault: ``rank`` misbehaves at ``step``.

    ``crash``: raises mid-step (after its first forward action); ``kill``: SIGKILLs itself
    mid-step; ``hang``: its main thread stops making progress mid-step; ``freeze``: SIGSTOPs
    itself mid-step (the whole process stops: its heartbeat too); ``absent``: never joins the
    group; ``slow=F``: from ``step`` on, every forward and backward action's compute and the
    optimizer step take ``F`` x as long (a straggler; ``trainer.compute_slowdown``)."""

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
        if not _integer(self.steps) or not 1 <= self.steps <= MAX_STEPS:
            raise SpecError("steps", self.steps, f"a positive integer up to 2**24 = {MAX_STEPS:,} (AdamW counts "
                            "steps in float32)")
        if not _integer(self.warmup) or not 0 <= self.warmup <= MAX_STEPS:
            raise SpecError("warmup", self.warmup, "a non-negative integer (with warmup >= the steps run, the last "
                            "step is timed)")
        if not _integer(self.seed) or not 0 <= self.seed < MAX_SEED:
            raise SpecError("seed", self.seed, "an integer in [0, 2**32)")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                or not 0 < self.timeout_s <= MAX_TIMEOUT_S:       # NaN fails too
            raise SpecError("timeout", self.timeout_s, f"a positive number of seconds, at most {MAX_TIMEOUT_S:g}")
        if (self.save_dir is None) != (self.save_at is None):
            raise SpecError("save_at", self.save_at, "--save DIR and --save-at N go together")
        if self.save_at is not None and not 1 <= self.save_at <= self.steps:
            raise SpecError("save_at", self.save_at, f"a step boundary between 1 and steps={self.steps}")

    def check_files(self, model: ModelSpec, planned: dict[str, tuple[int, str]] | None = None) -> int:
        """The checks that read the file system, done before any rank starts: the checkpoint
        to resume (a folder with ``meta.json`` of this model, below ``steps``), the data file,
        and the folders written. ``planned``: checkpoints that earlier runs of the same launch
        will write ({folder: (step, model name)}), resumable before they exist. Returns the
        first step the run executes."""
        first = 0
        if self.resume_dir is not None and str(self.resume_dir) in (planned or {}):
            first, name = planned[str(self.resume_dir)]
            if name != model.name:
                raise SpecError("resume", str(self.resume_dir), f"a checkpoint of model {model.name} (an earlier "
                                f"run of this launch writes one of {name} there)")
        elif self.resume_dir is not None:
            first = resumed_step(self.resume_dir, model)
            if self.steps <= first:
                raise SpecError("steps", self.steps, f"above the checkpoint's step {first} (a resumed run "
                                f"continues from step {first} to --steps)")
            if self.save_at is not None and self.save_at <= first:
                raise SpecError("save_at", self.save_at, f"a step after the checkpoint's step {first}")
        if self.data_file is not None:
            check_data_file(self.data_file, model)
        for name, folder in (("save", self.save_dir), ("trace_dir", self.trace_dir)):
            if folder is not None:
                check_output_dir(folder, name)
        return first


def _integer(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def resumed_step(path: str, model: ModelSpec) -> int:
    """The step a checkpoint folder holds, after checking it is one of ``model``."""
    folder = Path(path)
    meta_path = folder / "meta.json"
    if not folder.is_dir() or not path_exists(meta_path):
        raise SpecError("resume", str(path), "a checkpoint folder written by --save (with meta.json)")
    try:
        meta = json.loads(meta_path.read_text())
        step = meta["step"]
    except (OSError, ValueError, KeyError, TypeError):
        raise SpecError("resume", str(path), "a checkpoint folder whose meta.json names its step") from None
    if not _integer(step) or step < 0:
        raise SpecError("resume", str(path), f"a checkpoint whose meta.json step is a non-negative integer ({step!r})")
    if meta.get("model") not in (None, model.name):
        raise SpecError("resume", str(path), f"a checkpoint of model {model.name} (this one holds {meta['model']})")
    return step


def check_data_file(path: str, model: ModelSpec) -> None:
    """The text file ``--data`` trains on (byte tokens): readable, long enough, vocab >= 256."""
    p = Path(path)
    if not path_exists(p) or not p.is_file():
        raise SpecError("data", str(path), "an existing text file")
    if model.vocab < 256:
        raise SpecError("data", str(path), f"byte-level text needs a model vocab >= 256 (model vocab is {model.vocab})")
    try:
        size = p.stat().st_size
        with open(p, "rb"):
            pass
    except OSError as e:
        raise SpecError("data", str(path), f"a readable file ({e.strerror})") from None
    if size < model.seq_len + 2:
        raise SpecError("data", str(path), f"a file of at least seq_len+2={model.seq_len + 2} bytes")
