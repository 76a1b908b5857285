"""Calibrated collective fits of a network: alpha + beta * x per op and group size.

A profile YAML keeps them under ``network.collectives``: {op: {group size: entry}} with the
entry's ``alpha`` (s), ``beta`` (s/byte), where the bytes cost more past a size (a host's
buffers leaving its last-level cache, ``calibration.fit.fit_alpha_beta_knee``) ``knee`` (bytes)
and ``beta_beyond`` (s/byte past it), the in-situ latency ``alpha_insitu`` (s) and, per
count of ranks sharing the host, ``alpha_insitu_shared`` (``calibration.insitu``), next to
what they were fitted from (``points``, ``spread``, ...), and ``insitu_block_s`` (s), the
compute the shared probe ran before each call, alone on the host. In memory they are one frozen
``CollectiveTables`` (``costs.timing.collective_time`` prices with it); only ``from_dict`` /
``to_dict`` know the YAML keys, and a profile read and written back gives the same mapping.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import Any

from .errors import SpecError
from .surfaces import bytes_time
from .tables import RankCurve, mapping, number, rows

COLLECTIVES = "profile.network.collectives"


@dataclass(frozen=True)
class InsituFit:
    """A collective timed in situ (``calibration.insitu``): its latency next to the
    back-to-back beta, seconds, and the points it was fitted from (bytes, median, p10, p90)."""
    alpha: float
    points: tuple[tuple[float, ...], ...]
    call: str = "after a compute block of two model-shaped MLP GEMMs per call (calibration.insitu)"


@dataclass(frozen=True)
class CollectiveFit:
    """One collective at one group size: time = alpha + beta * x seconds, x the bytes each
    rank passes to the call (+ (beta_beyond - beta) * (x - knee) past a ``knee``); in situ
    (called right after compute) ``alpha_insitu``, and ``alpha_insitu_shared`` {ranks on the
    host: alpha} when more ranks than the group share it, measured after a compute block of
    ``insitu_block_s`` seconds (alone on the host) before each call."""
    alpha: float
    beta: float
    knee: float | None = None                        # bytes; None: one slope over every size
    beta_beyond: float | None = None                 # s/byte past ``knee``
    call: str | None = None                          # the torch call timed
    spread: float | None = None                      # median (p90 - p10) / median over the sizes
    fit_rms_rel: float | None = None
    points: tuple[tuple[float, ...], ...] | None = None      # (bytes, mean s, p10 s, p90 s); median s before format 11
    alpha_insitu: float | None = None
    insitu_call: str | None = None
    insitu_points: tuple[tuple[float, ...], ...] | None = None
    alpha_insitu_shared: RankCurve | None = None
    insitu_shared_points: dict[str, tuple] | None = None     # ranks on the host -> points
    insitu_block_s: float | None = None              # s: the shared probe's compute per call, alone

    _ORDER = ("alpha", "beta", "knee", "beta_beyond", "call", "spread", "fit_rms_rel", "points", "alpha_insitu",
              "insitu_call", "insitu_points", "alpha_insitu_shared", "insitu_shared_points", "insitu_block_s")

    def seconds(self, x: float, in_situ: bool = False, host_ranks: int | None = None, group: int = 0,
                block_s: float | None = None, busy: float | None = None) -> float:
        """alpha + the bytes' time (``bytes_seconds``) [s]; in situ the in-situ latency where
        measured, and the one for ``host_ranks`` ranks on the host where that count (above the
        ``group`` size) was: ``shared_alpha``, by the compute ``block_s`` before the call and the
        share ``busy`` of the time the host's other ranks compute."""
        alpha = self.alpha
        if in_situ:
            alpha = self.alpha if self.alpha_insitu is None else self.alpha_insitu
            if host_ranks is not None and host_ranks > group and self.alpha_insitu_shared is not None:
                alpha = self.shared_alpha(host_ranks, alpha, block_s, busy)
        return float(alpha) + self.bytes_seconds(x)

    def shared_alpha(self, host_ranks: int, own: float, block_s: float | None, busy: float | None = None) -> float:
        """In-situ latency [s] of a call after ``block_s`` seconds of compute (solo-priced) while
        ``host_ranks`` ranks share the host. What the shared probe adds over the group's own
        latency ``own`` is the wait for a peer the scheduler time-sliced during the block:
        it grows with the block (``studies/validation_cpu/tp_gap.py``: on 4 ranks over 2 cores
        the 2-rank all-gathers that follow a layernorm, gap < 0.3 ms, cost 1.08 ms median against
        2.3 ms after 1.2-2.5 ms of compute; ``insitu_block.txt``: 2.5 -> 5.1 ms over blocks of
        1-8 GEMMs). Priced linearly from none at no compute to the probe's premium at its block
        ``insitu_block_s``, held beyond. ``block_s`` None, or a profile without the block: the
        probe's latency as measured.

        A peer is time-sliced only while the host's other ranks want its core: the probe's
        premium is measured with them computing between all their calls, a plan's ranks also
        sit in bubbles and wait for messages. So the premium is further scaled by ``busy``, the
        share of the step the other ranks compute (the engine's mean field, ``sim.run``; None:
        always, as the probe). Checked on the two 4-rank tp=2 pp=2 SP traces kept
        (``tp_gap.py``): the reduce-scatters after long compute paid 0.42 of the probe's premium
        with the other stage computing 0.44 of the time (Intel VM, 2026-11-28), 0.18 after half
        the probe's block with it computing 0.31 (AMD EPYC VM, 2026-11-29)."""
        shared = float(self.alpha_insitu_shared.get(host_ranks, own))
        paid = 1.0 if busy is None else min(max(float(busy), 0.0), 1.0)
        if block_s is not None and self.insitu_block_s:
            paid *= min(max(block_s, 0.0) / self.insitu_block_s, 1.0)
        return own + (shared - own) * paid

    def bytes_seconds(self, x: float) -> float:
        """The bytes' part of the time [s] (``bytes_time``)."""
        return float(bytes_time(x, self.beta, self.knee, self.beta_beyond))

    def with_insitu(self, insitu: InsituFit, host_ranks: int | None = None,
                    block_s: float | None = None) -> "CollectiveFit":
        """This fit with an in-situ latency: its own group's (``host_ranks`` None), or the one
        measured while ``host_ranks`` ranks share the host (``alpha_insitu_shared``) after
        ``block_s`` seconds of compute alone (``insitu_block_s``; None: kept as it was)."""
        if host_ranks is None:
            return replace(self, alpha_insitu=insitu.alpha, insitu_call=insitu.call, insitu_points=insitu.points)
        shared = (self.alpha_insitu_shared or RankCurve()).with_value(host_ranks, insitu.alpha)
        points = {**(self.insitu_shared_points or {}), str(host_ranks): insitu.points}
        block = self.insitu_block_s if block_s is None or not block_s > 0 else float(block_s)
        return replace(self, alpha_insitu_shared=shared, insitu_shared_points=points, insitu_block_s=block)

    @classmethod
    def from_dict(cls, where: str, raw: Any) -> "CollectiveFit":
        d = mapping(where, raw)
        for k in d:
            if k not in cls._ORDER:
                raise SpecError(f"{where}.{k}", d[k], f"unknown key; allowed: {', '.join(cls._ORDER)}")
        for k in ("alpha", "beta"):
            if k not in d:
                raise SpecError(f"{where}.{k}", None, "required key missing in the collective fit")

        if ("knee" in d) != ("beta_beyond" in d):
            have, lack = ("knee", "beta_beyond") if "knee" in d else ("beta_beyond", "knee")
            raise SpecError(f"{where}.{lack}", None, f"required with {have}: the slope past the knee and "
                                                     "where it starts come together")

        def opt(k, read):
            return read(f"{where}.{k}", d[k]) if k in d else None
        beta = _time(f"{where}.beta", d["beta"])
        knee, beyond = opt("knee", number), opt("beta_beyond", _time)
        if knee is not None and not knee > 0:
            raise SpecError(f"{where}.knee", d["knee"], "a message size > 0 (bytes)")
        if beyond is not None and beyond < beta:
            raise SpecError(f"{where}.beta_beyond", d["beta_beyond"],
                            f"a number >= beta ({beta:g} s/byte): past the knee the bytes cost more, not less")
        return cls(alpha=_time(f"{where}.alpha", d["alpha"]), beta=beta, knee=knee, beta_beyond=beyond,
                   call=opt("call", lambda w, v: str(v)), spread=opt("spread", number),
                   fit_rms_rel=opt("fit_rms_rel", number), points=opt("points", _points),
                   alpha_insitu=opt("alpha_insitu", _time), insitu_call=opt("insitu_call", lambda w, v: str(v)),
                   insitu_points=opt("insitu_points", _points),
                   alpha_insitu_shared=opt("alpha_insitu_shared", RankCurve.from_dict),
                   insitu_shared_points=opt("insitu_shared_points", lambda w, v: {
                       str(n): _points(f"{w}.{n}", p) for n, p in mapping(w, v).items()}),
                   insitu_block_s=opt("insitu_block_s", _block))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in self._ORDER:
            v = getattr(self, k)
            if v is None:
                continue
            if isinstance(v, RankCurve):
                v = v.to_dict()
            elif k == "insitu_shared_points":
                v = {n: [list(p) for p in pts] for n, pts in v.items()}
            elif isinstance(v, tuple):
                v = [list(p) for p in v]
            out[k] = v
        return out


def _time(where: str, raw: Any) -> float:
    """alpha [s] or beta [s/byte]: a negative one would price a message below zero seconds."""
    value = number(where, raw)
    if value < 0:
        raise SpecError(where, raw, "a finite number >= 0 (seconds, or seconds per byte)")
    return value


def _block(where: str, raw: Any) -> float:
    """``insitu_block_s`` [s]: the shared probe's compute before each call; it divides."""
    value = number(where, raw)
    if not value > 0:
        raise SpecError(where, raw, "a number > 0 (seconds of compute before each call)")
    return value


def _points(where: str, raw: Any) -> tuple[tuple[float, ...], ...]:
    return rows(where, raw, (4,))


@dataclass(frozen=True)
class CollectiveTables:
    """{op: {group size: CollectiveFit}} in the order measured; empty when uncalibrated."""
    ops: dict[str, dict[int, CollectiveFit]] | None = None

    def fit(self, op: str, n: int) -> CollectiveFit | None:
        """The fit for ``op`` over ``n`` ranks: that size where measured, else the nearest
        measured size above it (the largest when none is). None: ``op`` not calibrated."""
        table = (self.ops or {}).get(op)
        if not table:
            return None
        if n in table:
            return table[n]
        sizes = sorted(table)
        return table[sizes[min(bisect.bisect_left(sizes, n), len(sizes) - 1)]]

    def __bool__(self) -> bool:
        return bool(self.ops)

    def without_shared_premium(self) -> "CollectiveTables":
        """These tables with no in-situ price that depends on the ranks sharing the host
        (``alpha_insitu_shared`` dropped): every TP call at its group's own in-situ latency, the
        least the shared host's engine price can come to (``CollectiveFit.shared_alpha`` at a
        computing share of 0)."""
        return CollectiveTables({op: {n: replace(f, alpha_insitu_shared=None, insitu_shared_points=None)
                                      for n, f in per.items()} for op, per in (self.ops or {}).items()})

    @property
    def prices_by_host_ranks(self) -> bool:
        """Does some in-situ price depend on the ranks sharing the host (``alpha_insitu_shared``)?"""
        return any(f.alpha_insitu_shared is not None for per in (self.ops or {}).values() for f in per.values())

    def with_fit(self, op: str, n: int, fit: CollectiveFit) -> "CollectiveTables":
        """These tables with ``fit`` for ``op`` over ``n`` ranks (replacing one, else added)."""
        ops = {o: dict(per) for o, per in (self.ops or {}).items()}
        ops.setdefault(op, {})[n] = fit
        return CollectiveTables(ops)

    def entries(self):
        """(op, group size, fit) of every entry, in the order measured."""
        return [(op, n, f) for op, per in (self.ops or {}).items() for n, f in per.items()]

    @classmethod
    def from_dict(cls, raw: Any, where: str = COLLECTIVES) -> "CollectiveTables":
        if raw is None:
            return cls()
        ops = {}
        for op, per in mapping(where, raw).items():
            table = {}
            for n, entry in mapping(f"{where}.{op}", per).items():
                if not str(n).isdigit():
                    raise SpecError(f"{where}.{op}", n, "group sizes (positive integers) as keys")
                table[int(n)] = CollectiveFit.from_dict(f"{where}.{op}.{n}", entry)
            ops[str(op)] = table
        return cls(ops)

    def to_dict(self) -> dict[str, Any]:
        return {op: {str(n): f.to_dict() for n, f in per.items()} for op, per in (self.ops or {}).items()}
