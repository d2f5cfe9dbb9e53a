"""Rows reach the disk as a run goes, and a full disk at the end loses at most the last batch
(issue 28 item 16): rows.csv is appended to and fsync'ed batch by batch (bench.results), a
training run hands over its episode rows while it trains (bench.scenarios.training), and a
write that fails leaves every earlier row, whole, with meta.json saying ``complete: false``.

The full disk is faked at the system-call level: any write of rows.csv data holding a summary
row (the last batch a training run writes) fails with ENOSPC, half written, whether it goes
through ``os.write`` (appending) or a temp file and ``os.replace`` (rewriting the file).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from replaybench.bench import contract, results
from replaybench.bench.scenarios import training

TINY_DQN = ["--set", "hidden=16", "--set", "batch_size=16", "--set", "learning_starts=100",
            "--set", "buffer_capacity=1024"]


class FullDisk:
    """Refuse (ENOSPC) writes to rows.csv of data that holds ``marker``; with ``everything``,
    once one was refused, every later write of rows.csv or meta.json too (the disk stays full)."""

    def __init__(self, monkeypatch, marker: bytes = b",summary,", everything: bool = False):
        self.marker, self.everything, self.refused = marker, everything, 0
        self._write, self._replace = os.write, os.replace
        monkeypatch.setattr(os, "write", self.write)
        monkeypatch.setattr(os, "replace", self.replace)

    def _full(self, name: str, data: bytes) -> bool:
        if name == "rows.csv" and self.marker in data:
            return True
        return self.everything and self.refused > 0 and name in ("rows.csv", "meta.json")

    def write(self, fd, data):
        try:
            name = Path(os.readlink(f"/proc/self/fd/{fd}")).name
        except OSError:
            name = ""
        if self._full(name, bytes(data)):
            self.refused += 1
            self._write(fd, bytes(data)[: len(data) // 2])  # the part that fitted
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._write(fd, data)

    def replace(self, src, dst, *args, **kwargs):
        name = Path(dst).name
        if name in ("rows.csv", "meta.json") and self._full(name, Path(src).read_bytes()):
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._replace(src, dst, *args, **kwargs)


MISSES = {"scenario": "cache", "variant": "binary", "structure": "binary", "capacity": 1024, "op": "sample",
          "metric": "misses", "unit": "misses/op", "status": "ok", "value": 1.0}


def test_rows_are_appended_and_a_failed_batch_leaves_no_half_row(tmp_path, monkeypatch):
    writer = results.RunWriter(tmp_path, "w", {"scenario": "cache"})
    writer.append([{**MISSES, "repeat": 0}, {**MISSES, "repeat": 1}])
    assert [r["repeat"] for r in contract.read_rows(writer.dir)] == [0, 1]  # on disk once append returns
    disk = FullDisk(monkeypatch, marker=b",sample,misses,7.0,")
    with pytest.raises(results.ResultsWriteError, match="rows.csv.*No space left on device.*2 row"):
        writer.append([{**MISSES, "repeat": 2, "value": 7.0}])
    assert disk.refused == 1 and writer.n_rows == 2
    assert [r["repeat"] for r in contract.read_rows(writer.dir)] == [0, 1]  # the half batch was cut off
    writer.append([{**MISSES, "repeat": 3}])  # space again: the file goes on from its last whole batch
    assert [r["repeat"] for r in contract.read_rows(writer.dir)] == [0, 1, 3]
    assert contract.read_meta(writer.dir)["complete"] is False


@pytest.mark.parametrize("everything", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["rows-only", "meta-too"])
def test_a_full_disk_at_the_end_of_train_keeps_the_episodes_and_marks_the_run_incomplete(
        tmp_path, monkeypatch, capsys, everything):
    """The train command's last write (the summary rows) fails: the episode rows written while
    it trained are on disk, whole, and meta.json says incomplete; exit 1 with the error."""
    from replaybench.cli import main

    monkeypatch.setattr(training, "WRITE_EVERY_S", 0.0, raising=False)  # every progress report writes
    disk = FullDisk(monkeypatch, everything=everything)
    code = main(["train", "--sequential", "--steps", "300", "--seed", "1", *TINY_DQN, "--out", str(tmp_path),
                 "--run-id", "full", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and disk.refused >= 1, err
    assert "error: could not write" in err and "rows.csv" in err and "No space left on device" in err, err
    rows = contract.read_rows(tmp_path / "full")  # a whole file: the readers' checks pass
    episodes = [r for r in rows if r["op"] == "episode"]
    assert episodes and len(episodes) == len(rows)  # every episode, nothing of the lost summary
    assert [r["repeat"] for r in episodes] == list(range(len(episodes)))
    assert all(r["status"] == "ok" and r["run_id"] == "full" and r["env_steps"] <= 300 for r in episodes)
    meta = contract.read_meta(tmp_path / "full")
    assert meta["complete"] is False
    assert ("write_error" in meta) is (not everything)


def _gossip_result(episodes):
    from replaybench.impl.rl.gossip.learner import GossipResult

    return GossipResult(env_steps=400, wall_s=2.0, env_steps_per_s=200.0, time_to_threshold_s=None,
                        steps_to_threshold=None, consensus=[(1.0, 0.5)], final_consensus=0.25, bytes_sent=0,
                        wait_s=[0.0, 0.0],
                        learners=[{"rank": r, "host": "127.0.0.2", "env_steps": 200, "updates": 10, "end_s": 2.0,
                                   "wait_s": 0.0, "bytes_sent": 0, "gossip": None, "shared_memory": []}
                                  for r in (0, 1)],
                        episodes=sorted([list(e) for e in episodes]))


def test_a_full_disk_at_the_end_of_gossip_keeps_the_episodes_and_marks_the_run_incomplete(
        tmp_path, monkeypatch, capsys):
    """The gossip command's run: the episodes the launcher reported while it ran are on disk;
    the summary rows at the end hit a full disk; meta.json says incomplete; exit 1."""
    from replaybench.cli import main
    from replaybench.impl.rl.gossip import launch as gossip_launch

    reported = [[(0.5, 40, 12.0, 1), (0.6, 30, 9.0, 0)], [(1.5, 120, 30.0, 0)]]

    def fake_launch(cfg, *, progress=None, episodes=None, **kwargs):  # the learners, as the launcher reports them
        for batch in reported:
            progress(200)
            episodes(batch)
        return _gossip_result([e for batch in reported for e in batch] + [(1.9, 200, 41.0, 1)])

    monkeypatch.setattr(gossip_launch, "launch", fake_launch)
    monkeypatch.setattr(training, "WRITE_EVERY_S", 0.0)
    disk = FullDisk(monkeypatch)
    code = main(["gossip", "--scheme", "independent", "--nodes", "2", "--learners-per-node", "1", "--steps", "400",
                 "--out", str(tmp_path), "--run-id", "g", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and disk.refused == 1 and "rows.csv" in err and "No space left on device" in err, err
    rows = contract.read_rows(tmp_path / "g")
    assert [(r["op"], r["repeat"], r["wall_s"], r["env_steps"], r["value"]) for r in rows] == [
        ("episode", 0, 0.5, 40, 12.0), ("episode", 1, 0.6, 30, 9.0), ("episode", 2, 1.5, 120, 30.0)]
    assert contract.read_meta(tmp_path / "g")["complete"] is False


def test_gossip_rows_leave_out_the_episodes_written_as_the_run_went():
    from replaybench.bench.scenarios.gossip import result_rows

    episodes = [(0.5, 40, 12.0, 1), (0.6, 30, 9.0, 0), (0.6, 30, 9.0, 0), (1.9, 200, 41.0, 1)]
    written = __import__("collections").Counter([(0.6, 30, 9.0, 0), (0.5, 40, 12.0, 1)])
    rows = [r for r in result_rows(_gossip_result(episodes), {}, "independent", written) if r["op"] == "episode"]
    assert [(r["repeat"], r["wall_s"], r["value"]) for r in rows] == [(2, 0.6, 9.0), (3, 1.9, 41.0)]
