"""The Ray backend of the training loop (impl/rl/engines/ray/driver.py, workers.py).

Ray runs here on a two-node ``ray.cluster_utils.Cluster`` (one CPU per node, both on this
machine), so an actor asking for one CPU each really lands on both nodes. Default run: the
up-front refusals (no Ray started) and one short run on the cluster checking placement, the
loop's contracts and the cleanup. Slow: an actor killed mid-run (restarted, the run goes on,
its lost batch counted), the replay server killed mid-run (a clear error, nothing leaked),
two learners (gloo) on Ray, and a run with a Ray of its own (started beside the cluster,
not joining it) whose driver is SIGKILLed or whose raylet dies mid-run: every worker process
exits, every /dev/shm segment of the run is unlinked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from replaybench.impl.concurrent import leaked_segments
from replaybench.impl.rl import ConfigError, TrainConfig, WorkerFailed, train
from replaybench.impl.rl.common.result import total_updates

ray = pytest.importorskip("ray", reason="the Ray backend's tests need the 'ray' extra")

TINY = dict(hidden=(16, 16), batch_size=16, learning_starts=100, buffer_capacity=1024, updates_per_step=0.25)


def tiny(**kw) -> TrainConfig:
    base = dict(algo="dqn", env="CartPole-v1", steps=600, seed=3, overrides=dict(TINY), backend="ray", actors=2,
                learners=1, timeout_s=240)
    return TrainConfig(**{**base, **kw})


def segments_of(pids) -> list[str]:
    """Shared-memory segments created by any of ``pids`` still in /dev/shm."""
    return [name for pid in pids for name in leaked_segments(pid)]


def assert_gone(pids, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if os.path.exists(f"/proc/{p}")]
    assert not alive, f"processes still there: {alive}"


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes with one CPU each; runs connect to it with ``ray_address`` (as
    ``--ray-address`` does: ray.init for the run, ray.shutdown after it). Shut down (and every
    Ray process of it checked gone) at the end of the module."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    pids = []
    try:
        c.add_node(num_cpus=1)
        c.wait_for_nodes()
        yield c
    finally:
        for node in [c.head_node, *c.worker_nodes]:
            if node is not None:
                pids += [info.process.pid for infos in node.all_processes.values() for info in infos]
        c.shutdown()
    assert_gone(pids)  # raylet, gcs_server, ... of both nodes


# ---------------------------------------------------------------------------------------- up front
@pytest.mark.parametrize("cell,field", [(dict(backend="spark"), "backend"),
                                        (dict(backend="process", ray_address="127.0.0.1:6379"), "ray_address"),
                                        (dict(ray_address=""), "ray_address"),
                                        (dict(actor_max_restarts=-1), "actor_max_restarts"),
                                        (dict(actors=0), "backend"),
                                        (dict(envs_per_actor=2), "envs_per_actor")])
def test_bad_backend_config_is_refused_up_front(cell, field):
    with pytest.raises(ConfigError) as info:
        train(tiny(**cell))
    assert info.value.field == field and repr(info.value.value) in str(info.value)
    assert not ray.is_initialized()


def _refusing_address() -> str:
    """A local port nobody listens on (bound, then closed: refused until someone takes it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def silent_address():
    """A local port whose SYNs go unanswered, as a host that drops them (a firewall, a dead
    route): a listener with a backlog of 0 and its one queue slot taken, never accepting."""
    import socket

    with socket.socket() as server, socket.socket() as filler:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        filler.connect(server.getsockname())
        yield "127.0.0.1:%d" % server.getsockname()[1]


@pytest.mark.parametrize("address", ["refused", "ray://refused", "silent", "127.0.0.1:99999", "nohost.invalid:6379"])
def test_unreachable_ray_address_is_refused_within_the_bound(address, silent_address, monkeypatch, tmp_path, capsys):
    # refused at once; silent (the connect times out); a port out of range; a name nobody
    # resolves (at once, or the bound when the resolver is silent)
    from replaybench.impl.rl.engines.ray import driver as ray_backend

    monkeypatch.setattr(ray_backend, "ADDRESS_TIMEOUT_S", 1.0)
    address = address.replace("refused", _refusing_address()).replace("silent", silent_address)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        train(tiny(ray_address=address))
    assert time.monotonic() - t0 < 3.0  # the bound (1 s here, 5 s by default) plus the checks before it
    assert info.value.field == "ray_address" and repr(address) in str(info.value)
    assert not ray.is_initialized()
    from replaybench.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--backend", "ray", "--ray-address", address, "--out", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "argument --ray-address" in err and address in err
    assert list(tmp_path.iterdir()) == [] and not ray.is_initialized()


def test_without_ray_the_backend_says_it_is_unavailable(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match="backend 'ray' is unavailable: Ray is not installed.*replaybench\\[ray\\]"):
        train(tiny())
    from replaybench.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", "--backend", "ray", "--out", str(tmp_path), "--no-progress"])
    assert info.value.code == 2 and "argument --backend: backend 'ray' is unavailable" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------- runs
def test_ray_run_places_actors_on_both_nodes_and_keeps_the_loop_contracts(cluster):
    cfg = tiny(ray_address=cluster.address)
    acfg = cfg.algo_config()
    reports = []
    result = train(cfg, lambda *a: reports.append(a))
    assert result.engine == "ray" and not ray.is_initialized()  # disconnected after the run
    nodes = {node.node_id for node in [cluster.head_node, *cluster.worker_nodes]}
    assert len(nodes) == 2 and set(result.actor_nodes) == nodes  # one actor on each node
    # every env step reached the buffer, every actor's rows were sampled
    assert result.env_steps == cfg.steps == sum(result.actor_steps) == result.inserted
    assert result.actor_steps == [300, 300]
    assert sorted(result.actor_ids_sampled) == [0, 1] and min(result.actor_ids_sampled.values()) > 0
    # the samples-per-insert rate limit: exactly the sequential loop's number of updates
    assert result.updates == total_updates(cfg.steps, acfg.updates_per_step, acfg.learning_starts) > 0
    assert result.final_weight_min < 0.999  # priorities were written back
    assert result.actor_restarts == 0 and result.dropped_batches == 0
    assert result.profiles["actor"]["env_step"] > 0 and result.profiles["learner"]["sgd"] > 0
    assert reports and reports[-1][0] == cfg.steps
    assert list(reports[-1][3]) == list(result.episodes)  # the last report has every episode (issue 28 item 16)
    assert len(result.worker_pids) == 4  # server, learner, 2 actors
    assert segments_of(result.worker_pids) == []
    assert_gone(result.worker_pids)  # every Ray actor of the run was killed


@pytest.mark.slow
def test_killed_actor_is_restarted_and_the_run_goes_on(cluster):
    # actor 1 SIGKILLs itself after 150 env steps
    cfg = tiny(steps=1000, fail="actor-kill:1:150", ray_address=cluster.address)
    acfg = cfg.algo_config()
    result = train(cfg)
    assert result.actor_restarts == 1 and result.dropped_batches >= 1
    # the restarted life stepped the rows still owed: the buffer holds exactly the run's steps
    assert result.env_steps == result.inserted == cfg.steps and result.actor_steps == [500, 500]
    assert result.updates == total_updates(cfg.steps, acfg.updates_per_step, acfg.learning_starts)
    assert len(result.worker_pids) == 5  # server, learner, actor 0, both lives of actor 1
    assert segments_of(result.worker_pids) == []
    assert_gone(result.worker_pids)


@pytest.mark.slow
def test_actor_dying_past_max_restarts_fails_the_run(cluster):
    cfg = tiny(fail="actor-kill:0:50", actor_max_restarts=0, ray_address=cluster.address)
    with pytest.raises(WorkerFailed) as info:
        train(cfg)
    assert info.value.worker == "actor-0" and "died" in info.value.detail
    assert segments_of(info.value.pids) == []
    assert_gone(info.value.pids)


@pytest.mark.slow
def test_replay_server_death_ends_the_run_cleanly(cluster):
    # the server SIGKILLs itself at its 30th insert
    cfg = tiny(steps=2000, fail="server-kill:0:30", ray_address=cluster.address)
    t0 = time.monotonic()
    with pytest.raises(WorkerFailed) as info:
        train(cfg)
    err = info.value
    assert err.worker == "replay-server" and "the replay server" in err.detail and "died" in err.detail
    assert err.pids, "the server's pid names its segments"
    assert len(err.pids) == 4
    assert segments_of(err.pids) == []  # the buffer and the counters are unlinked
    assert_gone(err.pids)  # learners and actors killed, nothing restarted
    assert time.monotonic() - t0 < 120


@pytest.mark.slow
def test_two_learners_on_ray_stay_identical(cluster):
    result = train(tiny(learners=2, ray_address=cluster.address))
    assert len(result.learner_digests) == 2 and len(set(result.learner_digests)) == 1
    assert result.inserted == 600 and segments_of(result.worker_pids) == []


# ---------------------------------------------------------------------------------------- killed mid-run
_DRIVER = """
import sys
from replaybench.impl.rl import TrainConfig, train

tiny = dict(hidden=(16, 16), batch_size=16, learning_starts=100, buffer_capacity=1024, updates_per_step=0.25)
cfg = TrainConfig(algo="dqn", env="CartPole-v1", steps=200_000, seed=3, overrides=tiny, backend="ray", actors=2,
                  learners=1, timeout_s=600)
train(cfg, lambda steps, updates, recent, episodes: print("progress", steps, updates, flush=True))
"""


def _marked(mark: str) -> dict[int, str]:
    """The live processes (pid -> command line) whose environment holds ``mark``: the driver,
    the Ray cluster it started (gcs, raylet, agents, workers) and whatever they started."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:  # empty for a zombie
                if mark.encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours
            pass
    return found


def _ours(processes: dict[int, str]) -> dict[int, str]:
    """The run's own processes: every Ray worker (``ray::...``) and anything our code started,
    not Ray's per-node agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``), which
    exit on a timer of Ray's own (about a minute) once their raylet is gone."""
    return {pid: cmd for pid, cmd in processes.items() if not cmd.endswith("Agent")
            and ("ray::" in cmd or "reaper" in cmd)}


@pytest.fixture
def ray_driver(tmp_path, cluster):
    """Start ``_DRIVER`` (a run with a Ray it starts itself, beside the ``cluster`` running on
    this machine: it must not join that one) in a subprocess, marked by an environment
    variable every process of the run inherits; wait until the learners update.
    Yields ``(driver Popen, mark)``; at the end SIGKILLs every marked process still there
    (the Ray cluster included) and unlinks the segments they created."""
    mark = f"REPLAYBENCH_TEST_RUN={uuid.uuid4().hex}"
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1]}
    env.pop("RAY_ADDRESS", None)  # set by the cluster fixture: the driver would join that cluster
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env)
    lines: list[str] = []
    learning = threading.Event()

    def read():
        for line in driver.stdout:
            lines.append(line)
            if line.startswith("progress") and int(line.split()[2]) > 10:
                learning.set()

    threading.Thread(target=read, daemon=True).start()
    seen: dict[int, str] = {}
    try:
        assert learning.wait(240), "the run did not start learning:\n" + "".join(lines[-30:])
        seen = _marked(mark)  # the server among them: its pid names the segments
        yield driver, mark
    finally:
        driver.kill()
        seen.update(_marked(mark))
        for pid in seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        driver.wait(60)
        for name in [n for pid in seen for n in leaked_segments(pid)]:
            try:
                os.unlink("/dev/shm/" + name)
            except FileNotFoundError:
                pass


def _wait_until_clean(mark: str, segments: list[str], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while True:
        left = [name for name in segments if os.path.exists("/dev/shm/" + name)]
        alive = _ours(_marked(mark))
        if not (left or alive) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, f"segments of the run still in /dev/shm {within_s} s after: {left}"
    assert not alive, f"processes of the run still there {within_s} s after: {alive}"


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["driver", "raylet"])
def test_killed_driver_or_raylet_leaves_no_segment_and_no_worker(ray_driver, victim):
    driver, mark = ray_driver
    processes = _marked(mark)
    assert any("ray::ReplayServer" in cmd for cmd in processes.values()), processes
    segments = [name for pid in processes for name in leaked_segments(pid)]
    assert len(segments) == 2, segments  # the buffer and the counters, named by the server's pid
    (raylet,) = [pid for pid, cmd in processes.items() if "/raylet/raylet " in cmd]
    os.kill(driver.pid if victim == "driver" else raylet, signal.SIGKILL)
    _wait_until_clean(mark, segments, within_s=60.0)


# ---------------------------------------------------------------------------------------- scenario
def test_suite_runs_each_parallel_layout_on_each_backend_process_first():
    from replaybench.bench.scenarios.training import cells_for, suite_configs

    suite = {"name": "t", "algo": "dqn", "env": "CartPole-v1", "steps": 600, "seeds": [0],
             "buffers": [{"variant": "binary", "policy": "global-lock"}], "layouts": [[2, 1], [0, 0]],
             "backends": ["ray", "process"]}
    configs = suite_configs(suite)
    assert [(c.actors, c.learners, c.backend) for c in configs] == [(0, 0, "process"), (2, 1, "process"),
                                                                     (2, 1, "ray")]
    engines = [cell.columns["engine"] for cell in cells_for(configs)]
    assert engines == ["sequential", "process", "ray"]


@pytest.mark.slow
def test_train_command_on_a_ray_cluster(cluster, tmp_path):
    from replaybench.bench import results
    from replaybench.cli import main

    text = {key: ",".join(map(str, v)) if isinstance(v, tuple) else str(v) for key, v in TINY.items()}
    sets = [arg for key, value in text.items() for arg in ("--set", f"{key}={value}")]
    code = main(["train", "--backend", "ray", "--ray-address", cluster.address, "--steps", "600", *sets,
                 "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    (run_dir,) = tmp_path.iterdir()
    summary = {r["metric"]: r for r in results.read_rows(run_dir) if r["op"] == "summary"}
    assert {r["engine"] for r in summary.values()} == {"ray"}
    assert summary["env_steps_per_s"]["value"] > 0 and summary["actor_restarts"]["value"] == 0
