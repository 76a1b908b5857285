"""Plots (matplotlib Figures saved with Agg; no pyplot global state): timelines and memory.

matplotlib is imported on first use, so importing ``parsim.plots.<module>`` or the CLI stays cheap.
"""
_EXPORTS = {
    "plot_timeline": "timeline", "plot_timeline_pair": "timeline",
    "plot_memory_breakdown": "memory", "plot_memory_over_time": "memory",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        from importlib import import_module
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
