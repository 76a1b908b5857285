"""A Trace as a pandas DataFrame: one row per event, columns = Event fields + duration."""
from __future__ import annotations

from dataclasses import fields

import pandas as pd

from .events import Event, Trace

EVENT_COLUMNS = tuple(f.name for f in fields(Event))


def to_dataframe(trace: Trace) -> pd.DataFrame:
    """Columns: rank, stage, stream, kind, microbatch, layer, start, end, bytes, flops, name
    (seconds, bytes, FLOP), then duration = end - start (seconds)."""
    data = {c: [getattr(e, c) for e in trace.events] for c in EVENT_COLUMNS}
    df = pd.DataFrame(data, columns=list(EVENT_COLUMNS))
    df = df.astype({"rank": "int64", "stage": "int64", "microbatch": "int64", "layer": "int64",
                    "start": "float64", "end": "float64", "bytes": "float64", "flops": "float64",
                    "stream": "str", "kind": "str", "name": "str"})
    df["duration"] = df["end"] - df["start"]
    return df


def from_dataframe(df: pd.DataFrame, meta: dict | None = None) -> Trace:
    """The inverse of ``to_dataframe`` (extra columns such as duration are ignored)."""
    rows = df[list(EVENT_COLUMNS)].itertuples(index=False, name=None)
    events = [Event(int(r), int(s), str(st), str(k), int(mb), int(ly), float(a), float(b), float(by), float(fl), str(n))
              for r, s, st, k, mb, ly, a, b, by, fl, n in rows]
    return Trace(events=events, meta=dict(meta or {}))
