"""Goodput under failures: the checkpoint interval, effective training time, time-to-train.

Pure functions, SI units (seconds, bytes, bytes/s, watts, joules).

Failures arrive independently and memorylessly (exponential inter-arrival times, the
assumption of Young and Daly): every device fails with mean time between failures
``device_mtbf_s`` and every node (host, NIC, power supply ...) with ``node_mtbf_s``; the job
stops when any of them fails, so its failure rate is the sum of theirs,

    1 / M = N_devices / MTBF_device + N_nodes / MTBF_node                          [1/s]

Every ``tau`` seconds of training the job writes a checkpoint for ``delta`` seconds (blocking);
after a failure it restarts (``restart_s``: re-schedule, re-initialise, read the checkpoint
back) and redoes the work since the last checkpoint. Daly's exact expectation of the wall time
``T_w`` to complete ``T_s`` seconds of work under that model (J. T. Daly, "A higher order
estimate of the optimum checkpoint interval for restart dumps", Future Generation Computer
Systems 22(3):303-312, 2006, eq. 13):

    T_w(tau) = M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau

so the fraction of wall time that is training (goodput, "effective training time") is
``tau / (M e^(R/M) (e^((tau + delta)/M) - 1))``. Its maximum over ``tau`` is found numerically
here and compared with Young's first-order optimum ``sqrt(2 delta M)`` (J. W. Young, "A first
order approximation to the optimum checkpoint interval", CACM 17(9):530-531, 1974) and
Daly's higher-order one (2006, eq. 37):

    tau_opt = sqrt(2 delta M) [1 + (1/3) sqrt(delta / 2M) + (1/9) (delta / 2M)] - delta   (delta < 2M)
    tau_opt = M                                                                          (delta >= 2M)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def system_mtbf(num_devices: int, num_nodes: int, device_mtbf_s: float, node_mtbf_s: float) -> float:
    """Mean time between job interruptions M (seconds): the failure rates of all devices and
    nodes add (independent exponential failures). ``inf`` MTBFs mean "never fails"."""
    rate = num_devices / device_mtbf_s + num_nodes / node_mtbf_s
    return math.inf if rate == 0 else 1.0 / rate


def goodput(tau_s: float, delta_s: float, restart_s: float, mtbf_s: float) -> float:
    """Fraction of wall time spent on training that is kept (Daly 2006 eq. 13; module docstring)."""
    if math.isinf(mtbf_s):
        return tau_s / (tau_s + delta_s)
    m = mtbf_s
    x = (tau_s + delta_s) / m
    if not (math.isfinite(x) and math.isfinite(restart_s)):
        return 0.0                 # a checkpoint or a restart that never ends: no work is kept
    # in logs, so that a restart or an interval of many MTBFs gives ~0 instead of overflowing;
    # expm1 keeps the small-argument case exact: e^x - 1 for x = (tau + delta) / M << 1
    log_expm1 = math.log(math.expm1(x)) if x < 1.0 else x + math.log1p(-math.exp(-x))
    return math.exp(math.log(tau_s) - math.log(m) - restart_s / m - log_expm1)


def young_interval(delta_s: float, mtbf_s: float) -> float:
    """Young 1974: the first-order optimum checkpoint interval sqrt(2 delta M), seconds."""
    return math.sqrt(2.0 * delta_s * mtbf_s)


def daly_interval(delta_s: float, mtbf_s: float) -> float:
    """Daly 2006 eq. 37: the higher-order optimum checkpoint interval, seconds."""
    if delta_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = delta_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * delta_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta_s


def best_interval(delta_s: float, restart_s: float, mtbf_s: float, rel_tol: float = 1e-9) -> float:
    """The checkpoint interval (seconds of work) that maximises ``goodput``: golden-section
    search over log(tau) (goodput is unimodal in tau: it rises while checkpoints dominate and
    falls once lost work does)."""
    if math.isinf(mtbf_s):
        return math.inf
    lo, hi = math.log(max(delta_s, 1e-9) * 1e-4), math.log(mtbf_s * 100.0)
    f = lambda x: -goodput(math.exp(x), delta_s, restart_s, mtbf_s)   # noqa: E731
    a, b = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
    fa, fb = f(a), f(b)
    while hi - lo > rel_tol:
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - GOLDEN * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + GOLDEN * (hi - lo)
            fb = f(b)
    return math.exp((lo + hi) / 2.0)


def checkpoint_bytes(num_params: float, param_bytes: float, optimizer_bytes: float) -> float:
    """Bytes of one checkpoint: every unique parameter in the training dtype and its optimizer
    state (for mixed-precision Adam: fp32 master copy, first and second moments, 12 bytes;
    Rajbhandari et al. 2020, Sec. 3.1). Gradients are not saved."""
    return num_params * (param_bytes + optimizer_bytes)


@dataclass(frozen=True)
class Reliability:
    """Failure and checkpoint inputs (seconds, bytes/s). Bandwidths are the aggregate the
    whole job writes to / reads from its checkpoint store."""
    device_mtbf_s: float
    node_mtbf_s: float
    write_bandwidth: float
    read_bandwidth: float
    restart_s: float


@dataclass(frozen=True)
class RunEstimate:
    """A training run of ``tokens`` tokens under failures (seconds, bytes, joules, dollars)."""
    tokens: float
    step_time_s: float
    steps: float
    mtbf_s: float                  # between job interruptions
    checkpoint_bytes: float
    checkpoint_write_s: float
    restart_s: float               # restart cost + reading the checkpoint back
    interval_s: float              # best checkpoint interval, seconds of training
    interval_steps: int            # ... rounded to whole steps (at least one)
    young_s: float
    daly_s: float
    goodput: float                 # at interval_steps
    compute_s: float               # failure-free training time
    wall_s: float                  # expected, with checkpoints, failures and restarts
    expected_failures: float
    gpu_hours: float
    cost_usd: float
    energy_j: float                # devices at ``power_w`` for the whole wall time (TDP: an upper bound)

    def to_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


def estimate_run(tokens: float, tokens_per_step: float, step_time_s: float, num_devices: int, num_nodes: int,
                 ckpt_bytes: float, reliability: Reliability, usd_per_gpu_hour: float,
                 power_w: float) -> RunEstimate:
    """Time-to-train, GPU-hours, dollars and energy of ``tokens`` tokens with the best whole-step
    checkpoint interval. GPU-hours, dollars and energy count the expected wall time, lost work
    and restarts included; energy = devices x ``power_w`` x wall time (device power only)."""
    r = reliability
    m = system_mtbf(num_devices, num_nodes, r.device_mtbf_s, r.node_mtbf_s)
    delta = ckpt_bytes / r.write_bandwidth
    restart = r.restart_s + ckpt_bytes / r.read_bandwidth
    best = best_interval(delta, restart, m) if math.isfinite(delta) and math.isfinite(restart) else 0.0
    if math.isinf(m):
        steps_between, fraction = 0, 1.0
    elif best > 0:
        # the best whole number of steps is one of the two around the continuous optimum
        around = {max(1, math.floor(best / step_time_s)), max(1, math.ceil(best / step_time_s))}
        steps_between = max(sorted(around), key=lambda k: goodput(k * step_time_s, delta, restart, m))
        fraction = goodput(steps_between * step_time_s, delta, restart, m)
    else:
        steps_between, fraction = 0, 0.0
    steps = tokens / tokens_per_step
    compute = steps * step_time_s
    wall = compute / fraction if fraction > 0 else math.inf      # the caller names the inputs (api.run)
    gpu_hours = wall * num_devices / 3600.0
    return RunEstimate(tokens=tokens, step_time_s=step_time_s, steps=steps, mtbf_s=m, checkpoint_bytes=ckpt_bytes,
                       checkpoint_write_s=delta, restart_s=restart, interval_s=best, interval_steps=steps_between,
                       young_s=young_interval(delta, m), daly_s=daly_interval(delta, m), goodput=fraction,
                       compute_s=compute, wall_s=wall, expected_failures=wall / m, gpu_hours=gpu_hours,
                       cost_usd=gpu_hours * usd_per_gpu_hour, energy_j=num_devices * power_w * wall)
