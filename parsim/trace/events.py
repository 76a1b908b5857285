"""The one event schema, shared by the simulator and the executor.

An Event is one interval on one rank's stream. Both engines emit one ``compute`` event per
Schedule IR action (``layer == -1``, ``kind`` in F/B/I/W, ``name`` = ``"F3.1"`` style, i.e.
kind, virtual stage, microbatch), so simulated and measured traces line up action by action.
Finer events (per layer, per collective) carry ``layer >= 0`` or a communication ``stream``.
Times are seconds from the start of the step; bytes and flops are per rank.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Streams (Chrome trace: tid). compute = the device's compute stream; tp/dp/pp = comm streams
# for tensor-parallel collectives, data-parallel/ZeRO collectives and pipeline p2p; host = PCIe
# transfers and CPU work for offload.
STREAMS = ("compute", "tp", "dp", "pp", "host")

# Event kinds.
COMPUTE_KINDS = ("F", "B", "I", "W", "R", "optimizer", "embedding", "head")   # R = recompute forward
COMM_KINDS = ("tp_allreduce", "tp_allgather", "tp_reducescatter",
              "dp_allreduce", "dp_reducescatter", "dp_allgather",
              "zero_allgather", "zero_reducescatter",
              "send", "recv", "offload_d2h", "offload_h2d", "ps_gather", "ps_broadcast")


@dataclass(slots=True)
class Event:
    rank: int
    stage: int            # virtual stage, -1 if not tied to a stage
    stream: str
    kind: str
    microbatch: int       # -1 if not tied to a microbatch
    layer: int            # -1 for whole-action events
    start: float          # seconds from step start
    end: float            # seconds from step start
    bytes: float = 0.0
    flops: float = 0.0
    name: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Trace:
    """All events of one step, plus what is needed to interpret them."""

    events: list[Event] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)   # engine, plan string, world size, ...

    def add(self, event: Event) -> None:
        self.events.append(event)

    @property
    def ranks(self) -> list[int]:
        return sorted({e.rank for e in self.events})

    @property
    def step_time(self) -> float:
        if not self.events:
            return 0.0
        return max(e.end for e in self.events) - min(e.start for e in self.events)

    def action_events(self, rank: int | None = None) -> list[Event]:
        """The one-per-IR-action compute events, in start order."""
        out = [e for e in self.events if e.stream == "compute" and e.layer == -1 and e.kind in ("F", "B", "I", "W")
               and (rank is None or e.rank == rank)]
        return sorted(out, key=lambda e: (e.rank, e.start))


def action_name(kind: str, stage: int, microbatch: int) -> str:
    return f"{kind}{stage}.{microbatch}"
