"""bench.pyperf_worker's process handling: who forks (the manager server, never the caller),
what a hang costs, and what forked managers and workers leave behind."""

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from replaybench.bench import manager_server, pyperf_worker, stall_watch
from replaybench.impl import registry

#: The `make bench` composite suite, cut to one capacity, one op and one value per cell, run by a
#: caller that has used torch's OpenMP team first (as the micro-threads GIL-share measure and a
#: Tianshou cell do): a worker forked from such a process deadlocked in its first torch op.
_COMPOSITE_AFTER_TORCH = textwrap.dedent("""
    import os, sys
    import torch
    torch.ones(1 << 22).sum()  # a parallel region: OpenMP's thread team now exists here
    assert len(os.listdir("/proc/self/task")) > 1 or torch.get_num_threads() == 1
    from replaybench.cli import main
    sys.exit(main(["run", "--suite", "default", "--capacities", "65536", "--ops", "sample", "--processes", "1",
                   "--values", "1", "--warmups", "0", "--min-time", "0.005", "--out", sys.argv[1],
                   "--no-progress"]))
""")


def test_make_bench_composite_runs_every_variant_after_torch_in_the_caller(tmp_path):
    """Every cell of the cut composite suite ends ok, skipped or unsupported, every registered
    variant (torch-kary included) is measured, and the whole finishes under a bound (a deadlocked
    worker would be stopped by the stall watch and show as a failed cell)."""
    from replaybench.bench import contract

    proc = subprocess.run([sys.executable, "-c", _COMPOSITE_AFTER_TORCH, str(tmp_path)], capture_output=True,
                          text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert [p.name.split("-", 1)[1] for p in runs] == ["micro", "micro-threads", "cache-model"]
    measured = set()
    for run in runs:
        assert contract.read_meta(run)["complete"] is True
        for row in contract.read_rows(run):
            assert row["status"] in ("ok", "skipped", "unsupported"), (run.name, row["variant"], row["error"])
            if row["status"] == "ok" and row["scenario"] == "micro":
                measured.add(row["variant"])
    assert set(registry.names()) <= measured, set(registry.names()) - measured
    assert "leaked" not in proc.stderr, proc.stderr[-3000:]


class _StopAtOnce(stall_watch.StallWatch):
    """A watch that SIGSTOPs the manager's whole session at its first check: its processes then
    sit idle, as a worker deadlocked in its set-up does."""

    def __init__(self, path):
        super().__init__(path, idle_s=1.5)
        self.stopped = False

    def check(self):
        if not self.stopped:
            try:
                os.killpg(self.sid, signal.SIGSTOP)
            except ProcessLookupError:  # the manager has not made its session yet: only it exists
                os.kill(self.sid, signal.SIGSTOP)
            self.stopped = True
        return super().check()


def _session_members(sid: int) -> list[int]:
    members = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat", "rb").read()
        except OSError:
            continue
        if int(stat[stat.rfind(b")") + 2:].split()[3]) == sid:
            members.append(int(pid))
    return members


def test_a_hung_worker_is_named_in_seconds_and_its_session_killed(tmp_path):
    """A cell whose processes stop making progress raises ManagerHang naming the target and
    the hang well before the cell's timeout, and leaves no process of its session behind; the
    next cell runs on a fresh server."""
    argv = ["--quiet", "-o", str(tmp_path / "out.json"), "--target", "harness", "--op", "empty", "--batch", "1",
            "--mixed-adds", "1", "--seed", "0", "--processes", "2", "--values", "100000", "--warmups", "0",
            "--loops", "1"]
    sessions = []

    def factory(path):
        watch = _StopAtOnce(path)
        real_watch = watch.watch
        watch.watch = lambda sid: (sessions.append(sid), real_watch(sid))
        return watch

    start = time.monotonic()
    with pytest.raises(manager_server.ManagerHang) as err:
        manager_server.run_manager(argv, 300, str(tmp_path / "manager.err"), watch_factory=factory)
    assert time.monotonic() - start < 60
    message = str(err.value)
    # stopped in set-up or after some values, as the machine's pace puts the first check
    assert message.startswith("harness/0/empty: no progress") and "idle" in message, message
    deadline = time.monotonic() + 10
    while _session_members(sessions[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _session_members(sessions[0]) == []
    argv_ok = [a if a != "100000" else "2" for a in argv]
    assert manager_server.run_manager(argv_ok, 120, str(tmp_path / "manager2.err")) == 0


def test_the_silent_rule_follows_the_pace_of_the_marks(tmp_path):
    """Once marks have come at a pace, a silence of gap_factor times the longest gap (above the
    floor) is a stall, whatever the CPU does; a silence below it is not."""
    progress = tmp_path / "progress"
    progress.write_bytes(b"")
    watch = stall_watch.StallWatch(progress, idle_s=1000, gap_factor=4, gap_floor_s=0.3)
    for _ in range(3):
        time.sleep(0.1)
        with open(progress, "ab") as fh:
            fh.write(b".")
        assert watch.check() is None
    time.sleep(0.2)
    assert watch.check() is None  # 0.2 s: under the floor
    time.sleep(0.5)
    reason = watch.check()
    assert reason is not None and "longest gap" in reason, reason


def test_a_busy_session_is_not_idle(tmp_path):
    """The idle rule needs the session's processes to sit still: a process that computes
    without marking is not called hung by it."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        watch = stall_watch.StallWatch(tmp_path / "none", idle_s=1.0, gap_floor_s=1000)
        watch.watch(busy.pid)
        end = time.monotonic() + 3
        while time.monotonic() < end:
            assert watch.check() is None
            time.sleep(0.1)
        os.kill(busy.pid, signal.SIGSTOP)
        end = time.monotonic() + 10
        reason = None
        while reason is None and time.monotonic() < end:
            time.sleep(0.1)
            reason = watch.check()
        assert reason is not None and "idle" in reason and "set-up" in reason, reason
    finally:
        busy.kill()
        busy.wait()


def test_the_server_refuses_a_preload_that_starts_a_thread(monkeypatch):
    """A target whose preload leaves a thread running in the forking process is refused with
    its name and the rule, and the server stops (the next cell gets a fresh one)."""
    release = threading.Event()
    monkeypatch.setattr(pyperf_worker, "preload",
                        lambda options: threading.Thread(target=release.wait, daemon=True).start())
    request = {"argv": ["--target", "binary", "--op", "sample", "--capacity", "64", "--batch", "1",
                        "--mixed-adds", "1", "--seed", "0"], "stderr_path": os.devnull}
    out = io.BytesIO()
    try:
        manager_server.serve(io.BytesIO((json.dumps(request) + "\n").encode()), out)
    finally:
        release.set()
    reply = json.loads(out.getvalue())
    assert "binary" in reply["error"] and "FORK_AFTER_USE" in reply["error"], reply
