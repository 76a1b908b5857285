"""The trace: one event schema for simulated and measured steps, metrics, exports."""
from .chrome import from_chrome, load_chrome_trace, save_chrome_trace, to_chrome
from .events import COMM_KINDS, COMPUTE_KINDS, STREAMS, Event, Trace, action_name
from .io import load_trace, save_trace
from .metrics import (EXPOSED_STREAMS, bubble_fraction, bubble_fraction_by_rank, busy_time, exposed_comm,
                      exposed_comm_by_rank, hardware_flops, hfu, idle_time, mfu, step_time, summary)

# to_dataframe / from_dataframe (parsim.trace.frame) need pandas, imported on first use (below).


def __getattr__(name: str):
    # pandas costs ~0.3 s to import; load the DataFrame helpers only when asked for
    if name in ("to_dataframe", "from_dataframe"):
        from . import frame
        return getattr(frame, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
