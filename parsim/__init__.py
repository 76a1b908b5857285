"""parsim: simulate and execute distributed transformer training plans.

The public Python API (``parsim.api``; README "Python API"):

    import parsim
    res = parsim.simulate("gpt3-1.3b", "a100-80g:8", "dp=2 pp=4 gbs=16")

``simulate``, ``memory``, ``sweep``, ``recommend``, ``execute``, ``calibrate``,
``calibrate_runs`` and ``validate`` are functions of this package; the partitioner is ``parsim.api.partition`` (``parsim.partition``
is the partitioner's own package, whose ``partition`` function it wraps). They are loaded on
first use, so ``import parsim`` stays cheap and never imports torch.
"""
__version__ = "0.1.0"

_API = ("simulate", "memory", "sweep", "recommend", "execute", "calibrate", "calibrate_runs", "validate", "Result",
        "MemoryReport", "Sweep", "Calibration", "RunsFit")
_SPECS = ("ModelSpec", "ClusterSpec", "Plan", "SpecError", "load_model", "load_cluster", "parse_plan")

__all__ = [*_API, *_SPECS, "api"]


def __getattr__(name: str):
    # import_module, not ``from . import api``: that looks the name up here first and recurses
    from importlib import import_module
    if name in _API or name == "api":
        api = import_module("parsim.api")
        return api if name == "api" else getattr(api, name)
    if name in _SPECS:
        return getattr(import_module("parsim.specs"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
