"""Processor sharing: the jobs computing on one host and their shared progress.

A rank idle in a pipeline bubble leaves its core to the others, so a job's speed follows how
many ranks compute at each instant: egalitarian processor sharing (Kleinrock, "Queueing Systems
Vol. 2", 1976, Sec. 4.4) with the host's measured sharing law (``host.HostModel.sharing``: n jobs
at once -> their GEMM, memory-bound and optimizer slowdowns). Seconds throughout.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

SharingLaw = Callable[[int], tuple[float, float, float]]   # jobs computing at once -> (g, m, o) slowdowns


class Clock(Protocol):
    """What ``ProcessorSharing`` needs of an event loop (a ``simpy.Environment`` has it)."""
    now: float

    def event(self) -> Any: ...

    def timeout(self, delay: float) -> Any: ...


@dataclass(eq=False)
class Job:
    """One action (or optimizer step) split into its solo seconds by kind: ``fixed`` (not
    slowed: e.g. TP collectives folded into the action), ``gemm``, ``membound`` and
    ``optimizer``."""
    fixed: float
    gemm: float
    membound: float
    optimizer: float
    done: Any                  # the clock's event, fired when the job's work is done
    left: float = 1.0          # fraction of the job still to do
    rate: float = 0.0          # fraction per second at the current sharing
    since: float = 0.0         # time ``left`` was last brought up to date
    token: int = 0             # the completion timeout that is still current

    def seconds(self, g: float, m: float, o: float) -> float:
        return self.fixed + self.gemm * g + self.membound * m + self.optimizer * o


@dataclass(eq=False)
class ProcessorSharing:
    """The jobs computing on one host right now and their shared progress: at ``n`` jobs at
    once a job takes ``fixed + gemm g(n) + membound m(n) + optimizer o(n)`` seconds, so it
    progresses at the reciprocal of that per second, re-rated whenever a job starts or ends."""
    clock: Clock
    factors: SharingLaw
    jobs: list[Job] = field(default_factory=list)

    def run(self, fixed: float, gemm: float, membound: float, optimizer: float = 0.0) -> Any:
        """Start a job of these solo seconds now; the event fires when it is done."""
        job = Job(fixed, gemm, membound, optimizer, self.clock.event())
        if job.seconds(1.0, 1.0, 1.0) <= 0:
            job.done.succeed()
            return job.done
        self._advance()
        job.since = self.clock.now
        self.jobs.append(job)
        self._reschedule()
        return job.done

    def estimate(self, fixed: float, gemm: float, membound: float) -> float:
        """Seconds a job would take if the sharing stayed as it is with the job added."""
        g, m, _ = self.factors(len(self.jobs) + 1)
        return fixed + gemm * g + membound * m

    def _advance(self) -> None:
        now = self.clock.now
        for j in self.jobs:
            j.left -= (now - j.since) * j.rate
            j.since = now

    def _reschedule(self) -> None:
        factors = self.factors(len(self.jobs))
        for j in self.jobs:
            j.rate = 1.0 / j.seconds(*factors)
            j.token += 1
            ev = self.clock.timeout(max(j.left, 0.0) / j.rate)
            ev.callbacks.append(self._finisher(j, j.token))

    def _finisher(self, job: Job, token: int):
        def finish(_event) -> None:
            if job.token != token:      # the sharing changed since: a newer timeout is current
                return
            self._advance()
            self.jobs.remove(job)
            job.done.succeed()
            if self.jobs:
                self._reschedule()
        return finish
