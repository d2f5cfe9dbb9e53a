"""What this machine lets a process use, read once per call from the OS (never assumed).

One definition for every module that sizes work by the cores: the benchmarks' worker counts,
the engines' process counts, the metadata written beside each run.
"""

from __future__ import annotations

import os
import platform
import re

__all__ = ["usable_cores", "logical_cores", "cpu_model"]


def usable_cores() -> int:
    """CPU cores this process may run on: its affinity mask, which containers, cgroups'
    cpusets and ``taskset`` narrow (``os.cpu_count()`` where the platform has no affinity).
    Cost: one system call."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def logical_cores() -> int:
    """Logical CPUs the machine has, whether or not this process may use them."""
    return os.cpu_count() or 1


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux), else ``platform.processor()``; None
    when neither says. Cost: one read of /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            match = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
        if match:
            return match.group(1).strip()
    except OSError:
        pass
    return platform.processor() or None
