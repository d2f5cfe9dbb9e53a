"""The segment reaper (impl/concurrent/reaper.py): an owner's segments are unlinked when the
owner is gone, even when its whole process group, resource tracker included, is SIGKILLed
at once (as Ray's raylet kills a worker); close() lets the reaper go; only our segments are
ever unlinked. The Ray backend's use of it is tested in test_ray_backend.py (slow)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from replaybench.impl.concurrent.reaper import SegmentReaper, unlink_segments
from replaybench.impl.concurrent.shm import PREFIX

_OWNER = """
import os, signal, sys
from replaybench.impl.concurrent.reaper import SegmentReaper
from replaybench.impl.concurrent.shm import SharedArena

reaper = SegmentReaper()
watched = SharedArena.create({"x": ((1024,), "float32")}, tag="reapertest")
reaper.watch(watched.spec.name)
unwatched = SharedArena.create({"x": ((1024,), "float32")}, tag="reapertest")  # the resource tracker's only
print(watched.spec.name, unwatched.spec.name, reaper.pid, flush=True)
sys.stdin.readline()
os.killpg(0, signal.SIGKILL)  # the owner and its process group, its resource tracker included
"""


def _alive(pid: int) -> bool:
    """Running (a zombie, exited but not yet reaped by its new parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait(condition, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def _raw_segment(tag: str = "reapertest") -> str:
    """A file in /dev/shm named like ours, registered with no resource tracker."""
    name = f"{PREFIX}{tag}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    os.close(os.open("/dev/shm/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    return name


def test_segments_are_unlinked_when_the_owners_process_group_is_killed():
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    watched = unwatched = None
    try:
        watched, unwatched, reaper = owner.stdout.readline().split()
        reaper = int(reaper)
        assert os.path.exists("/dev/shm/" + watched) and _alive(reaper)
        assert os.getpgid(reaper) != owner.pid  # out of the group that is killed
        owner.stdin.write("go\n")
        owner.stdin.flush()
        assert owner.wait(30) == -9
        assert _wait(lambda: not os.path.exists("/dev/shm/" + watched), 10.0), "the watched segment was left"
        assert _wait(lambda: not _alive(reaper), 10.0), "the reaper did not exit"
        # what the reaper is for: the killed resource tracker left the other one
        assert os.path.exists("/dev/shm/" + unwatched)
    finally:
        if owner.poll() is None:
            owner.kill()
        unlink_segments([n for n in (watched, unwatched) if n])


def test_close_lets_the_reaper_go_and_it_unlinks_what_is_left():
    kept, gone = _raw_segment(), f"{PREFIX}reapertest_{os.getpid()}_never"
    reaper = SegmentReaper()
    try:
        reaper.watch(kept)
        reaper.watch(gone)  # a name that does not exist (already unlinked by its owner): nothing to do
        assert _alive(reaper.pid) and os.path.exists("/dev/shm/" + kept)
        reaper.close()
        reaper.close()  # idempotent
        assert _wait(lambda: not _alive(reaper.pid), 10.0)
        assert not os.path.exists("/dev/shm/" + kept)
        with pytest.raises(RuntimeError, match="closed"):
            reaper.watch(kept)
    finally:
        reaper.close()
        unlink_segments([kept])


def test_only_our_existing_segments_are_unlinked():
    ours = _raw_segment()
    other = f"notreplaybench_{uuid.uuid4().hex}"
    os.close(os.open("/dev/shm/" + other, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    try:
        assert unlink_segments([other, "../" + ours, f"{PREFIX}absent", ours]) == [ours]
        assert os.path.exists("/dev/shm/" + other)
    finally:
        os.unlink("/dev/shm/" + other)


@pytest.mark.parametrize("name", ["", "a\nb", None])
def test_watch_refuses_a_name_that_is_not_one_line(name):
    reaper = SegmentReaper()
    try:
        with pytest.raises(ValueError, match="segment name"):
            reaper.watch(name)
    finally:
        reaper.close()
