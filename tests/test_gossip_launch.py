"""Gossip learners as real processes on loopback nodes (impl/rl/gossip/launch.py, gossip_train.py):
no shared memory, a dead peer named and every process gone, bad arguments refused up front,
and the scenario and command end to end."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from replaybench.impl.rl.common.errors import ConfigError
from replaybench.impl.rl.gossip.launch import LaunchFailed, launch
from replaybench.impl.rl.gossip.learner import GossipConfig, shared_memory_maps

SMALL = {"n_envs": 4, "overrides": {"hidden": [16, 16]}, "snapshot_every": 2}


def _learner_processes() -> list[int]:
    """Processes still running a learner started from this test process."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if b"gossip_train" in cmd and int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
            found.append(int(pid))
    return found


def test_learners_on_loopback_nodes_share_no_memory():
    cfg = GossipConfig(scheme="gossip", nodes=2, learners_per_node=1, topology="ring", staleness=1, steps=400,
                       **SMALL)
    streamed = []
    result = launch(cfg, episodes=streamed.extend, episodes_every_s=0.0)
    # the launcher read every episode from the store as the learners reported them (issue 28 item 16)
    assert result.episodes and sorted(map(list, streamed)) == sorted(result.episodes)
    assert [l["host"] for l in result.learners] == ["127.0.0.2", "127.0.0.3"]
    # each learner listed its own mappings at its end: nothing it could share (no /dev/shm,
    # memfd or SysV segment, no writable shared mapping); /dev/shm itself is machine-wide, so
    # other programs' segments make a before/after listing of it meaningless here
    assert [l["shared_memory"] for l in result.learners] == [[], []]
    assert result.env_steps >= cfg.steps and result.consensus
    assert all(l["gossip"]["rounds"] == l["updates"] > 0 for l in result.learners)
    assert sum(l["gossip"]["received"] for l in result.learners) == sum(l["gossip"]["sent"] for l in result.learners)
    assert _learner_processes() == []


def test_shared_memory_maps_finds_a_shared_segment():
    from multiprocessing import shared_memory

    seg = shared_memory.SharedMemory(create=True, size=4096)
    try:
        assert any(seg.name in m for m in shared_memory_maps())
    finally:
        seg.close()
        seg.unlink()


def test_a_dead_peer_fails_the_run_naming_its_rank(tmp_path):
    cfg = GossipConfig(scheme="gossip", nodes=2, learners_per_node=1, topology="ring", staleness=1, steps=10**7,
                       timeout_s=2.0, time_limit_s=60.0, fail_rank=1, fail_after_rounds=3, **SMALL)
    with pytest.raises(LaunchFailed) as info:
        launch(cfg, log_dir=str(tmp_path))  # a failed run keeps its logs: here, in the test's folder
    errors = info.value.errors
    assert set(errors) == {0, 1}, str(info.value)
    assert errors[1].startswith("exit status 3")  # the crash: no word from it
    # its peer's messages stop: rank 0 fails with an error naming rank 1 and its node
    assert "rank 1 (node 127.0.0.3)" in errors[0] and errors[0].startswith("exit status 1")
    assert "terminated" not in str(info.value)  # every learner ended by itself
    assert _learner_processes() == []


@pytest.mark.parametrize("kwargs, launch_kwargs, field", [
    ({"learners_per_node": 0}, {}, "learners_per_node"),
    ({"scheme": "gossip", "nodes": 2, "learners_per_node": 1, "peers": 2, "topology": "ring"}, {}, "peers"),
    ({"staleness": -1}, {}, "staleness"),
    ({"lr_scaling": "linear"}, {}, "lr_scaling"),
    ({"overrides": {"hiddn": [8]}}, {}, "hiddn"),
    ({}, {"rdzv_endpoint": "localhost"}, "rdzv_endpoint"),
    ({"nodes": 2}, {"node_rank": 2}, "node_rank"),
    ({"nodes": 2}, {"node_rank": 1, "rdzv_endpoint": "10.0.0.1:29500"}, "node_addr"),
    # issue 28 item 7
    ({"env": "Pendulum-v1"}, {}, "env"),                          # continuous actions: the network cannot act
    ({"timeout_s": float("inf")}, {}, "timeout_s"),                # a timedelta overflows
    ({"time_limit_s": float("inf")}, {}, "time_limit_s"),
    ({"nodes": 300, "learners_per_node": 1}, {}, "nodes"),        # 250 loopback addresses
])
def test_bad_arguments_are_refused_before_any_process_starts(monkeypatch, kwargs, launch_kwargs, field):
    def no_process(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    with pytest.raises(ConfigError) as err:
        launch(GossipConfig(**kwargs), **launch_kwargs)
    assert err.value.field == field


@pytest.mark.parametrize("scheme, scaling, factor", [
    ("gossip", "sqrt", 2.0), ("gossip", "none", 1.0), ("allreduce", "sqrt", 1.0), ("independent", "sqrt", 1.0),
])
def test_gossip_learners_learning_rate_scales_with_the_square_root_of_the_learners(scheme, scaling, factor):
    """4 gossip learners train at twice the A2C rate (preset or override); the other schemes at it."""
    for overrides, lr in (({}, 3e-3), ({"lr": 1e-3}, 1e-3)):
        cfg = GossipConfig(scheme=scheme, nodes=4, learners_per_node=1, lr_scaling=scaling, overrides=overrides)
        assert cfg.validate().lr == pytest.approx(lr * factor)


def test_gossip_command_refuses_a_bad_option_naming_it(capsys, tmp_path):
    from replaybench.cli import main

    with pytest.raises(SystemExit) as code:
        main(["gossip", "--topology", "star", "--out", str(tmp_path)])
    assert code.value.code == 2
    assert "argument --topology: topology must be one of ring, exponential, got 'star'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, option, value", [
    (["--env", "Pendulum-v1"], "--env", "'Pendulum-v1'"),
    (["--timeout", "inf"], "--timeout", "inf"),
    (["--nodes", "300", "--learners-per-node", "1"], "--nodes", "got 300"),
])
def test_gossip_command_refuses_what_the_run_cannot_take_before_any_process(capsys, tmp_path, monkeypatch, args,
                                                                            option, value):
    """Issue 28 item 7: refused up front (exit 2 naming the option and the value), not by a
    learner process or an OverflowError."""
    from replaybench.cli import main

    def no_process(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    with pytest.raises(SystemExit) as code:
        main(["gossip", *args, "--out", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert code.value.code == 2 and f"argument {option}: " in err and value in err, err
    assert list(tmp_path.iterdir()) == []


def test_gossip_suite_with_more_nodes_than_loopback_addresses_is_refused_when_expanded():
    from replaybench.bench import driver
    from replaybench.bench.scenarios import SelectionError

    suite = {"name": "wide", "scenario": "gossip", "env": "CartPole-v1", "steps": 100, "seeds": [0],
             "learners": [300], "schemes": [{"scheme": "independent"}]}
    with pytest.raises(SelectionError, match="nodes must be at most 250"):
        driver.plan(suite)


@pytest.mark.slow
def test_gossip_quick_suite_runs_every_scheme(tmp_path):
    from replaybench.bench import contract, driver, suites

    run_dir = driver.run(suites.load("gossip-quick"), out=tmp_path, run_id="gq", progress=False, echo=lambda *a: None)
    rows = contract.read_rows(run_dir)
    summary = {(r["variant"], r["metric"]): r for r in rows if r["op"] == "summary"}
    assert summary[("gossip", "env_steps_per_s")]["status"] == "ok"
    assert summary[("allreduce", "final_consensus")]["value"] == pytest.approx(0.0, abs=1e-5)
    assert summary[("gossip", "bytes_per_step")]["value"] > 0
    assert any(r["op"] == "consensus" for r in rows) and any(r["op"] == "episode" for r in rows)


def test_gossip_suite_expands_into_checked_cells():
    from replaybench.bench import suites
    from replaybench.bench.scenarios import Selection, SelectionError
    from replaybench.bench.scenarios.gossip import SCENARIO

    suite = suites.load("gossip")
    cells = SCENARIO.cells(suite, Selection())
    labels = [c.label for c in cells]
    assert "paac N=1 straggler=1 seed=0" in labels and "gossip N=8 straggler=1 seed=2" in labels
    assert "gossip N=4 straggler=2 seed=1" in labels and "gossip N=2 straggler=2 seed=0" not in labels
    assert not any(c.label.startswith(("gossip", "allreduce")) and " N=1 " in c.label for c in cells)
    narrowed = SCENARIO.cells(suite, Selection(variants=["allreduce"]))
    assert {c.columns["variant"] for c in narrowed} == {"allreduce"}
    with pytest.raises(SelectionError, match="peers"):
        SCENARIO.cells({**suite, "schemes": [{"scheme": "gossip", "topology": "ring", "peers": 2}],
                        "learners": [2]}, Selection())
    with pytest.raises(SelectionError, match="unknown key"):
        SCENARIO.cells({**suite, "schemes": [{"scheme": "gossip", "stalenes": 1}]}, Selection())


@pytest.mark.slow
def test_two_gossip_learners_reach_the_cartpole_threshold():
    """The learners learn: 2 gossip learners (exponential graph, staleness 2, the CartPole
    preset at sqrt(2) times its learning rate) reach a pooled mean return of 475 within 300k env steps (seed 0 took about 150k
    when written; message timing makes runs differ, hence the margin)."""
    result = launch(GossipConfig(scheme="gossip", nodes=2, learners_per_node=1, staleness=2, steps=300_000,
                                 time_limit_s=900))
    assert result.time_to_threshold_s is not None, f"not reached in {result.env_steps} steps"
    assert result.final_consensus < 1.0


@pytest.mark.slow  # a command and two learner interpreters per case
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_an_interrupted_gossip_command_leaves_nothing_and_is_marked(tmp_path, signame):
    """Issue 41 item 7: Ctrl-C of `replaybench gossip` left /tmp/replaybench-gossip-*, and a
    SIGTERM left meta.json without ``interrupted``. Either signal: exit 130, no learner, no
    temporary folder, the run marked interrupted."""
    import signal
    import sys
    import time

    from replaybench.bench import results

    tmp, out = tmp_path / "tmp", tmp_path / "out"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}  # the launcher's temporary log folder goes here
    proc = subprocess.Popen([sys.executable, "-m", "replaybench.bench", "gossip", "--nodes", "1",
                             "--learners-per-node", "2", "--steps", str(10**8), "--n-envs", "4", "--set",
                             "hidden=16,16", "--out", str(out), "--no-progress"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not list(tmp.glob("replaybench-gossip-*/learner-1.log")):  # the learners are started
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.1)
        time.sleep(1.0)
        learners = [int(p) for p in os.listdir("/proc") if p.isdigit() and _child_of(int(p), proc.pid)]
        proc.send_signal(getattr(signal, signame))  # to the command only, as `kill` does
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, output
    assert list(tmp.iterdir()) == [], output  # no replaybench-gossip-* folder left
    assert learners and not [pid for pid in learners if Path(f"/proc/{pid}").exists()], output
    (run_dir,) = out.iterdir()
    meta = results.read_meta(run_dir)
    assert meta["complete"] is False and meta["interrupted"] is True


def _child_of(pid: int, parent: int) -> bool:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == parent
    except (OSError, ValueError, IndexError):
        return False
