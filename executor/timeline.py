"""Per-rank step timeline in the trace schema (``parsim.trace.Event``), and its Chrome export.

Every Schedule IR action becomes one ``compute`` event named like the simulator's
(``F3.1``: kind, virtual stage, microbatch; ``layer == -1``); every collective and pipeline
message becomes an event on the ``tp``, ``dp`` or ``pp`` stream. Times are seconds from the
start of the step on this rank (each step starts right after a barrier, so ranks line up).

Clock: ``time.perf_counter`` on CPU. On CUDA each mark is a ``torch.cuda.Event`` recorded on the
current stream and resolved after the step's synchronize, so GPU time, not launch time, is
measured. Asynchronous collectives end when their future completes (CPU; gloo send/recv have no
future: a waiter thread timestamps them) or when they are waited for (CUDA).
"""
from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any

import torch

from parsim.trace import STREAMS, Event, action_name


class StepClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.origin: Any = None

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        self.origin = self.mark()

    def seconds(self, mark) -> float:
        if not self.cuda:
            return mark - self.origin
        return self.origin.elapsed_time(mark) / 1e3

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


class NullMemory:
    """Stands in for ``memory.MemoryTracker`` on steps whose memory is not tracked."""

    @contextlib.contextmanager
    def phase(self, category: str):
        yield

    def classify(self, tensors, category: str) -> None:
        pass

    @contextlib.contextmanager
    def comm_buffers(self, tensors):
        yield


class StepRecorder:
    """Collects the events of one step on one rank."""

    def __init__(self, rank: int, device: torch.device):
        self.rank = rank
        self.clock = StepClock(device)
        self.memory: Any = NullMemory()
        self.stage = -1
        self.microbatch = -1
        self._pending: list[tuple] = []   # (stream, kind, stage, mb, layer, start, end, bytes, name)
        self._lock = threading.Lock()
        self._waiter: CompletionWaiter | None = None

    def begin_step(self) -> None:
        self._pending = []
        self.stage, self.microbatch = -1, -1
        self.clock.start()

    def end_step(self) -> tuple[float, list[Event]]:
        """Step time (seconds) on this rank and its events."""
        end = self.clock.mark()
        self.clock.synchronize()
        with self._lock:
            pending = list(self._pending)
        events = []
        for stream, kind, stage, mb, layer, start, stop, nbytes, name in pending:
            if stop is None:
                continue
            events.append(Event(rank=self.rank, stage=stage, stream=stream, kind=kind, microbatch=mb, layer=layer,
                                start=self.clock.seconds(start), end=self.clock.seconds(stop), bytes=float(nbytes),
                                name=name))
        events.sort(key=lambda e: (e.start, e.stream))
        return self.clock.seconds(end), events

    def _add(self, stream, kind, layer, start, stop, nbytes, name) -> list:
        entry = [stream, kind, self.stage, self.microbatch, layer, start, stop, nbytes, name]
        with self._lock:
            self._pending.append(entry)
        return entry

    @contextlib.contextmanager
    def action(self, kind: str, stage: int, microbatch: int):
        """One Schedule IR action (F/B/I/W): a ``compute`` event named like the simulator's."""
        self.stage, self.microbatch = stage, microbatch
        start = self.clock.mark()
        try:
            with self.memory.phase("activations"):
                yield
        finally:
            self._add("compute", kind, -1, start, self.clock.mark(), 0, action_name(kind, stage, microbatch))
            self.stage, self.microbatch = -1, -1

    @contextlib.contextmanager
    def compute(self, kind: str, name: str, category: str = "other"):
        """Work outside the IR actions (optimizer step, gradient finalisation)."""
        start = self.clock.mark()
        try:
            with self.memory.phase(category):
                yield
        finally:
            self._add("compute", kind, -1, start, self.clock.mark(), 0, name)

    @contextlib.contextmanager
    def comm(self, stream: str, kind: str, nbytes: int, layer: int = -1, name: str = "", tensors=()):
        """A blocking collective or message on ``tensors`` (on a memory-tracked step the block also
        waits for the backend to release them: ``MemoryTracker.comm_buffers``)."""
        start = self.clock.mark()
        try:
            with self.memory.comm_buffers(tensors):
                yield
        finally:
            self._add(stream, kind, layer, start, self.clock.mark(), nbytes, name or kind)

    def async_comm(self, stream: str, kind: str, nbytes: int, work, name: str = "", layer: int = -1,
                   watch: bool = True, start=None) -> "AsyncOp":
        """An asynchronous collective or message: starts now (or at ``start``, a ``clock.mark()``
        taken before the call that launched it), ends when its work completes. ``watch=False``:
        someone else waits for ``work`` (FSDP); without a future the event then only marks the
        launch."""
        start = self.clock.mark() if start is None else start
        entry = self._add(stream, kind, layer, start, None, nbytes, name or kind)
        op = AsyncOp(work, entry, self.clock)
        if not watch and not op.has_future:
            entry[6] = start
        elif not self.clock.cuda and not op.has_future:
            if self._waiter is None:
                self._waiter = CompletionWaiter()
            self._waiter.watch(op)
        return op


class AsyncOp:
    """An in-flight ``Work`` and its trace entry.

    On CPU the end time is taken when the work completes: from its future's callback, or --
    gloo send/recv have no future, and may be waited for only once -- by the recorder's one
    ``CompletionWaiter`` thread, which owns that wait and hands completion (or its error) over.
    On CUDA the end is marked when the caller waits."""

    def __init__(self, work, entry: list, clock: StepClock):
        self.work, self.entry, self.clock = work, entry, clock
        self.has_future = False
        self.done: threading.Event | None = None
        self.error: BaseException | None = None
        if not clock.cuda:
            try:
                work.get_future().add_done_callback(self._stamp)
                self.has_future = True
            except RuntimeError:
                self.done = threading.Event()

    def _stamp(self, _future=None) -> None:
        self.entry[6] = time.perf_counter()

    def is_completed(self) -> bool:
        return self.done.is_set() if self.done is not None else self.work.is_completed()

    def wait(self) -> None:
        if self.done is not None:
            self.done.wait()
            if self.error is not None:
                raise self.error
        else:
            self.work.wait()
        if self.entry[6] is None:
            self.entry[6] = self.clock.mark()


class CompletionWaiter:
    """One daemon thread that waits for future-less works in order and timestamps them."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="parsim-completion", daemon=True).start()

    def watch(self, op: AsyncOp) -> None:
        self._queue.put(op)

    def _run(self) -> None:
        while True:
            op = self._queue.get()
            try:
                op.work.wait()
                op._stamp()
            except BaseException as err:   # noqa: BLE001 -- re-raised by AsyncOp.wait on the caller
                op.error = err
            # Let go of the op before announcing it: a gloo send's Work keeps its tensor until the
            # Work dies, and a local still bound while this thread blocks on the next ``get`` kept
            # the last message's buffer alive into the caller's next allocations (stop 47).
            done, op = op.done, None
            done.set()


def chrome_trace(events: list[Event], meta: dict | None = None) -> dict:
    """Chrome / Perfetto trace: pid = rank, tid = stream, ts/dur in microseconds."""
    out: list[dict] = []
    ranks = sorted({e.rank for e in events})
    for rank in ranks:
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        for tid, stream in enumerate(STREAMS):
            out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": stream}})
    for e in events:
        out.append({"ph": "X", "name": e.name, "cat": e.kind, "pid": e.rank, "tid": STREAMS.index(e.stream),
                    "ts": e.start * 1e6, "dur": max(e.end - e.start, 0.0) * 1e6,
                    "args": {"stage": e.stage, "microbatch": e.microbatch, "layer": e.layer, "bytes": e.bytes}})
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": dict(meta or {})}
