"""Save and load a Trace as parsim's own JSON (events and meta; ``.gz`` paths are gzipped).

Layout: ``{"format": "parsim-trace", "version": 1, "meta": {...}, "columns": [...],
"events": [[...], ...]}`` with one row per event in ``columns`` order — rows, not objects,
because a simulated step has ~1e5 events and the field names would triple the file.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import fields
from pathlib import Path
from typing import IO, Any

from parsim.specs.errors import SpecError
from parsim.specs.files import output_file

from .events import Event, Trace

FORMAT = "parsim-trace"
VERSION = 1
COLUMNS = [f.name for f in fields(Event)]


def trace_to_json(trace: Trace) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "meta": trace.meta, "columns": COLUMNS,
            "events": [[getattr(e, c) for c in COLUMNS] for e in trace.events]}


def trace_from_json(obj: dict[str, Any]) -> Trace:
    if obj.get("format") != FORMAT:
        raise ValueError(f"not a parsim trace: format={obj.get('format')!r} (expected {FORMAT!r})")
    if obj.get("version") != VERSION:
        raise ValueError(f"parsim trace version {obj.get('version')!r} is not supported (expected {VERSION})")
    cols = obj["columns"]
    events = [Event(**dict(zip(cols, row))) for row in obj["events"]]
    return Trace(events=events, meta=dict(obj.get("meta", {})))


def save_trace(trace: Trace, path: str | Path) -> Path:
    path = Path(path)
    with output_file(path, "trace") as tmp:       # whole or not at all (parsim.specs.files)
        with _open(tmp, "w") as f:
            json.dump(trace_to_json(trace), f, default=jsonable)
    return path


def load_trace(path: str | Path) -> Trace:
    """A trace saved by ``save_trace``; SpecError (naming the file) when it is not one."""
    try:
        with _open(Path(path), "r") as f:
            return trace_from_json(json.load(f))
    except OSError as e:
        raise SpecError("trace", str(path), f"a readable parsim trace file ({e.strerror or e})") from None
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError, EOFError) as e:
        # JSON syntax, UTF-8, gzip, the format checks of trace_from_json, rows that do not fit the columns
        raise SpecError("trace", str(path), f"a parsim trace file ({type(e).__name__}: {e})") from None


def _open(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, mode + "t", encoding="utf-8")
    return path.open(mode, encoding="utf-8")


def jsonable(x: Any) -> Any:
    """``json.dump`` default: dataclass-likes, numpy scalars, sets and tuples."""
    if hasattr(x, "to_dict"):
        return x.to_dict()
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
