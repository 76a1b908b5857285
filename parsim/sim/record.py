"""What the engine writes down while it runs: trace events and per-rank time accounts.

The accounts are kept directly (not re-derived from the events), so the metrics do not depend
on whether events are kept or how fine they are:

* ``busy[rank]``: seconds the compute stream is occupied (whole actions, TP collectives inside
  them included, and the on-device optimizer step): the bubble is the rest.
* ``exposed[rank][stream]``: seconds the compute stream is *blocked* on communication:
  ``tp`` = TP collectives on the critical path of an action (the part the other half's
  compute does not cover with sub-pipelined TP, plus any wait for peers or the link);
  ``pp`` = waiting for an input whose transfer is on the wire (waiting before the neighbour
  has produced it is bubble, not communication); ``dp`` = waiting for a ZeRO-3 parameter
  gather inside an action, for the gradient sync after the rank's last backward, and for
  the ZeRO-1/2 parameter all-gather after the optimizer step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from parsim.trace.events import Event

EXPOSED = ("tp", "dp", "pp")


# Name markers of rows whose name is formatted only when the trace is built (the names of
# ~10^5 actions and sends cost a quarter of a large run when formatted as it goes).
ACTION = None                      # "F3.1": kind, stage, microbatch
SEND_F, SEND_B = ("send", "F"), ("send", "B")      # "send F3.1": activations / gradients of stage 3
RECV_F, RECV_B = ("recv", "F"), ("recv", "B")      # "recv F2.1": from stage 2 (to F3.1)


@dataclass
class Recorder:
    keep_events: bool = True      # keep trace events at all
    detail: bool = False          # per-layer compute and per-collective TP events too
    rows: list[tuple] = field(default_factory=list)   # Event fields in order (name may be a marker)
    busy: dict[int, float] = field(default_factory=dict)
    exposed: dict[int, dict[str, float]] = field(default_factory=dict)
    finish: dict[int, float] = field(default_factory=dict)
    copies: dict[int, tuple[int, ...]] = field(default_factory=dict)   # simulated rank -> the ranks it stands for

    def add_rank(self, rank: int) -> None:
        self.busy[rank] = 0.0
        self.exposed[rank] = dict.fromkeys(EXPOSED, 0.0)

    def event(self, rank: int, stage: int, stream: str, kind: str, microbatch: int, layer: int,
              start: float, end: float, nbytes: float = 0.0, flops: float = 0.0, name: str = "") -> None:
        if self.keep_events:
            self.rows.append((rank, stage, stream, kind, microbatch, layer, start, end, nbytes, flops, name))

    def compute(self, rank: int, stage: int, kind: str, microbatch: int, start: float, end: float,
                flops: float = 0.0, name: str = "") -> None:
        """A whole-action (or optimizer) interval on the compute stream."""
        self.busy[rank] += end - start
        if self.keep_events:
            self.rows.append((rank, stage, "compute", kind, microbatch, -1, start, end, 0.0, flops, name))

    def expose(self, rank: int, stream: str, seconds: float) -> None:
        if seconds > 0:
            self.exposed[rank][stream] += seconds

    def stand_for(self, members: dict[int, tuple[int, ...]]) -> None:
        """Each simulated rank stands for the ranks of its class (``symmetry``): they get its
        accounts now and its events, rank renamed, when the trace is built."""
        for rep, ranks in members.items():
            for r in ranks:
                if r != rep:
                    self.busy[r] = self.busy[rep]
                    self.exposed[r] = dict(self.exposed[rep])
                    self.finish[r] = self.finish[rep]
        self.copies = {rep: ranks for rep, ranks in members.items() if len(ranks) > 1}

    def events(self) -> list[Event]:
        """The trace events, names formatted; an event of a rank that stands for others once per
        rank of its class, in rank order."""
        out = []
        copies = self.copies
        for row in self.rows:
            name = row[10]
            if name is ACTION:
                name = f"{row[3]}{row[1]}.{row[4]}"
            elif type(name) is tuple:
                stage = row[1]
                if name[0] == "recv":      # the row is on the receiving stage; name the sender's
                    stage += -1 if name[1] == "F" else 1
                name = f"{name[0]} {name[1]}{stage}.{row[4]}"
            ranks = copies.get(row[0])
            if ranks is None:
                out.append(Event(*row[:10], name))
            else:
                out.extend(Event(r, *row[1:10], name) for r in ranks)
        return out
