"""Plan: how one training step is parallelised (DESIGN.md, plan key table)."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .errors import SpecError
from .stack import AUTO, plan_stacks

# Plan values of ``schedule`` (their order is their code, ``codes.py``: new ones go last). The
# zero-bubble family splits the backward into input-gradient (I) and weight-gradient (W) passes;
# zbv and dualpipev place two stages per rank in a V (``parsim.schedules``).
SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved",
             "zb-h1", "zb-h2", "interleaved-zb", "zbv", "dualpipev", "looped-bfs")
SPLIT_BACKWARD_SCHEDULES = ("zb-h1", "zb-h2", "interleaved-zb", "zbv", "dualpipev")
V_SCHEDULES = ("zbv", "dualpipev")          # two stages per rank, placed in a V: vpp = 2
UNTIMED_SCHEDULES: tuple[str, ...] = ()     # every generated schedule is timed by the engines
ALL_SCHEDULES = SCHEDULES
# ``schedule=csv:FILE``: any schedule in torch 2.13's ``_dump_csv`` format (``schedules.csv_io``)
CSV_PREFIX = "csv:"
OFFLOADS = ("none", "optimizer", "optimizer+params")
RECOMPUTES = ("none", "full", "selective", "stage-aware")
DTYPES = ("fp32", "bf16", "fp16")
TP_OVERLAPS = ("none", "subpipe")
DP_IMPLS = ("allreduce", "ps")

# PyTorch DDP's default gradient bucket: 25 MiB (torch.nn.parallel.DistributedDataParallel,
# bucket_cap_mb=25).
DEFAULT_DP_BUCKET_BYTES = 25 * 2**20

# The largest integer a plan takes: 2**53, below which every integer is exact in float64
# (IEEE 754 binary64, 53-bit significand); the cost formulas turn counts and bytes into floats.
MAX_INT = 2**53
_TOO_BIG = f"at most 2**53 = {MAX_INT:,} (exact in float64)"


@dataclass(frozen=True)
class Plan:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int | None = None            # virtual stages per rank; default 2 for zbv/dualpipev, else 1
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
        if self.vpp is None:
            object.__setattr__(self, "vpp", _default_vpp(self.schedule))
        if _plainly_valid(self):      # the common case, decided without building an error
            if self.gbs is None:
                object.__setattr__(self, "gbs", self.dp * self.mbs)
            return
        self._check_fields()

    def _check_fields(self) -> None:
        """Every field's check in order: the first bad one raises its SpecError."""
        for name in ("dp", "tp", "pp", "vpp", "mbs"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecError(name, v, "a positive integer")
            if v > MAX_INT:
                raise SpecError(name, v, f"a positive integer {_TOO_BIG}")
        if self.gbs is None:
            object.__setattr__(self, "gbs", self.dp * self.mbs)
        if not isinstance(self.gbs, int) or isinstance(self.gbs, bool) or self.gbs < 1:
            raise SpecError("gbs", self.gbs, "a positive integer (global batch in sequences)")
        if self.gbs > MAX_INT:
            raise SpecError("gbs", self.gbs, f"a global batch {_TOO_BIG} sequences")
        if not (isinstance(self.schedule, str) and self.schedule.startswith(CSV_PREFIX)
                and self.schedule[len(CSV_PREFIX):].strip()):
            _one_of("schedule", self.schedule, SCHEDULES, f" or {CSV_PREFIX}FILE (a schedule in torch's _dump_csv "
                    "format)")
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
        if (not isinstance(self.dp_bucket_bytes, int) or isinstance(self.dp_bucket_bytes, bool)
                or not 1 <= self.dp_bucket_bytes <= MAX_INT):
            raise SpecError("dp_bucket_bytes", self.dp_bucket_bytes, f"a positive integer (bytes), {_TOO_BIG}")
        for name in ("partition", "recompute_layers"):
            v = getattr(self, name)
            if v is not None:
                v = tuple(v)
                object.__setattr__(self, name, v)
                if not v or any(not isinstance(x, int) or isinstance(x, bool) or not 0 <= x <= MAX_INT for x in v):
                    raise SpecError(name, list(v), f"a list of non-negative integers ({_TOO_BIG}), one per stage")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def num_microbatches(self) -> int:
        """Microbatches per step per pipeline: gbs / (dp * mbs)."""
        return self.gbs // (self.dp * self.mbs)

    @property
    def schedule_file(self) -> str | None:
        """The CSV file of a ``schedule=csv:FILE`` plan; None for a generated schedule."""
        if self.schedule.startswith(CSV_PREFIX):
            return self.schedule[len(CSV_PREFIX):].strip()
        return None

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


# the plan words, and the stacks a plan names, as sets (``_plainly_valid``)
_WORD_SETS = tuple(frozenset(words) for words in (SCHEDULES, OFFLOADS, RECOMPUTES, DTYPES, TP_OVERLAPS, DP_IMPLS,
                                                  plan_stacks()))


def _plainly_valid(plan: Plan) -> bool:
    """True when ``Plan._check_fields`` would pass, judged on exact types only (plain ints and
    bools, str words, no lists): a plan it cannot vouch for that quickly is checked in full,
    so what is accepted and every error stay the same."""
    for v in (plan.dp, plan.tp, plan.pp, plan.vpp, plan.mbs):
        if type(v) is not int or not 1 <= v <= MAX_INT:
            return False
    gbs = plan.dp * plan.mbs if plan.gbs is None else plan.gbs
    if type(gbs) is not int or not 1 <= gbs <= MAX_INT:
        return False
    words = (plan.schedule, plan.offload, plan.recompute, plan.dtype, plan.tp_overlap, plan.dp_impl, plan.stack)
    for v, allowed in zip(words, _WORD_SETS):
        if type(v) is not str or v not in allowed:
            return False
    return (type(plan.zero) is int and 0 <= plan.zero <= 3 and type(plan.sp) is bool
            and type(plan.dp_overlap) is bool and type(plan.shifted_critical_path) is bool
            and type(plan.dp_bucket_bytes) is int and 1 <= plan.dp_bucket_bytes <= MAX_INT
            and plan.partition is None and plan.recompute_layers is None)


def _default_vpp(schedule: object) -> int:
    """2 for the V-placed schedules; for a CSV schedule, its stages per row (``rules.py`` checks
    that they divide); else 1."""
    if schedule in V_SCHEDULES:
        return 2
    if isinstance(schedule, str) and schedule.startswith(CSV_PREFIX) and schedule[len(CSV_PREFIX):].strip():
        from .schedule_file import schedule_shape
        shape = schedule_shape(schedule[len(CSV_PREFIX):].strip())
        if shape.rows and shape.stages % shape.rows == 0 and shape.stages:
            return shape.stages // shape.rows
    return 1


def _one_of(name: str, value: object, allowed: tuple[str, ...], more: str = "") -> None:
    if value not in allowed:
        raise SpecError(name, value, f"one of {', '.join(allowed)}{more}")
