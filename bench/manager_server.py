"""The clean process that forks the micro scenario's pyperf managers: a fork server.

Why: a forked child gets one thread, the caller's, and a copy of every library's state. A
thread pool used before the fork (GNU OpenMP's team under torch, pyarrow's pool, numba's
threading layer) still believes its threads exist, and the child's first parallel region waits
for them forever. The process that runs a suite cannot promise to keep every pool unused: it
measures GIL shares on full-size buffers (torch ops), compacts rows with pyarrow, and runs
other suites before. So it never forks a manager itself. It starts this server once, as a new
interpreter (``python -m replaybench.bench.manager_server``, in a session of its own), and asks
it for each cell's manager. The server runs nothing but :func:`bench.pyperf_worker.preload`
(imports, and kernels warmed on a small buffer for targets that allow a fork after use), then
forks the manager, which forks the workers.

The rule it checks: **a process that forks has started no thread pool since it started**. The
server counts its threads after its imports (numpy's OpenBLAS starts its own at import, and
OpenBLAS re-creates them after a fork) and again after each preload; a target whose preload
started threads fails its cell with that said, and the server exits, so that the next cell gets
a fresh one. (A variant whose ops start a pool sets ``FORK_AFTER_USE = False`` in its module, as
impl/variants/torch_kary.py does: its preload then only imports.)

:func:`run_manager` is the caller's call: one cell's manager, watched for progress
(:mod:`bench.stall_watch`) and killed with its workers when it makes none.

Protocol, one JSON object a line: the caller writes ``{"argv": [...], "stderr_path": ...}`` on
the server's stdin; the server answers ``{"pid": N}`` once the manager runs (or ``{"error":
...}``), then ``{"exitcode": N}`` when it has ended. The server exits when its stdin closes,
killing the manager in progress (so a caller that dies leaves nothing behind).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

from replaybench.bench import pyperf_worker
from replaybench.bench.stall_watch import StallWatch

__all__ = ["ManagerServer", "ServerError", "ManagerHang", "run_manager", "shared", "serve", "kill_session"]


class ServerError(RuntimeError):
    """The server failed or refused a manager; the message says why."""


class ManagerHang(RuntimeError):
    """A cell's manager was stopped for making no progress or passing its time limit; the
    message names the target and what was seen."""


class ManagerServer:
    """The caller's end: a server process, started on first use. Not thread-safe: one caller
    runs one cell at a time."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-m", "replaybench.bench.manager_server"],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        return self._proc

    def _receive(self, timeout_s: float | None) -> dict | None:
        """The server's next message, or None when ``timeout_s`` passed first."""
        proc = self._proc
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = proc.stdout.readline()
        if not line:
            self.close()
            raise ServerError("the manager server exited unexpectedly (its stderr, above, says why)")
        return json.loads(line)

    def start_manager(self, argv: list[str], stderr_path: str) -> int:
        """Have the server preload the target and fork a manager on ``argv`` (its stderr into
        ``stderr_path``); the manager's pid, which is also its session id. Raises
        :class:`ServerError` when the server refuses (a preload that started threads) or fails."""
        proc = self._start()
        try:
            proc.stdin.write((json.dumps({"argv": argv, "stderr_path": stderr_path}) + "\n").encode())
            proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            raise ServerError("the manager server exited unexpectedly") from None
        reply = self._receive(None)
        if "error" in reply:
            self.close()  # it exits after a refusal: the next cell gets a fresh one
            raise ServerError(reply["error"])
        return reply["pid"]

    def wait(self, timeout_s: float) -> int | None:
        """The started manager's exit code, or None when ``timeout_s`` passed first."""
        reply = self._receive(timeout_s)
        return None if reply is None else reply["exitcode"]

    def close(self) -> None:
        """Stop the server (it kills a manager still running) and reap it; a later call starts a
        new one."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


_SHARED: ManagerServer | None = None


def shared() -> ManagerServer:
    """This process's server (one: cells run one at a time), stopped when the process exits."""
    global _SHARED
    if _SHARED is None:
        import atexit

        _SHARED = ManagerServer()
        atexit.register(_SHARED.close)
    return _SHARED


def run_manager(argv: list[str], timeout_s: float, stderr_path: str, *, watch_factory=None) -> int:
    """Run :func:`bench.pyperf_worker.main` on ``argv`` (a manager's options) in a manager forked
    by this process's server (:func:`shared`: a clean process, never this one, which may have
    used a thread pool), in a session of its own; return its exit code. Its stdout is dropped
    and its stderr written to ``stderr_path``.

    The manager's session is killed, and :class:`ManagerHang` raised naming the target, when
    its workers make no progress (:class:`bench.stall_watch.StallWatch` on the progress file
    ``stderr_path + ".progress"``, which the workers mark: a deadlock is seen in seconds) or
    when ``timeout_s`` has passed. Any exception here (Ctrl-C) kills the session and the server
    first (a fresh server serves the next call). ``watch_factory(progress_path)`` replaces the
    StallWatch (tests).
    """
    progress = stderr_path + ".progress"
    open(progress, "wb").close()
    argv = [*argv, "--progress-file", progress]
    options = pyperf_worker.manager_options(argv)
    name = f"{options.target}/{options.capacity}/{options.op}"
    server = shared()
    watch = (watch_factory or StallWatch)(progress)
    try:
        pid = server.start_manager(argv, stderr_path)
        watch.watch(pid)
        deadline = time.monotonic() + timeout_s
        while True:
            stalled = watch.check()
            if stalled is None and time.monotonic() > deadline:
                stalled = f"timed out after {timeout_s:g} s"
            if stalled is not None:
                kill_session(pid)
                if server.wait(30) is None:  # the server reports the killed manager's end, or is replaced
                    server.close()
                raise ManagerHang(f"{name}: {stalled}; killed")
            code = server.wait(0.2)
            if code is not None:
                return code
    except ManagerHang:
        raise
    except BaseException:
        server.close()  # kills the manager in progress: nothing is left of the cell
        raise
    finally:
        try:
            os.unlink(progress)
        except FileNotFoundError:
            pass


def _threads() -> int:
    """Threads of this process (Linux), or 0 where that cannot be read (no check then)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def kill_session(pid: int) -> None:
    """SIGKILL the session ``pid`` (a manager and its workers), or only the process ``pid`` before
    it has made its session."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # not yet a session leader: only it exists
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def serve(inp, out) -> None:
    """The server's loop on binary streams ``inp`` and ``out`` (the protocol above)."""
    def send(message: dict) -> None:
        out.write((json.dumps(message) + "\n").encode())
        out.flush()

    baseline = _threads()
    while True:
        line = inp.readline()
        if not line:
            return
        request = json.loads(line)
        argv, stderr_path = request["argv"], request["stderr_path"]
        options = pyperf_worker.manager_options(argv)
        pyperf_worker.preload(options)
        grew = _threads() - baseline if baseline else 0
        if grew > 0 or threading.active_count() > 1:
            send({"error": f"preloading {options.target} started {grew} thread(s) in the process that forks the "
                           f"pyperf managers (a thread pool: OpenMP, Arrow, numba); a fork now could deadlock its "
                           f"workers, so its module must say FORK_AFTER_USE = False (bench/manager_server.py)"})
            return
        child = pyperf_worker.fork_manager(argv, stderr_path)
        send({"pid": child.pid})
        # the manager's end, or this server's stdin closing (the caller is gone: take it along)
        while child.exitcode is None:
            ready, _, _ = select.select([inp, child.sentinel], [], [])
            if inp in ready:
                kill_session(child.pid)
                child.join()
                return
            child.join(0)
        send({"exitcode": child.exitcode})


def main() -> None:
    # stdout is the protocol's: whatever else prints goes to stderr
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller stops it by closing stdin, or kills it
    serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
