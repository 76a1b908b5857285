"""Micro-benchmarks of this machine's devices and links, fitted into a profile YAML the
simulator reads (``parsim.specs.load_cluster(..., profile=PATH)``).

    from parsim.calibration import calibrate, write_profile
    profile = calibrate(model="cpu-small", ranks=(2, 4))
    write_profile(profile, "calibration/profiles/cpu-calibrated.yaml")

Modules: ``shapes`` (what to measure for a model), ``timer`` / ``compute`` (one device),
``comm`` (process groups: collectives, contention), ``fit`` (pure fitting), ``tables``
(samples -> calibrated tables), ``layer_terms`` (the terms priced through ``costs.timing``;
``refit``), ``profile`` (measurements -> profile mapping), ``profile_io`` (YAML out),
``machine`` (this machine's name and size), ``anchor`` (a profile re-derived from a later layer
probe), ``runner`` (the whole run).
Importing this package does not import torch; running a calibration does.
"""
from .fit import AlphaBeta, Summary, fit_alpha_beta, fit_gemm_efficiency, summarize
from .machine import default_profile_name
from .profile_io import write_profile
from .runner import CalibrationOptions, calibrate, make_options, run_calibration

__all__ = ["AlphaBeta", "CalibrationOptions", "Summary", "calibrate", "default_profile_name", "fit_alpha_beta",
           "fit_gemm_efficiency", "make_options", "run_calibration", "summarize", "write_profile"]
