"""Variability and faults as inputs of a what-if: per-step random compute variability, slow
devices, slow nodes and degraded NICs.

* ``Variability``: every device draws, every step, a factor on its compute time from a named
  distribution (seeded): ``lognormal:SIGMA`` (exp of a normal with mean 0 and standard
  deviation SIGMA: median 1, always positive — the usual model of run-to-run kernel-time noise,
  e.g. PRISM, Hu et al. 2024), ``normal:SIGMA`` (mean 1, standard deviation SIGMA, clipped at
  ``NORMAL_FLOOR``), or ``none``.
* ``Faults``: persistent slowdowns. ``slow_ranks`` {global rank: factor on its compute},
  ``slow_nodes`` {node: factor on the compute of all its devices}, ``degraded_nics``
  {node: factor on the time of every transfer over that node's NICs}.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from parsim.specs import ClusterSpec, SpecError

DISTRIBUTIONS = ("none", "lognormal", "normal")
NORMAL_FLOOR = 0.05           # a normal draw below this is clipped: compute never takes (almost) no time
# The largest sigma taken: lognormal:1 already spreads a device's compute over 0.05x-20x at 3
# sigma (measured kernel-time noise is a few %: PRISM, Hu et al. 2024); beyond it the draws
# reach factors no device shows and, far beyond, 0 or infinity.
MAX_SIGMA = 1.0


@dataclass(frozen=True)
class Variability:
    distribution: str = "none"
    sigma: float = 0.0

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise SpecError("variability", self.distribution, f"one of {', '.join(DISTRIBUTIONS)}")
        if not 0.0 <= self.sigma <= MAX_SIGMA:
            raise SpecError("variability", f"{self.distribution}:{self.sigma:g}",
                            f"sigma must be a number in [0, {MAX_SIGMA:g}] (the spread of a device's compute time "
                            "from step to step), e.g. lognormal:0.05")

    @classmethod
    def parse(cls, text: "str | Variability | None") -> "Variability":
        """``lognormal:0.05``, ``normal:0.03`` or ``none``."""
        if text is None or isinstance(text, Variability):
            return text or cls()
        name, _, sigma = str(text).partition(":")
        if name == "none" and not sigma:
            return cls()
        try:
            value = float(sigma)
        except ValueError:
            raise SpecError("variability", text, "DISTRIBUTION:SIGMA with DISTRIBUTION one of "
                            f"{', '.join(DISTRIBUTIONS[1:])}, e.g. lognormal:0.05") from None
        return cls(name, value)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` compute-time factors for one step."""
        if self.distribution == "none" or self.sigma == 0.0:
            return np.ones(n)
        if self.distribution == "lognormal":
            return np.exp(rng.normal(0.0, self.sigma, n))
        return np.maximum(rng.normal(1.0, self.sigma, n), NORMAL_FLOOR)

    def __str__(self) -> str:
        return "none" if self.distribution == "none" else f"{self.distribution}:{self.sigma:g}"


def parse_factors(field_name: str, text: "str | dict | None") -> dict[int, float]:
    """``"3=1.5,5=1.2"`` (or a dict) -> {3: 1.5, 5: 1.2}; indices non-negative integers,
    factors finite positive numbers."""
    if not text:
        return {}
    if isinstance(text, dict):
        items = list(text.items())
    else:
        items = []
        for part in str(text).split(","):
            key, sep, value = part.strip().partition("=")
            try:
                if not sep:
                    raise ValueError
                items.append((int(key), float(value)))
            except ValueError:
                raise SpecError(field_name, text, "comma-separated INDEX=FACTOR pairs, e.g. 3=1.5,5=1.2") from None
    for key, value in items:
        index = not isinstance(key, bool) and isinstance(key, (int, np.integer)) and key >= 0
        factor = not isinstance(value, bool) and isinstance(value, (int, float, np.number)) and 0 < value < np.inf
        if not (index and factor):
            raise SpecError(field_name, f"{key!r}={value!r}", "a non-negative integer index and a finite positive factor")
    return {int(k): float(v) for k, v in items}


@dataclass(frozen=True)
class Faults:
    slow_ranks: dict[int, float] = field(default_factory=dict)
    slow_nodes: dict[int, float] = field(default_factory=dict)
    degraded_nics: dict[int, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, slow_ranks=None, slow_nodes=None, degraded_nics=None) -> "Faults":
        return cls(parse_factors("slow_ranks", slow_ranks), parse_factors("slow_nodes", slow_nodes),
                   parse_factors("degraded_nics", degraded_nics))

    def check(self, cluster: ClusterSpec, world: int) -> None:
        for r in self.slow_ranks:
            if r >= world:
                raise SpecError("slow_ranks", r, f"a rank in 0..{world - 1}")
        nodes = -(-world // cluster.devices_per_node)
        for name, given in (("slow_nodes", self.slow_nodes), ("degraded_nics", self.degraded_nics)):
            for n in given:
                if n >= nodes:
                    raise SpecError(name, n, f"a node in 0..{nodes - 1} ({cluster.devices_per_node} devices each)")

    def compute_factors(self, cluster: ClusterSpec, world: int) -> np.ndarray:
        """Persistent factor on every rank's compute time (slow ranks times slow nodes)."""
        out = np.ones(world)
        for r, f in self.slow_ranks.items():
            out[r] *= f
        per_node = cluster.devices_per_node
        for n, f in self.slow_nodes.items():
            out[n * per_node:min((n + 1) * per_node, world)] *= f
        return out

    def nic_factors(self, cluster: ClusterSpec, world: int) -> dict[int, float]:
        """{rank: factor on its NIC transfers} for the ranks on degraded nodes."""
        per_node = cluster.devices_per_node
        return {r: f for n, f in self.degraded_nics.items() for r in range(n * per_node, min((n + 1) * per_node, world))}

    @property
    def any(self) -> bool:
        return bool(self.slow_ranks or self.slow_nodes or self.degraded_nics)
