"""Fitted surfaces of a calibrated device: an op's seconds as a function of its shape.

``parsim calibrate`` measures the machine, not a model: GEMMs over a grid of (m, n, k) per form
and dtype, fused attention over (batch x heads, seq, head dim), memory-bound ops over sizes,
and a few small synthetic training stages run by the executor's own modules; it fits the
surfaces below and keeps each fit's leave-out error (``LeaveOut``). ``costs.timing`` prices
any shape with them. A profile YAML keeps them under ``device.extra`` (``CalibratedTables``).

* ``RooflineFit``: seconds = overhead + batch x per-batch + work / (peak x prod_i s(d_i) x waves)
  with s(d) = d / (d + half): a per-op overhead (framework dispatch, kernel launch), the
  roofline's compute ceiling ``peak`` (Williams et al. 2009, CACM 52(4)) and one saturating
  fill term per dimension (small dimensions under-fill the register / tensor-core tiles and
  the vector lanes; the ``GemmEfficiency`` curve with one half-saturation size per dimension),
  times the wave quantisation of a GPU (tiles / (ceil(tiles / SMs) x SMs); NVIDIA, "Matrix
  Multiplication Background User's Guide", Sec. "Wave Quantization"), and on a CPU where the
  fit finds it, 1 / (1 + n / wide) for wide outputs (``RooflineFit.efficiency``). Every factor is <= 1,
  so the efficiency is <= 1 by construction and ``peak`` is the fitted asymptote.
* ``MemboundFit``: seconds = alpha + beta x bytes per pass (Hockney 1994's latency-bandwidth
  model; 1 / beta is the op's achieved bandwidth), and past a knee (the host's last-level
  cache) a second, slower rate per byte: an op that streams more than the cache holds runs at
  the memory's rate, one that streams less at the cache's (``bytes_time``).

SI units: seconds, FLOP, FLOP/s, bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import SpecError
from .readers import flag, known, mapping, number, plain, row


def bytes_time(x, beta: float, knee: float | None = None, beta_beyond: float | None = None):
    """The bytes' part of a time [s] for ``x`` bytes (a number or a numpy array): beta * x, and
    past ``knee`` beta_beyond per byte, continuous at the knee (a collective's protocol or
    buffer switch, ``calibration.fit.fit_alpha_beta_knee``; a memory-bound op outgrowing the
    last-level cache, ``calibration.surface_fit.fit_membound``)."""
    if knee is None:
        return beta * x
    below = np.minimum(x, knee)
    return beta * below + beta_beyond * (x - below)


def saturation(d: float, half: float) -> float:
    """d / (d + half): 1/2 at d = half, -> 1 for d >> half (dimensionless)."""
    return d / (d + half)


def wide_fraction(n, wide: float):
    """1 / (1 + n / wide) for an output ``n`` wide (a number or a numpy array): a CPU GEMM's rate
    halved at n = wide (``RooflineFit.wide``)."""
    return 1.0 / (1.0 + n / wide)


def wave_fraction(m: float, n: float, batch: float, tile: int, sms: int) -> float:
    """Busy fraction of the last wave of tile_m x tile_n output tiles over ``sms`` SMs."""
    tiles = math.ceil(m / tile) * math.ceil(n / tile) * batch
    return tiles / (math.ceil(tiles / sms) * sms)


@dataclass(frozen=True)
class RooflineFit:
    """seconds = overhead_s + batch * per_batch_s + work / (peak * prod_i s(dims_i, half_i) * waves).

    GEMMs: work = 2 b m n k FLOP, dims = (m, n, k); fused attention: work = the counted
    4 bh s^2 d FLOP (2.5x in backward), dims = (seq, head_dim, batch x heads), or with
    ``executed`` (a CPU calibration) the part of them torch's CPU flash kernel computes
    (``costs.flops.cpu_flash_causal_fraction``); with ``per_block`` the batch of ``per_batch_s``
    is batch x heads x the kernel's query blocks (``costs.flops.cpu_flash_query_blocks``): its
    loop's fixed cost per (head, query block), which steps where the block grows from 32 to 64
    rows at s = 192 (``calibration.machine_fit.attention_surfaces``)."""
    peak: float                          # FLOP/s: the asymptote, never exceeded
    half: tuple[float, ...]              # half-saturation size per dimension
    overhead_s: float                    # seconds per call
    per_batch_s: float = 0.0             # seconds per batch element (batched GEMMs)
    tile: int | None = None              # GPU output tile (square), with ``sms``: wave quantisation
    sms: int | None = None
    overlap: bool = False                # asynchronous launches: the larger of overhead and work, not the sum
    points: int | None = None            # measured points it was fitted on
    executed: bool = False               # attention: work = the CPU flash kernel's executed FLOPs
    wide: float | None = None            # output width n at which a CPU GEMM's rate has halved (``efficiency``)
    per_block: bool = False              # attention: batch = batch x heads x the CPU flash kernel's query blocks

    _ORDER = ("peak", "half", "overhead_s", "per_batch_s", "tile", "sms", "overlap", "points", "executed", "wide",
              "per_block")

    def efficiency(self, dims: tuple[float, ...], batch: float = 1) -> float:
        """Achieved fraction of ``peak`` on the work (dimensionless, in (0, 1]); with ``wide``, times
        1 / (1 + n / wide): a CPU GEMM's rate falls as its output grows wider (the 2-vCPU Zen 3
        VM, torch 2.13 fp32 F.linear, 2026-11-30: 60-80 GFLOP/s at n ~ 1000, 35-50 at n = 16384,
        whatever m (64-1024) and k (256-1024); the fall is n's alone: a term on m or k fitted
        nothing. ``studies/validation_cpu/heldout/wide_gemm.py``)."""
        eff = math.prod(saturation(d, h) for d, h in zip(dims, self.half))
        if self.wide:
            eff *= wide_fraction(dims[1], self.wide)
        if self.tile and self.sms:
            eff *= wave_fraction(dims[0], dims[1], batch, int(self.tile), int(self.sms))
        return eff

    def seconds(self, work: float, dims: tuple[float, ...], batch: float = 1) -> float:
        """On a CPU an op's framework overhead and its work run one after the other (the sum);
        a GPU kernel is launched asynchronously, so back-to-back ops overlap the next launch
        with the running kernel and each costs the larger of the two (``overlap``)."""
        if work <= 0:
            return 0.0
        fixed = self.overhead_s + batch * self.per_batch_s
        busy = work / (self.peak * max(self.efficiency(dims, batch), 1e-9))
        return max(fixed, busy) if self.overlap else fixed + busy

    @classmethod
    def from_dict(cls, where: str, raw: Any) -> "RooflineFit":
        d = mapping(where, raw)
        known(where, d, cls._ORDER)
        for k in ("peak", "half", "overhead_s"):
            if k not in d:
                raise SpecError(f"{where}.{k}", None, "required key missing in the fitted surface")
        half = row(f"{where}.half", d["half"], (1, 2, 3, 4))
        peak = number(f"{where}.peak", d["peak"])
        if peak <= 0 or any(h < 0 for h in half):
            raise SpecError(where, raw, "peak > 0 and half-saturation sizes >= 0")
        opt = {k: number(f"{where}.{k}", d[k]) for k in ("per_batch_s", "tile", "sms", "points", "wide") if k in d}
        if opt.get("wide", 1.0) <= 0:
            raise SpecError(f"{where}.wide", d["wide"], "an output width > 0 (elements)")
        opt.update({k: flag(f"{where}.{k}", d[k]) for k in ("overlap", "executed", "per_block") if k in d})
        return cls(peak=peak, half=half, overhead_s=number(f"{where}.overhead_s", d["overhead_s"]), **opt)

    def to_dict(self) -> dict[str, Any]:
        skip = {"per_batch_s": 0.0, "overlap": False, "executed": False, "per_block": False}
        return {k: plain(getattr(self, k)) for k in self._ORDER
                if getattr(self, k) is not None and not (k in skip and getattr(self, k) == skip[k])}


@dataclass(frozen=True)
class MemboundFit:
    """A memory-bound op: seconds = alpha + beta * bytes, per pass (bytes as ``costs.ops``
    counts them), and past ``knee`` bytes beta_beyond per byte (a pass's third number; a pass
    with two streams at one rate whatever its size); ``bwd`` None for ops without a backward
    (AdamW, gradient accumulation)."""
    fwd: tuple[float, ...]               # (alpha s, beta s/byte[, beta_beyond s/byte])
    bwd: tuple[float, ...] | None = None
    points: int | None = None
    knee: float | None = None            # bytes: the last-level cache the fit found

    def seconds(self, pass_: str, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        alpha, beta, *beyond = self.fwd if pass_ == "fwd" or self.bwd is None else self.bwd
        return float(alpha) + float(bytes_time(nbytes, float(beta), self.knee if beyond else None, *beyond))

    @property
    def bandwidth(self) -> float:
        """Bytes/s of the forward's bandwidth term (1 / beta)."""
        return 1.0 / self.fwd[1] if self.fwd[1] > 0 else math.inf

    @classmethod
    def from_dict(cls, where: str, raw: Any) -> "MemboundFit":
        d = mapping(where, raw)
        known(where, d, ("fwd", "bwd", "points", "knee"))
        if "fwd" not in d:
            raise SpecError(f"{where}.fwd", None, "required key missing: [alpha s, beta s/byte]")
        fit = cls(fwd=row(f"{where}.fwd", d["fwd"], (2, 3)),
                  bwd=row(f"{where}.bwd", d["bwd"], (2, 3)) if d.get("bwd") is not None else None,
                  points=number(f"{where}.points", d["points"]) if "points" in d else None,
                  knee=number(f"{where}.knee", d["knee"]) if d.get("knee") is not None else None)
        if fit.knee is None and (len(fit.fwd) == 3 or (fit.bwd is not None and len(fit.bwd) == 3)):
            raise SpecError(f"{where}.knee", None, "required with a pass's third number (s/byte past the knee): "
                            "bytes > 0")
        if fit.knee is not None and not fit.knee > 0:
            raise SpecError(f"{where}.knee", fit.knee, "bytes > 0")
        return fit

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fwd": list(self.fwd)}
        if self.bwd is not None:
            out["bwd"] = list(self.bwd)
        if self.points is not None:
            out["points"] = self.points
        if self.knee is not None:
            out["knee"] = self.knee
        return out


@dataclass(frozen=True)
class LeaveOut:
    """How well a fit predicts measured points it was not fitted on: |predicted / measured - 1|
    over every point, each predicted by the fit of the other folds (k-fold cross-validation)."""
    points: int
    median: float
    p90: float
    max: float
    folds: int

    _ORDER = ("points", "median", "p90", "max", "folds")

    @classmethod
    def from_dict(cls, where: str, raw: Any) -> "LeaveOut":
        d = mapping(where, raw)
        known(where, d, cls._ORDER)
        try:
            return cls(**{k: number(f"{where}.{k}", d[k]) for k in cls._ORDER})
        except KeyError as e:
            raise SpecError(f"{where}.{e.args[0]}", None, "required key missing in the leave-out report") from None

    def to_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self._ORDER}


@dataclass(frozen=True)
class StageProbe:
    """One synthetic training stage run by the executor's own modules (embedding, ``layers``
    blocks, output layer and loss; ``calibration.stages``): its measured forward (with the
    loss) and backward seconds. ``spec`` holds the ``ModelSpec`` fields."""
    spec: dict[str, Any]
    mbs: int
    fwd_s: float
    bwd_s: float

    @classmethod
    def from_dict(cls, where: str, raw: Any) -> "StageProbe":
        d = mapping(where, raw)
        known(where, d, ("spec", "mbs", "fwd_s", "bwd_s"))
        try:
            return cls(spec=dict(mapping(f"{where}.spec", d["spec"])), mbs=number(f"{where}.mbs", d["mbs"]),
                       fwd_s=number(f"{where}.fwd_s", d["fwd_s"]), bwd_s=number(f"{where}.bwd_s", d["bwd_s"]))
        except KeyError as e:
            raise SpecError(f"{where}.{e.args[0]}", None, "required key missing in the stage probe") from None

    def to_dict(self) -> dict[str, Any]:
        return {"spec": dict(self.spec), "mbs": self.mbs, "fwd_s": self.fwd_s, "bwd_s": self.bwd_s}


@dataclass(frozen=True)
class StageProbes:
    """The synthetic stages a calibration ran, and the real-layer probe's forward / backward
    seconds in the same run (``reference``): ``calibration.layer_terms`` scales the composition
    terms fitted on the stages by the layer probe now over ``reference`` (1 as calibrated; the
    machine's drift when the probe is re-taken around a run). ``rounds``: each round's sum over
    the stages of the forward + backward medians, seconds, in the order taken (the stages are
    timed in rounds over the calibration, ``calibration.stages.StageRounds``; None: one round,
    profiles before format 12). ``overlap``: the device runs apart from its host, whose issue
    time overlaps the kernels queued before (CUDA; ``calibration.layer_terms`` fits the
    composition terms in that form)."""
    stages: tuple[StageProbe, ...]
    reference: tuple[float, float]
    rounds: tuple[float, ...] | None = None
    overlap: bool = False

    @classmethod
    def from_dict(cls, where: str, raw: Any) -> "StageProbes":
        d = mapping(where, raw)
        known(where, d, ("stages", "reference", "rounds", "overlap"))
        stages = d.get("stages")
        if not isinstance(stages, list) or "reference" not in d:
            raise SpecError(where, raw, "{stages: [...], reference: [forward s, backward s]}")
        rounds = d.get("rounds")
        if rounds is not None and not (isinstance(rounds, list) and rounds):
            raise SpecError(f"{where}.rounds", rounds, "a non-empty list of seconds, one per round")
        return cls(stages=tuple(StageProbe.from_dict(f"{where}.stages[{i}]", s) for i, s in enumerate(stages)),
                   reference=row(f"{where}.reference", d["reference"], (2,)),
                   rounds=None if rounds is None else tuple(number(f"{where}.rounds[{i}]", x) for i, x in enumerate(rounds)),
                   overlap=flag(f"{where}.overlap", d.get("overlap", False)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stages": [s.to_dict() for s in self.stages], "reference": list(self.reference)}
        if self.rounds is not None:
            out["rounds"] = list(self.rounds)
        return {**out, "overlap": True} if self.overlap else out


def read_per_dtype(make):
    """{dtype: {key: fit}} (GEMM forms, attention passes) of fits read by ``make.from_dict``."""
    def read(where: str, raw: Any) -> dict[str, dict[str, Any]]:
        return {str(dt): {str(k): make.from_dict(f"{where}.{dt}.{k}", v)
                          for k, v in mapping(f"{where}.{dt}", per).items()}
                for dt, per in mapping(where, raw).items()}
    return read


def write_per_dtype(value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {dt: {k: fit.to_dict() for k, fit in per.items()} for dt, per in value.items()}


def read_named(make):
    def read(where: str, raw: Any) -> dict[str, Any]:
        return {str(k): make.from_dict(f"{where}.{k}", v) for k, v in mapping(where, raw).items()}
    return read


def write_named(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v.to_dict() for k, v in value.items()}


@dataclass(frozen=True)
class OptimizerLevels:
    """The optimizer's streaming rate by the cache level one parameter tensor's working set fits
    in (``costs.timing.optimizer_time``): ``capacities`` in bytes, smallest first (the host's
    per-core cache from sysfs; the shared last level as much of it as the fit finds this host
    gets: a VM's share of a socket's L3 is not what sysfs states), and one bandwidth (counted
    AdamW bytes / s) per level plus one for main memory (``len(bandwidths) == len(capacities) +
    1``). A tensor whose working set fits a cache is streamed from memory once per step while
    the update's ~9 elementwise ops re-read it from that cache; a larger one is streamed from
    memory by every op (``calibration.optimizer_fit.fit_optimizer_levels``)."""
    capacities: tuple[float, ...]
    bandwidths: tuple[float, ...]

    @classmethod
    def from_dict(cls, where: str, raw: Any) -> "OptimizerLevels":
        known(where, mapping(where, raw), ("capacities", "bandwidths"))
        caps = row(f"{where}.capacities", raw.get("capacities"), tuple(range(0, 8)))
        bws = row(f"{where}.bandwidths", raw.get("bandwidths"), (len(caps) + 1,))
        if any(c <= 0 for c in caps) or list(caps) != sorted(caps) or any(b <= 0 for b in bws):
            raise SpecError(where, raw, "capacities > 0 in increasing order and one bandwidth > 0 more than "
                                        "capacities (the last: main memory)")
        return cls(caps, bws)

    def to_dict(self) -> dict[str, list[float]]:
        return {"capacities": list(self.capacities), "bandwidths": list(self.bandwidths)}

    def bandwidth(self, working_set: float) -> float:
        """Bytes/s of a tensor of ``working_set`` bytes: the first level whose capacity holds
        it, memory's where none does."""
        for cap, bw in zip(self.capacities, self.bandwidths):
            if working_set <= cap:
                return bw
        return self.bandwidths[-1]
