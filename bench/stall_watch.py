"""Whether a benchmark cell's processes still make progress: a hang is named in seconds, not at
the cell's timeout.

A pyperf worker marks its progress by appending one byte to a progress file after its set-up
and after every timed call (:class:`bench.pyperf_worker.TimedOp`). :class:`StallWatch` reads
that file's size and the CPU time of the processes of one session (the manager's, which holds
its workers) and calls the cell stalled when either

- **idle**: for :data:`IDLE_S` seconds no mark arrived and the session used less than
  :data:`IDLE_CPU_SHARE` of one core. A deadlocked worker (a lock or a thread team that a fork
  left behind) waits on a futex at no CPU; a worker that builds and fills a large buffer, or
  loads its kernels, uses a whole core. So a deadlock is seen in :data:`IDLE_S` seconds, even
  before the first value, when nothing is known of the cell's pace; or
- **silent**: once two marks have arrived, no mark came for :data:`GAP_FACTOR` times the
  longest gap between marks so far (at least :data:`GAP_FLOOR_S`). The gaps of the calibration
  worker (the start-up and its set-up, then calls of growing loops) set the pace, so a worker that spins without
  finishing a value is caught at a bound derived from the cell's own calibration.

Costs: one ``stat`` of the progress file per check and a scan of ``/proc`` (a read of each
process's ``stat``) per :data:`CPU_SAMPLE_S`, a few milliseconds. Where ``/proc`` is missing
(not Linux) only the silent rule applies.
"""

from __future__ import annotations

import os
import time

__all__ = ["IDLE_S", "IDLE_CPU_SHARE", "GAP_FACTOR", "GAP_FLOOR_S", "CPU_SAMPLE_S", "StallWatch", "session_cpu_s"]

#: Seconds without a mark and (nearly) without CPU after which a cell is called hung.
IDLE_S = 5.0
#: The share of one core below which a session counts as idle over :data:`IDLE_S`.
IDLE_CPU_SHARE = 0.02
#: A mark later than this many times the longest gap seen so far is a stall...
GAP_FACTOR = 20.0
#: ...and never sooner than this many seconds after the last mark.
GAP_FLOOR_S = 10.0
#: How often the session's CPU time is read.
CPU_SAMPLE_S = 1.0

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def session_cpu_s(sid: int) -> float | None:
    """CPU seconds (user and system, with those of reaped children) of the live processes of
    session ``sid``; None where ``/proc`` cannot be read."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # gone since the listing
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after the command name, which may hold spaces
        # fields[0] is field 3 (state): session is field 6, utime..cstime fields 14-17
        if int(fields[3]) == sid:
            total += sum(int(f) for f in fields[11:15])
    return total / _TICKS


class StallWatch:
    """Progress of one cell: its progress file and the CPU of the session ``sid`` (set once
    the manager is started: :meth:`watch`). :meth:`check` returns why the cell is stalled, or
    None. Not thread-safe: one caller polls it."""

    def __init__(self, progress_path, *, idle_s: float = IDLE_S, gap_factor: float = GAP_FACTOR,
                 gap_floor_s: float = GAP_FLOOR_S):
        self.path = str(progress_path)
        self.idle_s, self.gap_factor, self.gap_floor_s = idle_s, gap_factor, gap_floor_s
        self.sid = None
        self.marks = 0
        self.longest_gap = 0.0
        now = time.monotonic()
        self.last_mark = now
        self.cpu_samples: list[tuple[float, float]] = []  # (time, session CPU s), the last idle_s of them

    def watch(self, sid: int) -> None:
        """Start counting from now, for the processes of session ``sid``."""
        self.sid = sid
        self.last_mark = time.monotonic()
        self.cpu_samples = []

    def _read_marks(self, now: float) -> None:
        try:
            marks = os.stat(self.path).st_size
        except OSError:
            return
        if marks > self.marks:
            # the first gap is the start-up (the manager's preload, a worker's set-up): later
            # workers repeat a set-up, so it belongs in the pace
            self.longest_gap = max(self.longest_gap, now - self.last_mark)
            self.marks, self.last_mark = marks, now

    def _idle_cpu(self, now: float) -> float | None:
        """CPU seconds the session used over the last ``idle_s``, once that long was sampled
        (a sample per :data:`CPU_SAMPLE_S`, the oldest kept at least ``idle_s`` old)."""
        if self.sid is None:
            return None
        if not self.cpu_samples or now - self.cpu_samples[-1][0] >= CPU_SAMPLE_S:
            cpu = session_cpu_s(self.sid)
            if cpu is None:
                return None
            self.cpu_samples.append((now, cpu))
            while len(self.cpu_samples) > 1 and now - self.cpu_samples[1][0] >= self.idle_s:
                self.cpu_samples.pop(0)
        first_t, first_cpu = self.cpu_samples[0]
        if now - first_t < self.idle_s:
            return None
        return self.cpu_samples[-1][1] - first_cpu

    def check(self) -> str | None:
        """Why the cell is stalled (for the error row), or None while it makes progress."""
        now = time.monotonic()
        self._read_marks(now)
        quiet = now - self.last_mark
        where = f"after {self.marks} progress mark(s)" if self.marks else "before its first value (in set-up)"
        if self.marks >= 2:
            bound = max(self.gap_floor_s, self.gap_factor * self.longest_gap)
            if quiet > bound:
                return (f"no progress for {quiet:.1f} s {where}, over {self.gap_factor:g}x the longest gap "
                        f"between its marks so far ({self.longest_gap:.2f} s)")
        used = self._idle_cpu(now)  # sampled all along, so an idle spell is seen idle_s after its start
        if quiet >= self.idle_s and used is not None and used < IDLE_CPU_SHARE * self.idle_s:
            return (f"no progress for {quiet:.1f} s {where}, its processes idle ({used:.2f} s of CPU in "
                    f"the last {self.idle_s:g} s): a deadlock, such as a thread pool used before a fork")
        return None
