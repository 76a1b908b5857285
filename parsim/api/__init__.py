"""The public Python API: what the ``parsim`` commands do, for notebooks and scripts.

    import parsim
    res = parsim.simulate("gpt3-1.3b", "a100-80g:8", "dp=2 pp=4 gbs=16")
    res.step_time_s, res.mfu, res.peak_memory_bytes     # seconds, fraction, bytes
    res.to_pandas()                                     # one row per event of the step
    res.trace("step.json")                              # Chrome/Perfetto trace

Every function takes a model as a preset name, a YAML or HF ``config.json`` path, or a
``ModelSpec``; a cluster as ``PRESET:NDEVICES``, a YAML path or a ``ClusterSpec``; a plan as a
``k=v`` string, a YAML path, a dict or a ``Plan``; ``profile`` (a calibration profile name or
YAML) overrides the cluster's device and network numbers. Bad input raises ``SpecError`` naming
the field, the value and what is allowed. Nothing here prints: warnings about a plan are in
the result's ``warnings``. SI units throughout (seconds, bytes, FLOP, bytes/s).

``parsim.simulate``, ``memory``, ``sweep``, ``recommend``, ``execute``, ``calibrate``,
``calibrate_runs`` and ``validate`` are these functions; the partitioner is
``parsim.api.partition`` only, since ``parsim.partition`` names the partitioner's package. Only ``execute``, ``calibrate`` and
``validate`` (which run on real hardware) need torch; they import it when called.
"""
from .hardware import Calibration, RunsFit, calibrate, calibrate_runs, execute, profile_summary, validate
from .inputs import ClusterLike, ModelLike, PlanLike, load_specs
from .search import Sweep, partition, recommend, sweep
from .step import MemoryReport, Result, memory, parse_slowdown, simulate

__all__ = ["Calibration", "ClusterLike", "MemoryReport", "ModelLike", "PlanLike", "Result", "RunsFit", "Sweep",
           "calibrate", "calibrate_runs", "execute", "load_specs", "memory", "parse_slowdown", "partition",
           "profile_summary", "recommend", "simulate", "sweep", "validate"]
