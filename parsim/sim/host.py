"""Ranks sharing one host's cores: processor sharing, instant by instant.

On a calibrated CPU profile the ranks of a plan run as processes on the same cores and the
same memory bandwidth. A rank computing alone runs at its solo speed; with ``n`` ranks
computing at once each GEMM second stretches to ``g(n)`` seconds and each memory-bound
second to ``m(n)`` (``costs.timing.host_contention``: the slowdowns ``parsim calibrate``
measured with ``n`` ranks multiplying / streaming at once). That is egalitarian processor
sharing (Kleinrock, "Queueing Systems Vol. 2", 1976, Sec. 4.4) with a measured, not ideal,
sharing law: a job's progress rate changes whenever another rank starts or ends a job.

A job is one action (or the optimizer step) split into its solo seconds by kind: ``fixed``
(not slowed: e.g. TP collectives folded into the action), ``gemm`` and ``membound``; at
``n`` ranks computing it takes ``fixed + gemm g(n) + membound m(n)`` seconds, so it
progresses at the reciprocal of that per second. ``Host.run`` returns the event that fires
when the job's work is done.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import simpy


@dataclass(eq=False)
class Job:
    fixed: float
    gemm: float
    membound: float
    done: simpy.Event
    left: float = 1.0          # fraction of the job still to do
    rate: float = 0.0          # fraction per second at the current sharing
    since: float = 0.0         # simulated time ``left`` was last brought up to date
    token: int = 0             # the completion timeout that is still current

    def seconds(self, gemm_factor: float, membound_factor: float) -> float:
        return self.fixed + self.gemm * gemm_factor + self.membound * membound_factor


@dataclass(eq=False)
class Host:
    """The jobs computing on one host right now and their shared progress."""
    env: simpy.Environment
    factors: Callable[[int], tuple[float, float]]     # ranks computing -> (g(n), m(n))
    jobs: list[Job] = field(default_factory=list)

    def run(self, fixed: float, gemm: float, membound: float) -> simpy.Event:
        """Start a job of these solo seconds now; the event fires when it is done."""
        job = Job(fixed, gemm, membound, self.env.event())
        if job.seconds(1.0, 1.0) <= 0:
            job.done.succeed()
            return job.done
        self._advance()
        job.since = self.env.now
        self.jobs.append(job)
        self._reschedule()
        return job.done

    def estimate(self, fixed: float, gemm: float, membound: float) -> float:
        """Seconds a job would take if the sharing stayed as it is with the job added."""
        g, m = self.factors(len(self.jobs) + 1)
        return fixed + gemm * g + membound * m

    def _advance(self) -> None:
        now = self.env.now
        for j in self.jobs:
            j.left -= (now - j.since) * j.rate
            j.since = now

    def _reschedule(self) -> None:
        g, m = self.factors(len(self.jobs))
        for j in self.jobs:
            j.rate = 1.0 / j.seconds(g, m)
            j.token += 1
            ev = self.env.timeout(max(j.left, 0.0) / j.rate)
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
