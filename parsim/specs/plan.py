"""Plan: how one training step is parallelised (DESIGN.md, plan key table)."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .errors import SpecError
from .stack import AUTO, plan_stacks

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved")      # plan values every engine times
# Generated, checked, drawn and written as CSV by parsim.schedules (`parsim schedule`), but
# not yet timed by the engines (issue 21, items 3-6): not plan values until they are.
UNTIMED_SCHEDULES = ("zb-h1", "zb-h2", "interleaved-zb", "zbv", "dualpipev", "looped-bfs")
ALL_SCHEDULES = SCHEDULES + UNTIMED_SCHEDULES
OFFLOADS = ("none", "optimizer", "optimizer+params")
RECOMPUTES = ("none", "full", "selective", "stage-aware")
DTYPES = ("fp32", "bf16", "fp16")
TP_OVERLAPS = ("none", "subpipe")
DP_IMPLS = ("allreduce", "ps")

# PyTorch DDP's default gradient bucket: 25 MiB (torch.nn.parallel.DistributedDataParallel,
# bucket_cap_mb=25).
DEFAULT_DP_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class Plan:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    mbs: int = 1
    gbs: int | None = None            # sequences per step; default dp*mbs (one microbatch)
    schedule: str = "1f1b"
    zero: int = 0
    offload: str = "none"
    recompute: str = "none"
    sp: bool = False
    dtype: str = "bf16"
    partition: tuple[int, ...] | None = None   # layers per virtual stage; None = balanced
    dp_bucket_bytes: int = DEFAULT_DP_BUCKET_BYTES
    dp_overlap: bool = True
    shifted_critical_path: bool = False
    tp_overlap: str = "none"
    dp_impl: str = "allreduce"
    recompute_layers: tuple[int, ...] | None = None  # stage-aware: recomputed layers per stage
    stack: str = AUTO                 # the software stack that runs it (``specs.stack``); auto: the profile's

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "vpp", "mbs"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecError(name, v, "a positive integer")
        if self.gbs is None:
            object.__setattr__(self, "gbs", self.dp * self.mbs)
        if not isinstance(self.gbs, int) or isinstance(self.gbs, bool) or self.gbs < 1:
            raise SpecError("gbs", self.gbs, "a positive integer (global batch in sequences)")
        _one_of("schedule", self.schedule, SCHEDULES)
        _one_of("offload", self.offload, OFFLOADS)
        _one_of("recompute", self.recompute, RECOMPUTES)
        _one_of("dtype", self.dtype, DTYPES)
        _one_of("tp_overlap", self.tp_overlap, TP_OVERLAPS)
        _one_of("dp_impl", self.dp_impl, DP_IMPLS)
        _one_of("stack", self.stack, plan_stacks())
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise SpecError("zero", self.zero, "one of 0, 1, 2, 3")
        for name in ("sp", "dp_overlap", "shifted_critical_path"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(name, getattr(self, name), "true or false")
        if not isinstance(self.dp_bucket_bytes, int) or self.dp_bucket_bytes < 1:
            raise SpecError("dp_bucket_bytes", self.dp_bucket_bytes, "a positive integer (bytes)")
        for name in ("partition", "recompute_layers"):
            v = getattr(self, name)
            if v is not None:
                v = tuple(v)
                object.__setattr__(self, name, v)
                if not v or any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in v):
                    raise SpecError(name, list(v), "a list of non-negative integers, one per stage")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def num_microbatches(self) -> int:
        """Microbatches per step per pipeline: gbs / (dp * mbs)."""
        return self.gbs // (self.dp * self.mbs)

    @property
    def num_stages(self) -> int:
        """Virtual pipeline stages in all: pp * vpp."""
        return self.pp * self.vpp

    def replace(self, **changes) -> "Plan":
        return replace(self, **changes)

    def to_string(self) -> str:
        """The canonical ``k=v`` form (parseable by ``parse_plan``); defaults omitted except core keys."""
        parts = []
        default = Plan()
        for f in fields(self):
            v = getattr(self, f.name)
            core = f.name in ("dp", "tp", "pp", "mbs", "gbs", "schedule")
            if not core and v == getattr(default, f.name):
                continue
            if v is None:
                continue
            if isinstance(v, bool):
                v = "true" if v else "false"
            elif isinstance(v, tuple):
                v = ",".join(str(x) for x in v)
            parts.append(f"{f.name}={v}")
        return " ".join(parts)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for k in ("partition", "recompute_layers"):
            if d[k] is not None:
                d[k] = list(d[k])
        return d


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(name, value, f"one of {', '.join(allowed)}")
