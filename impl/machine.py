"""What this machine lets a process use, read once per call from the OS (never assumed).

One definition for every module that sizes work by the cores: the benchmarks' worker counts,
the engines' process counts, the metadata written beside each run; and of the memory a
structure may take (:func:`check_memory`, called before a tree or a storage allocates).
"""

from __future__ import annotations

import os
import platform
import re

__all__ = ["usable_cores", "logical_cores", "cpu_quota", "cpu_model", "available_memory_bytes", "check_memory"]

_MEMINFO = "/proc/meminfo"
_CGROUP = "/sys/fs/cgroup"  # cgroup v2: memory.max and memory.current of this process's group


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


def cpu_quota(root: str = _CGROUP) -> float | None:
    """CPUs' worth of time the cgroup lets this process's group use (quota over period), or None
    without a quota: a limit that the affinity mask (:func:`usable_cores`) does not show, so a
    container may list 16 CPUs and run 4 at a time. Read from cgroup v2's ``cpu.max`` (``max``:
    none) or v1's ``cpu/cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` (-1: none), at ``root``.
    Cost: two small file reads."""
    try:
        quota, period = open(os.path.join(root, "cpu.max")).read().split()[:2]
    except (OSError, ValueError):
        try:
            quota = open(os.path.join(root, "cpu", "cpu.cfs_quota_us")).read().strip()
            period = open(os.path.join(root, "cpu", "cpu.cfs_period_us")).read().strip()
        except OSError:
            return None
    try:
        q, p = int(quota), int(period)
    except ValueError:  # "max"
        return None
    return q / p if q > 0 and p > 0 else None


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


def _cgroup_room() -> int | None:
    """Bytes the cgroup (v2) still lets this process's group take, or None without a limit."""
    try:
        limit = open(os.path.join(_CGROUP, "memory.max")).read().strip()
        used = int(open(os.path.join(_CGROUP, "memory.current")).read())
    except (OSError, ValueError):
        return None
    return max(0, int(limit) - used) if limit.isdigit() else None


def available_memory_bytes() -> int | None:
    """Bytes of memory a new allocation may take without swapping or the kernel's OOM killer:
    ``MemAvailable`` (Linux's estimate, page cache that can be dropped included), narrowed by
    the cgroup's remaining room where it has a limit (containers). None where neither can be
    read (other platforms): callers then do not check. Cost: two small file reads."""
    room = None
    try:
        with open(_MEMINFO) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    room = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    group = _cgroup_room()
    if group is not None:
        room = group if room is None else min(room, group)
    return room


def check_memory(nbytes: int, what: str) -> None:
    """MemoryError naming ``what`` (e.g. "a tree of capacity=2147483648"), its ``nbytes`` and the
    bytes available, when ``nbytes`` exceed :func:`available_memory_bytes`: refused before the
    allocation, instead of a process that grows until the kernel kills it (arrays are filled
    when made, so every page is touched). Nothing is checked where the available memory is
    unknown."""
    room = available_memory_bytes()
    if room is not None and nbytes > room:
        raise MemoryError(f"{what} needs {nbytes} bytes ({nbytes / 2**30:.2f} GiB), but only {room} bytes "
                          f"({room / 2**30:.2f} GiB) of memory are available: use a smaller capacity")
