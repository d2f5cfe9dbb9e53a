"""Unlink shared-memory segments when the process that owns them is gone, however it ends.

A :class:`~impl.concurrent.shm.SharedArena` owner unlinks its segment on close and at exit;
when it is SIGKILLed, multiprocessing's resource tracker (a child process of the owner) does.
Some hosts kill a worker's children with it: Ray's raylet kills a worker's process group and
its child processes when the worker exits (``RAY_process_group_cleanup_enabled``,
``RAY_kill_child_processes_on_worker_exit``), which is how a Ray worker dies when its driver
is SIGKILLed or its raylet dies. The tracker then dies with the owner, and the segments stay
in /dev/shm until reboot. :class:`SegmentReaper` is a tracker out of that reach:

    owner ──stdin pipe (one segment name a line)──> reaper: a grandchild of the owner in a
                                                    session of its own (setsid + fork), so
                                                    neither a process-group kill nor a
                                                    kill of the owner's children reaches it

The reaper reads names until EOF on the pipe, which comes when every holder of the write end
is gone: the owner's exit (any signal included) or :meth:`SegmentReaper.close`. It then
unlinks each named segment that still exists and exits. The owner's normal path unlinks first
(``SharedArena.close``), so the reaper then finds nothing; it never unlinks earlier, so
processes still attaching by name are not affected while the owner lives.

Limits: a segment is covered from :meth:`SegmentReaper.watch` on (call it right after the
create; the window is the few microseconds between), the reaper only unlinks names that
start with :data:`~impl.concurrent.shm.PREFIX`, and a host that kills every process of a
session or a cgroup (a container's stop, systemd's KillMode=control-group) kills the reaper
too: then the segments go with the container's /dev/shm. A process the owner forks without
exec inherits the write end, so the reaper waits for it as well (as the resource tracker does).

This file runs as the reaper with ``python -I -S`` (standard library only, no package
imports, so it starts in about 0.1 s); imported, it is the owner's side.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

__all__ = ["SegmentReaper", "unlink_segments"]

_SHM_DIR = "/dev/shm"


def unlink_segments(names, prefix: str | None = None) -> list[str]:
    """Unlink those of ``names`` that exist in /dev/shm and start with ``prefix`` (default:
    :data:`~impl.concurrent.shm.PREFIX`); returns the names it removed. Only names listed in
    /dev/shm are touched, so a name with a path in it ("../x") can unlink nothing else.
    Cost: one directory listing plus one unlink per name."""
    if prefix is None:
        from .shm import PREFIX as prefix
    try:
        present = set(os.listdir(_SHM_DIR))
    except FileNotFoundError:
        return []
    removed = []
    for name in sorted(set(names) & present):
        if not name.startswith(prefix):
            continue
        try:
            os.unlink(os.path.join(_SHM_DIR, name))
            removed.append(name)
        except FileNotFoundError:  # the owner's own close got there first
            pass
    return removed


class SegmentReaper:
    """The owner's handle on its reaper process (module docstring: the scheme).

    ``SegmentReaper()`` starts the reaper and returns once it runs (one interpreter start:
    70-120 ms measured on a busy 2-core machine); ``watch(name)`` hands it a segment (one
    pipe write); ``close()`` lets it go (it unlinks what is left of the watched segments and
    exits). Keep the object while the segments are in use: collecting it closes the pipe,
    which lets the reaper go as ``close()`` does. Not thread-safe: one thread calls it.
    Raises RuntimeError from the constructor or :meth:`watch` when the reaper is not running,
    so an owner never creates segments nobody would clean up after a kill.
    """

    def __init__(self):
        from .shm import PREFIX

        # start_new_session: out of the owner's process group; the reaper's own fork (_reap)
        # takes it out of the owner's children. stdout carries the reaper's pid once, then closes.
        # The owner's pid in argv only names whose reaper it is (ps, tests).
        proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), PREFIX, str(os.getpid())],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        try:
            line = proc.stdout.readline()
            proc.wait(30)  # the intermediate process exits right after its fork
            self.pid = int(line)
        except (ValueError, subprocess.TimeoutExpired) as err:
            proc.kill()
            proc.stdin.close()
            raise RuntimeError(f"the segment reaper did not start: {err!r}") from None
        finally:
            proc.stdout.close()
        self._pipe = proc.stdin
        self.watched: list[str] = []

    def watch(self, name: str) -> None:
        """From now on, segment ``name`` is unlinked when this process is gone (or at
        :meth:`close`) if it still exists then."""
        if self._pipe is None:
            raise RuntimeError(f"segment reaper {self.pid} is closed; cannot watch {name!r}")
        if not isinstance(name, str) or not name or "\n" in name:
            raise ValueError(f"segment name must be a non-empty one-line string, got {name!r}")
        try:
            self._pipe.write(name.encode() + b"\n")
            self._pipe.flush()
        except BrokenPipeError:
            raise RuntimeError(f"segment reaper {self.pid} is gone; {name!r} would not be cleaned up") from None
        self.watched.append(name)

    def close(self) -> None:
        """Let the reaper go: it unlinks the watched segments still there and exits. Idempotent."""
        if self._pipe is not None:
            pipe, self._pipe = self._pipe, None
            try:
                pipe.close()
            except BrokenPipeError:
                pass

    @property
    def closed(self) -> bool:
        return self._pipe is None


def _reap(prefix: str) -> None:
    """The reaper process: leave the owner's children, say the pid, collect names until EOF,
    unlink them."""
    if os.fork() > 0:
        os._exit(0)  # the intermediate: the owner reaps it; the grandchild is reparented
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout.write(f"{os.getpid()}\n")
    sys.stdout.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the pipe's last writer goes: the owner's readline() returns
    names = set()
    for line in sys.stdin.buffer:
        names.add(line.decode(errors="replace").strip())
    unlink_segments(names, prefix)


if __name__ == "__main__":
    _reap(sys.argv[1])
