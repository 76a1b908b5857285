"""Calibrated tables of a device: what ``parsim calibrate`` measured on it and fitted.

A profile YAML keeps them under ``device.extra`` (the layout on disk is unchanged); in memory
they are one frozen ``CalibratedTables``, read through its attributes and methods. Only
``CalibratedTables.from_dict`` / ``to_dict`` know the YAML keys, and a profile read and
written back gives the same mapping (keys in the order ``parsim calibrate`` writes them).
Numbers keep the type they were read with, so every price computed from them is the one the
untyped dict gave. SI units: seconds, bytes, FLOP/s, bytes/s. The network's collective fits
are ``specs.collectives``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Any, Callable

from .errors import SpecError
from .readers import flag, known as _known, mapping, number, plain as _plain, row, rows
from .surfaces import (LeaveOut, MemboundFit, OptimizerLevels, RooflineFit, StageProbes, read_named, read_per_dtype,
                       write_named, write_per_dtype)

EXTRA = "profile.device.extra"


@dataclass(frozen=True)
class RankCurve:
    """A value measured per count of ranks working at once on one host, {ranks: value}, in the
    order measured (``costs.host`` interpolates it)."""
    values: tuple[tuple[int, float], ...] = ()

    @classmethod
    def from_dict(cls, where: str, raw: Any) -> "RankCurve":
        out = []
        for k, v in mapping(where, raw).items():
            if not str(k).isdigit():
                raise SpecError(where, k, "rank counts (positive integers) as keys")
            out.append((int(k), number(f"{where}.{k}", v)))
        return cls(tuple(out))

    def to_dict(self) -> dict[str, float]:
        return {str(k): v for k, v in self.values}

    def __len__(self) -> int:
        return len(self.values)

    def get(self, ranks: int, default: float | None = None) -> float | None:
        return next((v for k, v in self.values if k == ranks), default)

    def with_value(self, ranks: int, value: float) -> "RankCurve":
        """This curve with ``value`` at ``ranks`` (in place of the old one, else appended)."""
        if any(k == ranks for k, _ in self.values):
            return RankCurve(tuple((k, value if k == ranks else v) for k, v in self.values))
        return RankCurve((*self.values, (ranks, value)))


@dataclass(frozen=True)
class GemmTable:
    """Achieved FLOP/s of measured GEMM shapes: rows (m, n, k, FLOP/s[, spread])."""
    rows: tuple[tuple[float, ...], ...]

    @cached_property
    def _logs(self) -> list[tuple[float, float, float]]:
        return [(math.log(r[0]), math.log(r[1]), math.log(r[2])) for r in self.rows]

    def nearest_rate(self, m: float, n: float, k: float) -> float:
        """FLOP/s of the measured shape nearest in log space (shapes a model uses repeat
        exactly, so nearest is usually an exact hit; the first of equals wins)."""
        best, best_d = None, math.inf
        lm, ln, lk = math.log(m), math.log(n), math.log(k)
        for r, (a, b, c) in zip(self.rows, self._logs):
            d = (a - lm) ** 2 + (b - ln) ** 2 + (c - lk) ** 2
            if d < best_d:
                best, best_d = r, d
        return float(best[3])

    def exact_rate(self, m: float, n: float, k: float) -> float | None:
        """FLOP/s of this exact shape where it was measured (the first such row), else None."""
        return next((float(r[3]) for r in self.rows if (r[0], r[1], r[2]) == (m, n, k)), None)


@dataclass(frozen=True)
class AttentionTable:
    """Measured fused attention: rows (batch x heads, seq, head_dim, forward s, backward s)."""
    rows: tuple[tuple[float, ...], ...]

    def nearest(self, key: tuple[float, float, float]) -> list[tuple[float, ...]]:
        """The rows nearest to (batch x heads, seq, head_dim) in log space, all of them when
        several share the key (e.g. MHA and GQA splits)."""
        dists = [sum((math.log(a) - math.log(b)) ** 2 for a, b in zip(r[:3], key)) for r in self.rows]
        return [r for r, x in zip(self.rows, dists) if x == min(dists)]


@dataclass(frozen=True)
class LayerProbe:
    """One real transformer layer timed alone (``calibration``'s layer probe), seconds."""
    mbs: int
    fwd_s: float
    bwd_s: float
    call: str | None = None
    tp: int | None = None
    spread: tuple[float, ...] | None = None            # (p90 - p10) / median: forward, backward
    blocks: tuple[tuple[float, float], ...] | None = None   # per block over the run: median fwd, bwd
    ops_fwd_s: float | None = None                     # its ops priced one by one (``fit_layer_terms``)
    ops_bwd_s: float | None = None

    _ORDER = ("call", "mbs", "tp", "fwd_s", "bwd_s", "spread", "blocks", "ops_fwd_s", "ops_bwd_s")

    @classmethod
    def from_dict(cls, where: str, raw: Any) -> "LayerProbe":
        d = mapping(where, raw)
        _known(where, d, cls._ORDER)
        try:
            return cls(mbs=number(f"{where}.mbs", d["mbs"]), fwd_s=number(f"{where}.fwd_s", d["fwd_s"]),
                       bwd_s=number(f"{where}.bwd_s", d["bwd_s"]), call=d.get("call"),
                       tp=number(f"{where}.tp", d["tp"]) if "tp" in d else None,
                       spread=row(f"{where}.spread", d["spread"], (2,)) if "spread" in d else None,
                       blocks=rows(f"{where}.blocks", d["blocks"], (2,)) if "blocks" in d else None,
                       ops_fwd_s=number(f"{where}.ops_fwd_s", d["ops_fwd_s"]) if "ops_fwd_s" in d else None,
                       ops_bwd_s=number(f"{where}.ops_bwd_s", d["ops_bwd_s"]) if "ops_bwd_s" in d else None)
        except KeyError as e:
            raise SpecError(f"{where}.{e.args[0]}", None, "required key missing in the layer probe") from None

    def to_dict(self) -> dict[str, Any]:
        return {k: _plain(getattr(self, k)) for k in self._ORDER if getattr(self, k) is not None}


@dataclass(frozen=True)
class LayerComposition:
    """What composing ops into a training pass costs beyond the ops priced one by one, per pass:
    a factor on every op (dimensionless; a real layer's measured time over its ops' priced sum)
    and, where the calibration fitted one over its synthetic stages (``calibration.layer_terms``),
    seconds per op (``per_op_fwd_s`` / ``per_op_bwd_s``: autograd's node and engine, Python
    module calls); ``costs.timing.op_time`` applies both (``costs.timing.composed``)."""
    fwd: float
    bwd: float
    per_op_fwd_s: float = 0.0
    per_op_bwd_s: float = 0.0
    overlap: bool = False

    _PER_OP = ("per_op_fwd_s", "per_op_bwd_s")

    @classmethod
    def from_dict(cls, where: str, raw: Any) -> "LayerComposition":
        ok = isinstance(raw, dict) and all(
            isinstance(raw.get(k), (int, float)) and not isinstance(raw.get(k), bool) and 0 < raw[k] < 10
            for k in ("fwd", "bwd"))
        if not ok or not {"fwd", "bwd"} <= set(raw) <= {"fwd", "bwd", "overlap", *cls._PER_OP}:
            raise SpecError(where, raw, "{fwd: x, bwd: y[, per_op_fwd_s: s, per_op_bwd_s: s, overlap: true|false]} "
                                        "with 0 < x, y < 10 (measured time / per-op sum) and seconds per op >= 0")
        per_op = {k: number(f"{where}.{k}", raw[k]) for k in cls._PER_OP if k in raw}
        if any(v < 0 for v in per_op.values()):
            raise SpecError(where, raw, "seconds per op >= 0")
        return cls(raw["fwd"], raw["bwd"], **per_op, overlap=flag(f"{where}.overlap", raw.get("overlap", False)))

    def factor(self, pass_: str) -> float:
        """The forward factor for "fwd", the backward one for every backward pass."""
        return float(self.fwd if pass_ == "fwd" else self.bwd)

    def per_op_s(self, pass_: str) -> float:
        """Seconds per op run in ``pass_`` ("fwd"; "bwd_input": a backward node, run once)."""
        return float(self.per_op_fwd_s if pass_ == "fwd" else self.per_op_bwd_s if pass_ == "bwd_input" else 0.0)

    def scaled(self, fwd: float, bwd: float) -> "LayerComposition":
        """Every term of a pass times that pass's factor (a machine running slower)."""
        return LayerComposition(self.fwd * fwd, self.bwd * bwd, self.per_op_fwd_s * fwd, self.per_op_bwd_s * bwd,
                                self.overlap)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fwd": self.fwd, "bwd": self.bwd}
        out.update({k: getattr(self, k) for k in self._PER_OP if getattr(self, k)})
        return {**out, "overlap": True} if self.overlap else out


@dataclass(frozen=True)
class GemmWaves:
    """Tile / wave quantisation of a GPU's GEMMs: SMs, output tile (``costs.timing``)."""
    sms: int
    tile_m: int
    tile_n: int

    @classmethod
    def from_dict(cls, where: str, raw: Any) -> "GemmWaves":
        d = mapping(where, raw)
        _known(where, d, ("sms", "tile_m", "tile_n"))
        try:
            return cls(*(number(f"{where}.{k}", d[k]) for k in ("sms", "tile_m", "tile_n")))
        except KeyError as e:
            raise SpecError(f"{where}.{e.args[0]}", None, "required key missing in gemm_waves") from None

    def to_dict(self) -> dict[str, int]:
        return {"sms": self.sms, "tile_m": self.tile_m, "tile_n": self.tile_n}


def _per_dtype(make: Callable[[tuple], Any], widths: tuple[int, ...]):
    def read(where: str, raw: Any) -> dict:
        return {str(dt): make(rows(f"{where}.{dt}", r, widths)) for dt, r in mapping(where, raw).items()}
    return read


def _numbers(where: str, raw: Any) -> dict[str, float]:
    return {str(k): number(f"{where}.{k}", v) for k, v in mapping(where, raw).items()}


def _split_overhead(where: str, raw: Any) -> dict[str, float]:
    """{per_layer, per_layer_squared}: fractions of a layer's backward, each >= 0."""
    values = _numbers(where, raw)
    keys = ("per_layer", "per_layer_squared")
    if set(values) != set(keys) or any(v < 0 for v in values.values()):
        raise SpecError(where, raw, "{per_layer: a, per_layer_squared: b}, a, b >= 0: fractions of a layer's backward")
    return values


def _detail(where: str, raw: Any) -> dict[str, tuple]:
    return {str(k): rows(f"{where}.{k}", v, (4,), text_first=True) for k, v in mapping(where, raw).items()}


def _word(*allowed: str):
    def read(where: str, raw: Any) -> str:
        if raw not in allowed:
            raise SpecError(where, raw, f"one of {', '.join(allowed)}")
        return raw
    return read


@dataclass(frozen=True)
class CalibratedTables:
    """Everything a calibration measured beyond the datasheet numbers of ``DeviceProfile``; None (or
    empty) where the profile has no such table. Uncalibrated profiles (datasheet GPUs) have none."""
    cores: int | None = None                                  # the host's cores at calibration
    cache_levels: tuple[float, ...] | None = None             # bytes of its cache levels >= 2 (sysfs)
    gemm: dict[str, GemmTable] | None = None                  # dtype -> measured GEMM rates
    gemm_fit_rms_log: float | None = None                     # how well GemmEfficiency fits them
    attention: dict[str, AttentionTable] | None = None        # dtype -> fused attention (SDPA)
    attention_explicit: dict[str, AttentionTable] | None = None   # dtype -> unfused attention
    membound: dict[str, float] | None = None                  # op name -> bytes/s
    membound_detail: dict[str, tuple] | None = None           # op -> (source, fwd bytes, fwd s, bwd s)
    op_overhead_s: dict[str, float] | None = None             # op -> seconds of an empty call
    contention: RankCurve | None = None                       # ranks -> GEMM slowdown
    contention_membound: RankCurve | None = None              # ranks -> streaming slowdown
    contention_optimizer: RankCurve | None = None             # ranks -> AdamW step slowdown
    comm_interference: RankCurve | None = None                # ranks -> compute s lost per collective s
    p2p_send_cpu: RankCurve | None = None                     # ranks -> CPU s of one pipeline send
    p2p_recv_cpu: RankCurve | None = None                     # ranks -> CPU s of one pipeline receive
    p2p_cpu_per_byte: RankCurve | None = None                 # ranks -> CPU s per byte of one message
    p2p_hold: RankCurve | None = None                         # ranks -> s a receive waits for a core
    p2p_send_hold: RankCurve | None = None                    # ranks -> s a send's call holds its rank
    grad_accumulation: str | None = None                      # "fused" (default) | "unfused"
    zero_copies: str | None = None                            # "fsdp2": ZeRO-2/3 flat-buffer copies
    zero_overlap: bool | None = None                          # False: ZeRO collectives block (no side stream)
    layer_probe: LayerProbe | None = None
    contention_gemm_probe: RankCurve | None = None            # ranks -> slowdown of one GEMM repeated
    contention_layer: RankCurve | None = None                 # ranks -> slowdown of the real layer
    layer_composition: LayerComposition | None = None
    gemm_waves: GemmWaves | None = None
    # the machine calibration's fitted surfaces (``specs.surfaces``; ``costs.timing`` prices with them)
    gemm_surface: dict[str, dict[str, RooflineFit]] | None = None      # dtype -> GEMM form -> fit
    attention_surface: dict[str, dict[str, RooflineFit]] | None = None  # dtype -> pass -> fused attention
    membound_surface: dict[str, MemboundFit] | None = None            # op (or implementation) -> fit
    stage_probes: StageProbes | None = None                           # the synthetic stages run
    fit_report: dict[str, LeaveOut] | None = None                     # table -> leave-out error
    optimizer_per_tensor_s: float | None = None                       # AdamW's loop: seconds per tensor
    optimizer_levels: OptimizerLevels | None = None                   # AdamW's rate by cache level
    optimizer_sharded_per_tensor_s: float | None = None               # + per FSDP2 (DTensor) tensor
    fsdp_gather_host_s: float | None = None           # FSDP2's host work per unit around an all-gather
    fsdp_scatter_host_s: float | None = None          # ... and around a reduce-scatter
    split_overhead: dict[str, float] | None = None    # W's own cost: per_layer, per_layer_squared (x a layer's B)

    # ------------------------------------------------------------------ reading

    def gemm_table(self, dtype: str) -> GemmTable | None:
        """The measured GEMM rates of ``dtype`` (None: none measured)."""
        table = (self.gemm or {}).get(dtype)
        return table if table is not None and table.rows else None

    def attention_table(self, dtype: str) -> AttentionTable | None:
        table = (self.attention or {}).get(dtype)
        return table if table is not None and table.rows else None

    def gemm_fit(self, dtype: str, form: str) -> RooflineFit | None:
        """The fitted GEMM surface of ``dtype`` for ``form`` (linear, grad_input, grad_weight,
        bmm), its ``linear`` surface where that form was not fitted; None without one."""
        per = (self.gemm_surface or {}).get(dtype)
        return (per.get(form) or per.get("linear")) if per else None

    def attention_fit(self, dtype: str, pass_: str) -> RooflineFit | None:
        """The fitted fused-attention surface of ``dtype`` for "fwd" or "bwd" (None: none)."""
        return ((self.attention_surface or {}).get(dtype) or {}).get(pass_)

    def membound_fit(self, name: str) -> MemboundFit | None:
        return (self.membound_surface or {}).get(name)

    @property
    def last_level_cache(self) -> float | None:
        """Bytes of the host's last-level cache: the last of ``cache_levels`` (sysfs, ``calibration.
        cache.cache_levels``); in older profiles the memory-bound fits' knee there; None without."""
        if self.cache_levels:
            return self.cache_levels[-1]
        knees = [f.knee for f in (self.membound_surface or {}).values() if f.knee]
        return max(knees) if knees else None

    def membound_rate(self, op_name: str) -> float | None:
        """Measured bytes/s of a memory-bound op (None, or 0, when not measured)."""
        return (self.membound or {}).get(op_name)

    @property
    def unfused_grad_accumulation(self) -> bool:
        """Microbatch gradients accumulate in a separate kernel (autograd's AccumulateGrad)."""
        return (self.grad_accumulation or "fused") == "unfused"

    @property
    def fsdp2_copies(self) -> bool:
        """ZeRO-2/3 run as FSDP2, copying into / out of flat buffers around each collective."""
        return self.zero_copies == "fsdp2"

    @property
    def zero_blocking(self) -> bool:
        """ZeRO collectives are waited for where they are issued (FSDP2 without side streams)."""
        return self.zero_overlap is False

    # ------------------------------------------------------------------ (de)serialising

    @classmethod
    def from_dict(cls, raw: Any, where: str = EXTRA) -> "CalibratedTables":
        """From a profile's ``device.extra`` mapping (SpecError naming the key when malformed)."""
        kwargs = {}
        for key, value in mapping(where, raw).items():
            if key not in _KEYS:
                raise SpecError(f"{where}.{key}", value, f"unknown calibrated table; allowed: {', '.join(_KEYS)}")
            attr, read, _ = _KEYS[key]
            kwargs[attr] = read(f"{where}.{key}", value)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The ``device.extra`` mapping a profile YAML holds."""
        out = {}
        for key, (attr, _, write) in _KEYS.items():
            value = getattr(self, attr)
            if value is not None:
                out[key] = write(value)
        return out

    def replace(self, **changes: Any) -> "CalibratedTables":
        return replace(self, **changes)


def _rows_out(per_dtype: dict) -> dict:
    return {dt: [list(r) for r in t.rows] for dt, t in per_dtype.items()}


def _levels(where: str, raw: Any) -> tuple[float, ...]:
    """Cache sizes in bytes > 0, smallest level first."""
    sizes = tuple(number(where, x) for x in raw) if isinstance(raw, (list, tuple)) else ()
    if not sizes or any(x <= 0 for x in sizes) or list(sizes) != sorted(sizes):
        raise SpecError(where, raw, "a list of cache sizes in bytes > 0, smallest level first")
    return sizes


_same = lambda x: x  # noqa: E731
_KEYS: dict[str, tuple[str, Callable, Callable]] = {
    # YAML key: (attribute, reader(where, raw), writer(value)); in the order calibration writes them
    "cores": ("cores", number, _same),
    "cache_levels": ("cache_levels", _levels, list),
    "gemm_table": ("gemm", _per_dtype(GemmTable, (4, 5)), _rows_out),
    "gemm_fit_rms_log": ("gemm_fit_rms_log", number, _same),
    "attention_table": ("attention", _per_dtype(AttentionTable, (5,)), _rows_out),
    "attention_explicit_table": ("attention_explicit", _per_dtype(AttentionTable, (5,)), _rows_out),
    "membound_table": ("membound", _numbers, dict),
    "membound_detail": ("membound_detail", _detail, lambda d: {k: [list(r) for r in v] for k, v in d.items()}),
    "op_overhead_s": ("op_overhead_s", _numbers, dict),
    "contention": ("contention", RankCurve.from_dict, RankCurve.to_dict),
    "contention_membound": ("contention_membound", RankCurve.from_dict, RankCurve.to_dict),
    "contention_optimizer": ("contention_optimizer", RankCurve.from_dict, RankCurve.to_dict),
    "comm_interference": ("comm_interference", RankCurve.from_dict, RankCurve.to_dict),
    "p2p_send_cpu": ("p2p_send_cpu", RankCurve.from_dict, RankCurve.to_dict),
    "p2p_recv_cpu": ("p2p_recv_cpu", RankCurve.from_dict, RankCurve.to_dict),
    "p2p_cpu_per_byte": ("p2p_cpu_per_byte", RankCurve.from_dict, RankCurve.to_dict),
    "p2p_hold": ("p2p_hold", RankCurve.from_dict, RankCurve.to_dict),
    "p2p_send_hold": ("p2p_send_hold", RankCurve.from_dict, RankCurve.to_dict),
    "grad_accumulation": ("grad_accumulation", _word("fused", "unfused"), _same),
    "zero_copies": ("zero_copies", _word("fsdp2", "none"), _same),
    "zero_overlap": ("zero_overlap", flag, _same),
    "layer_probe": ("layer_probe", LayerProbe.from_dict, LayerProbe.to_dict),
    "contention_gemm_probe": ("contention_gemm_probe", RankCurve.from_dict, RankCurve.to_dict),
    "contention_layer": ("contention_layer", RankCurve.from_dict, RankCurve.to_dict),
    "layer_composition": ("layer_composition", LayerComposition.from_dict, LayerComposition.to_dict),
    "gemm_waves": ("gemm_waves", GemmWaves.from_dict, GemmWaves.to_dict),
    "gemm_surface": ("gemm_surface", read_per_dtype(RooflineFit), write_per_dtype),
    "attention_surface": ("attention_surface", read_per_dtype(RooflineFit), write_per_dtype),
    "membound_surface": ("membound_surface", read_named(MemboundFit), write_named),
    "stage_probes": ("stage_probes", StageProbes.from_dict, StageProbes.to_dict),
    "fit_report": ("fit_report", read_named(LeaveOut), write_named),
    "optimizer_per_tensor_s": ("optimizer_per_tensor_s", number, _same),
    "optimizer_levels": ("optimizer_levels", OptimizerLevels.from_dict, OptimizerLevels.to_dict),
    "optimizer_sharded_per_tensor_s": ("optimizer_sharded_per_tensor_s", number, _same),
    "fsdp_gather_host_s": ("fsdp_gather_host_s", number, _same),
    "fsdp_scatter_host_s": ("fsdp_scatter_host_s", number, _same),
    "split_overhead": ("split_overhead", _split_overhead, dict),
}
assert {a for a, _, _ in _KEYS.values()} == {f.name for f in fields(CalibratedTables)}
