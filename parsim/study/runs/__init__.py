"""Profiles from run logs (``parsim calibrate --runs``, ``make profiles``): a log of past
training runs (the columns of ``../shared/validation/public_runs_train.csv``) fitted into the
numbers of the GPU profiles, with the evidence.

``observations``: log rows -> the run's model, cluster, stack, candidate plans and measured
value, or the reason a row is skipped (``sources``: what the public sources do not say in their
columns); ``predict``: every observation through the fast path (``parsim.fast``);
``parameters``: which numbers a log fits and where each starts; ``fit``: robust
Levenberg-Marquardt on log errors and the allocator's reserve and fragmentation;
``calibrate``: the whole fit, per-group and leave-one-group-out errors; ``profiles``: the fit
written into the shipped profiles' templates (``calibration/profiles/templates``);
``report``: the text, JSON and YAML ``parsim calibrate --runs`` prints and writes.

A study, not an engine: the fit prices every run with the fast path, so it sits above the
engines (``parsim.calibration`` measures one machine and may not import them).
"""
from .calibrate import GroupError, RunsCalibration, calibrate_runs
from .observations import Observation, Skipped, read_runs

__all__ = ["GroupError", "Observation", "RunsCalibration", "Skipped", "calibrate_runs", "read_runs"]
