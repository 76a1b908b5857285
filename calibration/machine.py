"""Facts about this machine that a profile's name and provenance record."""
from __future__ import annotations

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


