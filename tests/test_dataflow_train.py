"""The training loop on the static-dataflow backend (impl/rl/engines/dataflow.py, ``--backend dataflow``).

Short real runs (one server, env worker processes, one learner): every env step reported is
inserted and counted for the env worker that stepped it, the learner's weights move and its
priorities stay finite (the buffer refuses a non-finite one, which would fail the run), and
every process, env workers included, has exited and no /dev/shm segment is left, after a
normal end, an env worker raising and the learner raising. Bad options are refused before
any process starts. The training scenario writes the dataflow's rows (mode, vs_process, the
env workers' profile) and the suite runs every layout on every backend. Slow (``make
test-slow``, a fresh interpreter each): the parent interrupted (SIGINT) or killed (SIGKILL)
mid-run leaves no process of its tree behind and no segment.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from replaybench.impl.concurrent import leaked_segments
from replaybench.impl.rl import ConfigError, TrainConfig, WorkerFailed, algorithms, train
from replaybench.impl.rl.common.result import total_updates
from replaybench.impl.rl.common.envs import make_env
from replaybench.impl.rl.common.seeding import RunSeeds

from _support import assert_exited, own_segments

STEPS = 400
TINY = dict(hidden=(16, 16), batch_size=16, learning_starts=100, buffer_capacity=1024, updates_per_step=0.5)


def tiny(**kw) -> TrainConfig:
    base = dict(algo="dqn", env="CartPole-v1", buffer="kary-aligned", policy="lazy-writing", steps=STEPS, seed=3,
                actors=2, learners=1, envs_per_actor=2, overrides=dict(TINY), backend="dataflow", timeout_s=120,
                join_timeout_s=5)
    return TrainConfig(**{**base, **kw})


def test_short_run_inserts_every_step_it_reports_and_learns():
    cfg = tiny()
    acfg = cfg.algo_config()
    env = make_env(cfg.env)
    initial = algorithms.get("dqn").learner_cls((env.observation_space, env.action_space), acfg,
                                                RunSeeds(cfg.seed).networks).digest()
    result = train(cfg)
    assert result.engine == "dataflow"
    # no lost insert: what the run reports, the buffer received; each env worker stepped its share
    assert result.env_steps == result.inserted == STEPS
    assert result.actor_steps == [STEPS // 2, STEPS // 2]
    assert sorted(result.actor_ids_sampled) == [0, 1] and min(result.actor_ids_sampled.values()) > 0
    assert result.updates == total_updates(STEPS, acfg.updates_per_step, acfg.learning_starts) > 0
    # the learner moved its weights; priorities (|TD|) moved off the initial maximum and are finite
    assert result.learner_digests != [initial]
    assert math.isfinite(result.final_weight_min) and 0 < result.final_weight_min < 0.999
    assert result.episodes and all(0 < steps <= STEPS and ret >= 1 for steps, _, ret in result.episodes)
    assert [s for s, _, _ in result.episodes] == sorted(s for s, _, _ in result.episodes)
    assert result.processes == {"actor": 1, "learner": 1, "env_worker": 2}
    assert result.profiles["actor"]["inference"] > 0 and result.profiles["env_worker"]["env_step"] > 0
    assert result.profiles["learner"]["sgd"] > 0
    assert len(result.worker_pids) == 4  # server, learner, two env workers
    assert_exited(result.worker_pids)
    assert own_segments() == []


@pytest.mark.parametrize("env, fail, worker, message", [
    ("_stepping_envs:FailAt-v0", None, "server-0", "RuntimeError: injected failure"),  # an env worker's env raises
    ("CartPole-v1", "learner:0:3", "learner-0", "InjectedFailure"),
])
def test_a_failure_stops_the_run_and_releases_everything(env, fail, worker, message):
    cfg = tiny(env=env, fail=fail, actors=1, envs_per_actor=2)
    with pytest.raises(WorkerFailed) as info:
        train(cfg)
    err = info.value
    assert err.worker == worker and message in err.detail and "Traceback" in err.detail
    if worker == "server-0":
        assert "stepping-0" in err.detail  # the env worker is named in the server's report
    assert len(err.pids) == 3  # server, learner, one env worker
    assert_exited(err.pids)
    assert own_segments() == []


@pytest.fixture
def no_processes(monkeypatch):
    """Process.start refuses to run; returns what tried."""
    import multiprocessing.process

    tried = []

    def refuse(*args, **kwargs):
        tried.append(args)
        raise AssertionError("Process.start called")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    return tried


@pytest.mark.parametrize("kw, field", [(dict(actors=0), "backend"), (dict(learners=0), "backend"),
                                       (dict(algo="a2c"), "backend"), (dict(envs_per_actor=0), "envs_per_actor"),
                                       (dict(fail="actor:0:5"), "fail")])
def test_bad_options_are_refused_before_any_process_starts(kw, field, no_processes):
    with pytest.raises(ConfigError) as info:
        train(tiny(**kw))
    assert info.value.field == field and repr(info.value.value) in str(info.value) and no_processes == []


@pytest.mark.parametrize("args, reason", [
    (["--actors", "0"], "actors=0"), (["--sequential"], "actors=0"), (["--algo", "a2c"], "replay loop"),
])
def test_train_command_refuses_bad_dataflow_options(args, reason, no_processes, tmp_path, capsys):
    from replaybench.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", "--backend", "dataflow", *args, "--out", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "argument --backend: " in err and reason in err, err
    assert no_processes == [] and list(tmp_path.iterdir()) == []


def test_training_suite_runs_each_layout_on_every_backend():
    from pathlib import Path

    from replaybench.bench.scenarios.training import suite_configs

    suite = json.loads((Path(__file__).resolve().parent.parent / "bench/suites/training-dataflow.json").read_text())
    configs = suite_configs(suite)
    parallel = [(c.seed, c.actors, c.learners, c.envs_per_actor, c.backend) for c in configs if not c.sequential]
    for seed, a, l, e, _ in parallel:
        assert {b for s, a2, l2, e2, b in parallel if (s, a2, l2, e2) == (seed, a, l, e)} == set(suite["backends"])
    assert np.all([c.algo_config().updates_per_step == 0.0625 for c in configs])


def test_training_scenario_writes_dataflow_rows_beside_the_process_backends(monkeypatch, tmp_path):
    """The scenario's wiring, with the loop replaced by canned results: mode "dataflow", its
    vs_process against the process run of the same configuration, its env_worker profile."""
    from replaybench.bench import results
    from replaybench.bench.scenarios.training import run_configs
    from replaybench.impl import rl
    from replaybench.impl.rl import TrainResult

    def fake_train(cfg, progress=None):
        wall = {"process": 2.0, "dataflow": 1.0}[cfg.backend]  # the dataflow run: twice the env steps/s
        roles = {"actor": 1, "learner": 1, **({"env_worker": cfg.actors} if cfg.backend == "dataflow" else {})}
        return TrainResult(engine=cfg.backend, env_steps=cfg.steps,
                           updates=10, wall_s=wall, episodes=[], threshold=None, window=20, time_to_threshold_s=None,
                           steps_to_threshold=None, sample_calls=10, sample_latency_s=1e-4, actor_wait_s=0.0,
                           learner_wait_s=0.0, profiles={role: {"env_step": 0.5} for role in roles}, processes=roles,
                           buffer_lock_wait_s=0.0, learner_digests=["d"], actor_steps=[cfg.steps],
                           actor_ids_sampled={0: 1}, inserted=cfg.steps, final_weight_min=0.5)

    monkeypatch.setattr(rl, "train", fake_train)
    configs = [tiny(backend="process", steps=1000), tiny(steps=1000)]
    rows = results.read_rows(run_configs(configs, out=tmp_path, run_id="df", progress=False))
    summary = {(r["engine"], r["metric"]): r for r in rows if r["op"] == "summary"}
    assert ("process", "vs_process") not in summary
    assert float(summary[("dataflow", "vs_process")]["value"]) == pytest.approx(2.0)
    roles = {json.loads(r["params"])["role"]: json.loads(r["params"])["processes"]
             for r in rows if r["op"] == "profile" and r["engine"] == "dataflow"}
    assert roles == {"actor": 1, "learner": 1, "env_worker": 2}


_PARENT = """
import sys
from replaybench.impl.rl import TrainConfig, train

if __name__ == "__main__":
    cfg = TrainConfig(algo="dqn", env="CartPole-v1", steps=10_000_000, actors=2, learners=1, envs_per_actor=2,
                      backend="dataflow", overrides={"hidden": (16,), "updates_per_step": 0.0625})
    started = []

    def progress(steps, updates, recent, episodes):
        if steps > 0 and not started:
            started.append(steps)
            print("running", flush=True)

    train(cfg, progress)
"""


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_every_process_exits_when_the_parent_is_interrupted_or_killed(tmp_path, how):
    import signal
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "running", parent.stderr.read()
        tree = _descendants(parent.pid)  # fork servers, resource trackers, server, learner, env workers
        assert len(tree) >= 5
        os.kill(parent.pid, getattr(signal, how))
        parent.wait(60)
        assert_exited(tree)
        assert not [name for name in leaked_segments() if f"_{parent.pid}_" in name]
    finally:
        if parent.poll() is None:
            parent.kill()
