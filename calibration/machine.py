"""Facts about this machine that a profile's name and provenance record."""
from __future__ import annotations

import hashlib
import os
import platform
import re
import socket
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hostname() -> str:
    return socket.gethostname()


def host_id() -> str:
    """A short id of this machine as it runs now: a hash of the OS install's machine id, this
    boot's id, the CPU model, the core count and the hostname (machine-id(5), proc(5)
    ``sys/kernel/random/boot_id``). Cloned VMs share a hostname ("vm") and a CPU model string
    ("AMD EPYC") and may share the machine id; the boot id tells them apart, so a profile
    measured on one VM is never taken for another's. A reboot, which may move a VM to another
    physical host, gives a new id too."""
    parts = [_read("/etc/machine-id"), _read("/proc/sys/kernel/random/boot_id"), cpu_model(),
             str(os.cpu_count() or 1), hostname()]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def default_profile_name(device_type: str) -> str:
    host = re.sub(r"[^a-z0-9-]+", "-", hostname().lower()).strip("-") or "host"
    return f"{device_type}-{host}"


def total_memory_bytes() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024          # /proc/meminfo reports kB (KiB)
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def cpu_seconds() -> tuple[float, float, float] | None:
    """(busy s of all cores, steal s, CPU s of this process and its joined children) so far.
    /proc/stat "cpu" line: user nice system idle iowait irq softirq steal, in USER_HZ ticks (proc(5)).
    Ranks started from the fork server are not our children: they report their own CPU
    (``process_cpu_seconds``) and ``other_work`` takes it as ``ranks_s``."""
    try:
        with open("/proc/stat") as stat:
            fields = [float(v) for v in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    t = os.times()
    return (user + nice + system + irq + softirq) / hz, steal / hz, t.user + t.system + t.children_user + t.children_system


def process_cpu_seconds() -> float:
    """CPU seconds (user + system) this process has used itself (a forked process starts at 0)."""
    t = os.times()
    return t.user + t.system


def other_work(before: tuple | None, after: tuple | None, wall_s: float,
               ranks_s: float = 0.0) -> dict[str, float] | None:
    """Cores kept busy by other processes during the run, and the fraction of time the
    hypervisor stole: both make a profile slower than the machine is. ``ranks_s``: CPU seconds
    of the calibration's own ranks that are not its children (started from the fork server)."""
    if before is None or after is None or wall_s <= 0:
        return None
    busy, steal, ours = (a - b for a, b in zip(after, before))
    ours += ranks_s
    return {"other_cores_busy": round(max(busy - ours, 0.0) / wall_s, 2),
            "steal_fraction": round(steal / (wall_s * (os.cpu_count() or 1)), 3)}


class BusyMachineWarning(UserWarning):
    """Other processes used the CPU while a calibration timed it."""


BUSY_CORES = 0.5    # other processes' average busy cores above which a calibration warns


def warn_if_busy(work: dict[str, float] | None) -> None:
    """Warn when ``other_work`` says other processes kept >= ``BUSY_CORES`` cores busy: the
    profile's times are then slower than the machine (seen: a layer-composition fit that put
    everything into a per-op term while another test run shared the 2 cores)."""
    if work and work["other_cores_busy"] >= BUSY_CORES:
        import warnings
        warnings.warn(f"other processes kept {work['other_cores_busy']:.2f} of {os.cpu_count()} cores busy while "
                      "this calibration timed the machine: its numbers are slower and noisier than the machine "
                      "is; re-run it when the machine is idle", BusyMachineWarning, stacklevel=2)


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None
