"""The host memory policy a calibrated CPU profile was measured under, and launching executor
ranks under it. The policy itself (``PARSIM_HOST_MEMORY``: glibc's default or keeping freed
memory, and why it matters on a CPU) is the executor's: ``parsim.executor.host_alloc``.
"""
from __future__ import annotations

import os

from parsim.executor.host_alloc import ENV, host_memory_policy


def profile_policy(profile_data: dict) -> str | None:
    """The policy a calibrated CPU profile was measured under (``provenance.host_memory``;
    profiles older than it: "system"); None for other profiles (GPU, presets)."""
    from parsim.specs import profile_tables

    prov = profile_data.get("provenance") or {}
    if prov.get("device", "cpu") != "cpu" or profile_tables(profile_data).layer_probe is None:
        return None
    return prov.get("host_memory", "system")


def use_profile_policy(profile_data: dict) -> str | None:
    """Make the executor ranks this process launches run under the profile's policy: with
    ``PARSIM_HOST_MEMORY`` unset it is set to the profile's (the ranks inherit it); set to
    another policy, it is kept and a ``SpecWarning`` says their times will differ. Returns the
    policy the ranks will use (None: not a calibrated CPU profile, nothing changed)."""
    import warnings

    from parsim.specs import SpecWarning

    measured = profile_policy(profile_data)
    if measured is None:
        return None
    if ENV not in os.environ:
        os.environ[ENV] = measured
        return measured
    now = host_memory_policy()
    if now != measured:
        warnings.warn(f"the profile was calibrated with {ENV}={measured} and the executor runs with {ENV}={now}: "
                      "their compute times differ by the page faults of freed memory (parsim.executor.host_alloc); "
                      f"unset {ENV} or re-calibrate", SpecWarning, stacklevel=2)
    return now
