"""Chrome / Perfetto trace export and import.

Format: the Trace Event Format's JSON object form (Google, "Trace Event Format", 2016):
``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``. Each Event becomes a
complete event (``"ph": "X"``) with ``ts``/``dur`` in microseconds, ``pid`` = rank and
``tid`` = the stream's index in STREAMS; metadata events (``"ph": "M"``) name the rows
"rank 3" / "compute" so Perfetto (ui.perfetto.dev) and chrome://tracing label them.
The schema fields that have no Chrome slot travel in ``args``; the trace's ``meta`` travels
in ``otherData``, so ``load_chrome_trace`` gives back the same Trace.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .events import STREAMS, Event, Trace
from .io import jsonable

US = 1e6   # microseconds per second: Chrome's ts/dur unit


def stream_tid(stream: str) -> int:
    """Thread id of a stream: its index in STREAMS (unknown streams go after them, stably)."""
    if stream in STREAMS:
        return STREAMS.index(stream)
    return len(STREAMS) + sum(map(ord, stream))


def to_chrome(trace: Trace) -> dict[str, Any]:
    """The Chrome trace JSON object of a Trace."""
    out: list[dict[str, Any]] = []
    rows = sorted({(e.rank, e.stream) for e in trace.events}, key=lambda rs: (rs[0], stream_tid(rs[1])))
    for rank in sorted({r for r, _ in rows}):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    for rank, stream in rows:
        tid = stream_tid(stream)
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": stream}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "args": {"sort_index": tid}})
    for e in trace.events:
        out.append({
            "ph": "X", "name": e.name or e.kind, "cat": e.kind,
            "pid": e.rank, "tid": stream_tid(e.stream),
            "ts": e.start * US, "dur": (e.end - e.start) * US,
            "args": {"stream": e.stream, "kind": e.kind, "stage": e.stage, "microbatch": e.microbatch,
                     "layer": e.layer, "bytes": e.bytes, "flops": e.flops},
        })
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {"parsim_meta": trace.meta}}


def save_chrome_trace(trace: Trace, path: str | Path) -> Path:
    """Write the Chrome trace JSON; open it in ui.perfetto.dev or chrome://tracing."""
    from parsim.specs.files import output_file
    path = Path(path)
    with output_file(path, "trace") as tmp:       # whole or not at all
        with tmp.open("w") as f:
            json.dump(to_chrome(trace), f, default=jsonable)
    return path


def from_chrome(obj: dict[str, Any] | list[dict[str, Any]]) -> Trace:
    """A Trace from a Chrome trace object (ours, or any with complete events: then the
    stream is the thread name and the kind is ``cat`` or the event name)."""
    records = obj["traceEvents"] if isinstance(obj, dict) else obj
    meta = dict(obj.get("otherData", {}).get("parsim_meta", {})) if isinstance(obj, dict) else {}
    thread_names = {(r["pid"], r["tid"]): r["args"]["name"] for r in records
                    if r.get("ph") == "M" and r.get("name") == "thread_name"}
    events: list[Event] = []
    for r in records:
        if r.get("ph") != "X":
            continue
        a = r.get("args", {})
        start = float(r["ts"]) / US
        events.append(Event(
            rank=int(r["pid"]), stage=int(a.get("stage", -1)),
            stream=a.get("stream", thread_names.get((r["pid"], r["tid"]), str(r["tid"]))),
            kind=a.get("kind", r.get("cat", r.get("name", ""))),
            microbatch=int(a.get("microbatch", -1)), layer=int(a.get("layer", -1)),
            start=start, end=start + float(r.get("dur", 0.0)) / US,
            bytes=float(a.get("bytes", 0.0)), flops=float(a.get("flops", 0.0)), name=r.get("name", "")))
    return Trace(events=events, meta=meta)


def load_chrome_trace(path: str | Path) -> Trace:
    """Read a Chrome trace JSON file back into a Trace (times in seconds again)."""
    with Path(path).open() as f:
        return from_chrome(json.load(f))

