"""The trace: one event schema for simulated and measured steps, metrics, exports."""
from .events import COMM_KINDS, COMPUTE_KINDS, STREAMS, Event, Trace, action_name

