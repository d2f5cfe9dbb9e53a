"""Smoke tests of the training loop (impl/rl, bench/train_command.py): short real runs, small networks.

DQN runs with 1 actor and 1 learner and with 2 and 2, TD3 with 2 and 2 (the other layouts are
slow tests), for a few hundred env steps;
the checks are the loop's contracts, not learning: every actor's transitions reach the buffer
and get sampled, learners stay bitwise identical after gradient averaging, priorities move
away from their initial value, the update count is the ratio's, and every process exits and
the shared memory is released, also when one worker raises. About a minute on 2 cores.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from replaybench.bench import results
from replaybench.impl.rl import ConfigError, InjectedFailure, TrainConfig, WorkerFailed, train
from replaybench.impl.rl.common.result import total_updates
from replaybench.impl.rl.common.envs import EnvRunner, EpisodeLog, TransitionStager, make_env, transition_fields
from replaybench.impl.rl.common.profiler import SectionProfiler
from replaybench.impl.rl.common.seeding import RunSeeds
from replaybench.impl.rl.common.shared_state import RateLimiter, SharedState, SharedWeights, Stopped

from _support import assert_exited, own_segments

ROOT = Path(__file__).resolve().parent.parent

#: Small networks and early learning so that a few hundred steps exercise every path.
TINY = {
    "dqn": dict(hidden=(16, 16), batch_size=16, learning_starts=100, buffer_capacity=1024, updates_per_step=0.5),
    "td3": dict(hidden=(16, 16), batch_size=16, learning_starts=100, buffer_capacity=1024, updates_per_step=0.5),
}
ENVS = {"dqn": "CartPole-v1", "td3": "Pendulum-v1"}
STEPS = 400


def tiny(algo: str, **kw) -> TrainConfig:
    base = dict(algo=algo, env=ENVS[algo], buffer="kary-aligned", policy="lazy-writing", steps=STEPS, seed=3,
                overrides=dict(TINY[algo]), timeout_s=120)
    return TrainConfig(**{**base, **kw})


# ---------------------------------------------------------------------------------------- parallel
#: Slow layouts: the default run's (1, 1) and (2, 2) cover the one- and many-actor and -learner
#: paths of both algorithms, and 2 actors with 1 learner runs in the E = 4 test and the training suite.
_COVERED = pytest.mark.slow


@pytest.mark.parametrize("algo,actors,learners", [
    ("dqn", 1, 1), pytest.param("dqn", 2, 1, marks=_COVERED), pytest.param("dqn", 1, 2, marks=_COVERED),
    ("dqn", 2, 2), pytest.param("td3", 1, 1, marks=_COVERED), ("td3", 2, 2),
])
def test_parallel_smoke(algo, actors, learners):
    cfg = tiny(algo, actors=actors, learners=learners)
    acfg = cfg.algo_config()
    result = train(cfg)
    assert result.engine == "process"
    # every env step of every actor was inserted, and the learners sampled every actor's rows
    assert result.env_steps == STEPS and sum(result.actor_steps) == STEPS and result.inserted == STEPS
    assert len(result.actor_steps) == actors and min(result.actor_steps) >= STEPS // actors
    assert sorted(result.actor_ids_sampled) == list(range(actors))
    assert all(count > 0 for count in result.actor_ids_sampled.values()), result.actor_ids_sampled
    # the ratio: exactly as many updates as the sequential loop would do
    assert result.updates == total_updates(STEPS, acfg.updates_per_step, acfg.learning_starts) > 0
    # gradient averaging keeps the learners bitwise identical
    assert len(result.learner_digests) == learners and len(set(result.learner_digests)) == 1
    # priorities moved away from the initial max priority (all weights 1 before any update)
    assert result.final_weight_min < 0.999
    assert result.sample_latency_s > 0 and result.wall_s > 0
    assert set(result.profiles) == {"actor", "learner"}
    assert result.profiles["actor"]["env_step"] > 0 and result.profiles["learner"]["sgd"] > 0
    assert_exited(result.worker_pids)
    assert own_segments() == []


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["lazy-writing", "optimistic"])
def test_parallel_run_with_a_buffer_as_small_as_an_insert(policy):
    """Issue 28.3: with buffer_capacity equal to the insert batch (8), each insert reserves
    every slot while it copies; the learners' samples used to fail with "total priority is 0".
    They now wait for the insert to publish."""
    cfg = tiny("dqn", policy=policy, actors=2, learners=1, steps=2000,
               overrides={**TINY["dqn"], "buffer_capacity": 8})
    result = train(cfg)
    assert result.env_steps == 2000 and result.updates > 0
    assert own_segments() == []


@pytest.mark.parametrize("fail", ["actor:1:50", "learner:1:3"])
def test_failing_worker_stops_the_run_and_releases_everything(fail):
    cfg = tiny("dqn", actors=2, learners=2, fail=fail, join_timeout_s=5)
    t0 = time.monotonic()
    with pytest.raises(WorkerFailed) as info:
        train(cfg)
    err = info.value
    assert err.worker == fail.rsplit(":", 1)[0].replace(":", "-")
    assert "InjectedFailure" in err.detail and "Traceback" in err.detail  # the child's own traceback
    assert len(err.pids) == 4
    assert_exited(err.pids)
    assert own_segments() == []
    assert time.monotonic() - t0 < 60


# ---------------------------------------------------------------------------------------- sequential
@pytest.mark.parametrize("algo", ["dqn", "td3"])
def test_sequential_smoke(algo):
    cfg = tiny(algo)
    acfg = cfg.algo_config()
    result = train(cfg)
    assert result.engine == "sequential" and result.env_steps == STEPS
    assert result.updates == total_updates(STEPS, acfg.updates_per_step, acfg.learning_starts)
    assert result.final_weight_min < 0.999
    assert result.episodes and all(s <= STEPS for s, _, _ in result.episodes)
    assert set(result.profiles) == {"sequential"}
    prof = result.profiles["sequential"]
    assert prof["env_step"] > 0 and prof["inference"] > 0 and prof["replay"] > 0 and prof["sgd"] > 0
    assert sum(prof.values()) == pytest.approx(result.wall_s, rel=1e-6)


def test_sequential_failure_hook_raises():
    with pytest.raises(InjectedFailure):
        train(tiny("dqn", fail="sequential:0:20"))


@pytest.mark.parametrize("buffer", ["binary", "uniform"])
def test_sequential_runs_other_variants(buffer):
    result = train(tiny("dqn", buffer=buffer, steps=200))
    assert result.env_steps == 200 and result.updates > 0


def test_sequential_run_is_reproducible_from_its_seed():
    """One integer seeds env, exploration, networks and buffer sampling (RunSeeds)."""
    a, b, c = (train(tiny("dqn", steps=200, seed=seed)) for seed in (4, 4, 5))
    assert a.learner_digests == b.learner_digests != c.learner_digests
    assert [(s, r) for s, _, r in a.episodes] == [(s, r) for s, _, r in b.episodes]


# ---------------------------------------------------------------------------------------- envs per actor
def test_env_runner_steps_every_env_with_one_batched_forward():
    """E envs, n vector steps: E x n rows, one act_batch call per step, env j's rows (j, j+E,
    ...) a trajectory of env j seeded with its own ActorSeeds.env_seed(j)."""
    from replaybench.impl.rl.algorithms.dqn import DQNActor, DQNConfig

    n_envs, n_steps = 3, 40
    envs = [make_env("CartPole-v1") for _ in range(n_envs)]
    spaces = (envs[0].observation_space, envs[0].action_space)
    actor = DQNActor(spaces, DQNConfig(hidden=(8,), eps_start=0.5, eps_end=0.5), seed=1)
    calls = []
    real = actor.act_batch
    actor.act_batch = lambda obs, t: calls.append((obs.shape, t)) or real(obs, t)
    stage = TransitionStager(transition_fields(envs[0]), n_envs * n_steps)
    episodes = []
    runner = EnvRunner(envs, actor, stage, 5, SectionProfiler(), lambda steps, ret: episodes.append((steps, ret)))
    seeds = RunSeeds(3).actor(5)
    runner.reset([seeds.env_seed(j) for j in range(n_envs)])
    for t in range(n_steps):
        assert runner.step(n_envs * t) == (t == n_steps - 1)
    batch = stage.batch()
    assert calls == [((n_envs, 4), n_envs * t) for t in range(n_steps)]
    assert len(batch["reward"]) == n_envs * n_steps and (batch["actor"] == 5).all()
    for j in range(n_envs):
        rows = {k: v[j::n_envs] for k, v in batch.items()}
        first, _ = make_env("CartPole-v1").reset(seed=seeds.env_seed(j))
        assert np.array_equal(rows["obs"][0], first)
        cont = ~rows["done"][:-1]  # CartPole ends by termination only within 40 steps
        assert np.array_equal(rows["obs"][1:][cont], rows["next_obs"][:-1][cont])
    assert len({tuple(batch["obs"][j]) for j in range(n_envs)}) == n_envs  # distinct seeds
    # every end is a termination within 40 steps (CartPole truncates at 500), reported once
    assert len(episodes) == int(batch["done"].sum()) and all(0 < steps <= n_envs * n_steps for steps, _ in episodes)
    for e in envs:
        e.close()


def test_act_batch_is_the_per_row_policy_in_one_forward():
    """A batch's greedy actions are each row's own; exploration rows are drawn per row."""
    from replaybench.impl.rl.algorithms.dqn import DQNActor, DQNConfig
    from replaybench.impl.rl.algorithms.td3 import TD3Actor, TD3Config

    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    env, penv = make_env("CartPole-v1"), make_env("Pendulum-v1")
    spaces = (env.observation_space, env.action_space)
    greedy = DQNActor(spaces, DQNConfig(hidden=(8,), eps_start=0.0, eps_end=0.0), seed=0)
    assert greedy.act_batch(obs, 0).tolist() == [int(greedy.act(o, 0)) for o in obs]
    random = DQNActor(spaces, DQNConfig(hidden=(8,), eps_start=1.0, eps_end=1.0), seed=0, net=greedy.q)
    drawn = random.act_batch(obs, 0)
    assert drawn.dtype == np.int64 and set(drawn.tolist()) == {0, 1}  # not one draw for the whole batch
    tcfg = TD3Config(hidden=(8,), learning_starts=0, exploration_noise=0.0)
    pi = TD3Actor((penv.observation_space, penv.action_space), tcfg, seed=4)
    rows = pi.act_batch(obs[:, :3], 0)
    assert rows.shape == (64, 1) and np.allclose(rows, np.stack([pi.act(o, 0) for o in obs[:, :3]]), atol=1e-6)
    env.close()
    penv.close()


def test_envs_per_actor_parallel_run_inserts_every_step():
    """E = 4 envs per actor, 2 actors, steps not a multiple of actors x E: every env step is
    inserted, each actor's share is exact, the ratio's updates are done, every actor sampled."""
    cfg = tiny("dqn", actors=2, learners=1, envs_per_actor=4, steps=402)
    acfg = cfg.algo_config()
    result = train(cfg)
    assert result.env_steps == 402 and result.inserted == 402 and result.actor_steps == [201, 201]
    assert result.updates == total_updates(402, acfg.updates_per_step, acfg.learning_starts)
    assert sorted(result.actor_ids_sampled) == [0, 1] and all(result.actor_ids_sampled.values())
    assert result.profiles["actor"]["inference"] > 0
    assert_exited(result.worker_pids)
    assert own_segments() == []


def test_envs_per_actor_sequential_run_is_reproducible_from_its_seed():
    """The sequential loop with E = 4 (202 steps: a partial last vector step) inserts every step
    and repeats itself from its seed; E is part of what the seed reproduces."""
    a, b, c = (train(tiny("dqn", steps=202, seed=4, envs_per_actor=e)) for e in (4, 4, 1))
    assert a.env_steps == a.inserted == 202 and a.episodes
    assert a.learner_digests == b.learner_digests != c.learner_digests
    assert [(s, r) for s, _, r in a.episodes] == [(s, r) for s, _, r in b.episodes]


@pytest.mark.parametrize("value", [0, -1, 2.5, True, 201])
def test_bad_envs_per_actor_is_refused(value, no_workers):
    cfg = tiny("dqn", actors=2, learners=1, envs_per_actor=value)  # 400 steps: 200 per actor
    with pytest.raises(ConfigError, match="envs_per_actor") as info:
        train(cfg)
    assert info.value.field == "envs_per_actor" and info.value.value == value and no_workers == []


# ---------------------------------------------------------------------------------------- pieces
def test_rate_limiter_holds_the_ratio_and_stops():
    import multiprocessing as mp

    state = SharedState(mp.get_context("spawn"), actors=2, learners=1)
    limiter = RateLimiter(state, ratio=0.5, starts=100, tolerance=4, insert_batch=8, poll_s=1e-4)
    assert limiter.tolerance == 5.0  # raised to 1 + ratio * insert_batch: no deadlock
    state.actor_steps[:] = [60, 60]  # 120 steps: 10 updates due
    bounds = limiter.bounds  # (inserted, sampled = updates, n)
    assert bounds.may_sample(120, 9, 1) and not bounds.may_sample(120, 10, 1)
    assert limiter.wait_update(0, 9) == 0.0
    assert not bounds.may_insert(120, 0, 8)  # backlog after the insert: 0.5 * 28 - 0 = 14 > 5
    state.learner_updates[0] = 10
    assert bounds.may_insert(120, 10, 8) and limiter.wait_insert(0, 8) == 0.0  # 0.5 * 28 - 10 = 4 <= 5
    state.stop()
    with pytest.raises(Stopped):
        limiter.wait_update(0, 10)
    assert state.learner_wait[0] > 0


def test_shared_weights_versions():
    import multiprocessing as mp

    state = SharedState(mp.get_context("spawn"), actors=1, learners=1)
    weights = SharedWeights(mp.get_context("spawn"), state, 5)
    assert weights.read_if_newer(0) is None  # nothing published
    v = weights.publish(np.arange(5))
    version, copy = weights.read_if_newer(0)
    assert version == v == 2 and copy.tolist() == [0, 1, 2, 3, 4]
    assert weights.read_if_newer(v) is None
    state.flags[2] = 3  # a write in progress: readers keep what they have
    assert weights.read_if_newer(v) is None


def test_episode_log_threshold_and_stager():
    log = EpisodeLog(threshold=10.0, window=3)
    for i, ret in enumerate([5, 10, 12, 9, 11]):
        log.record(10 * (i + 1), float(i), ret)
    # mean(5, 10, 12) = 9 < 10, then mean(10, 12, 9) = 10.33: reached at the 4th episode
    assert log.steps_to_threshold == 40 and log.time_to_threshold_s == 3.0
    assert log.recent_mean() == pytest.approx((12 + 9 + 11) / 3)
    stage = TransitionStager({"obs": ((2,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
                              "next_obs": ((2,), "float32"), "done": ((), "bool"), "actor": ((), "int32")}, 2)
    assert not stage.push([[1, 2]], [1], [0.5], [[3, 4]], [False], 7)
    with pytest.raises(ValueError, match="do not fit"):
        stage.push([[0, 0]] * 2, [0, 0], [0.0, 0.0], [[0, 0]] * 2, [False, False], 7)
    assert stage.n == 1  # unchanged
    assert stage.push([[5, 6]], [0], [1.5], [[7, 8]], [True], 7)
    batch = stage.batch()
    assert batch["obs"].tolist() == [[1, 2], [5, 6]] and batch["actor"].tolist() == [7, 7] and stage.n == 0


def test_env_runner_acts_stages_and_reports_episodes():
    class Push:  # always action 1: CartPole falls over within a few dozen steps
        def act_batch(self, obs, env_steps):
            seen.append(env_steps)
            return np.ones(len(obs), dtype=np.int64)

        def env_action(self, action):
            return action

    seen, episodes = [], []
    env = make_env("CartPole-v1")
    stage = TransitionStager(transition_fields(env), 1000)
    runner = EnvRunner([env], Push(), stage, 7, SectionProfiler(), lambda steps, ret: episodes.append((steps, ret)))
    runner.reset([0])
    t = 0
    while not episodes:
        runner.step(100 + t)
        t += 1
    batch = stage.batch()
    assert seen == list(range(100, 100 + t))  # act sees the caller's env step count
    assert episodes == [(100 + t, float(t))]  # counted with the ending step; CartPole pays 1 per step
    assert len(batch["reward"]) == t and batch["actor"].tolist() == [7] * t and batch["done"][-1]
    assert (batch["obs"][1:] == batch["next_obs"][:-1]).all() and runner.episode_returns.tolist() == [0.0]
    env.close()


def test_run_seeds_are_positional_and_distinct():
    seeds, again = RunSeeds(3), RunSeeds(3)
    assert seeds.networks == again.networks != RunSeeds(4).networks
    assert seeds.actor(1).env == again.actor(1).env  # no dependence on how many siblings were asked for
    streams = [seeds.buffer, seeds.actor(0).explore, seeds.actor(0).buffer, seeds.actor(1).explore, seeds.learner(0),
               seeds.learner(1)]
    draws = {int(np.random.default_rng(s).integers(2**62)) for s in streams}
    assert len(draws) == len(streams)
    assert seeds.actor(0).env != seeds.actor(1).env


def test_update_target_hard_and_soft():
    import torch

    from replaybench.impl.rl.algorithms.nets import mlp, params_digest, update_target

    torch.manual_seed(0)
    online, target = mlp([3, 4, 2]), mlp([3, 4, 2])
    before = [p.detach().clone() for p in target.parameters()]
    update_target(target, online, 0.25)
    for t, b, o in zip(target.parameters(), before, online.parameters()):
        assert torch.allclose(t, 0.75 * b + 0.25 * o)
    update_target(target, online, 1.0)
    assert params_digest(target) == params_digest(online)


def test_uniform_takes_and_ignores_the_per_arguments():
    from replaybench.impl import registry

    buf = registry.create("uniform", capacity=8, fields={"x": ((), "int64")}, seed=0, alpha=0.6, beta=0.4, eps=1e-6)
    buf.add({"x": np.arange(4)})
    assert len(buf) == 4


def test_algo_config_overrides_are_checked_and_typed():
    from replaybench.impl.rl.algorithms.dqn import DQNConfig
    from replaybench.impl.rl.algorithms.td3 import TD3Config

    cfg = DQNConfig.for_env("CartPole-v1", hidden=64, lr=1, learning_starts=2e3, max_grad_norm=None)
    assert cfg.hidden == (64,) and cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.learning_starts == 2000 and isinstance(cfg.learning_starts, int) and cfg.max_grad_norm is None
    assert cfg.target_update_every == 1  # the rest is CartPole's preset
    assert TD3Config.for_env("Pendulum-v1", hidden=[32, 32]).hidden == (32, 32)
    for bad, field in ((dict(lr="abc"), "lr"), (dict(nope=1), "nope"), (dict(batch_size=1.5), "batch_size"),
                       (dict(double_q=1), "double_q"), (dict(tau=0.0), "tau"), (dict(lr=float("nan")), "lr"),
                       (dict(hidden=(64, 0)), "hidden"), (dict(learning_starts=10), "learning_starts")):
        with pytest.raises(ConfigError) as info:
            DQNConfig.for_env("CartPole-v1", **bad)
        assert info.value.field == field and field in str(info.value)


@pytest.fixture
def no_workers(monkeypatch):
    """Process.start and the training loops refuse to run; returns what tried."""
    import multiprocessing.process

    from replaybench.impl import rl

    tried = []

    def refuse(what):
        def call(*args, **kwargs):
            tried.append(what)
            raise AssertionError(f"{what} called")
        return call

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse("Process.start"))
    monkeypatch.setattr(rl, "train", refuse("train"))
    return tried


BAD_TRAIN_ARGS = [
    (["--steps", "0"], "--steps", "0"),
    (["--insert-batch", "0"], "--insert-batch", "0"),
    (["--envs-per-actor", "0"], "--envs-per-actor", "0"),
    (["--actors", "-1"], "--actors", "-1"),
    (["--timeout", "-1"], "--timeout", "-1"),
    (["--set", "lr=abc"], "--set", "'abc'"),
    (["--set", "hiden=64"], "--set", "'hiden'"),
    (["--env", "NoSuchEnv-v0"], "--env", "'NoSuchEnv-v0'"),
    (["--algo", "td3", "--env", "CartPole-v1"], "--env", "'CartPole-v1'"),
    (["--algo", "dqn", "--env", "Pendulum-v1"], "--env", "'Pendulum-v1'"),
    (["--algo", "ppo"], "--algo", "'ppo'"),
    (["--policy", "no-such-policy"], "--policy", "'no-such-policy'"),
    (["--run-id", "../escaped"], "--run-id", "'../escaped'"),
    # the variant's own checks, made before any process (issue 28 item 6)
    (["--param", "K=abc"], "--param", "{'K': 'abc'}"),
    (["--param", "K=3"], "--param", "{'K': 3}"),
    (["--param", "K=3", "--sequential"], "--param", "{'K': 3}"),
    (["--param", "alpha=-1"], "--param", "{'alpha': -1}"),
    (["--param", "nope=1"], "--param", "{'nope': 1}"),
    (["--buffer", "kary-prefix", "--policy", "pal-locks"], "--policy", "'pal-locks'"),
    (["--buffer", "uniform"], "--buffer", "'uniform'"),  # no tree to share between processes
    (["--algo", "a2c", "--checkpoint-every", "100"], "--checkpoint-every", "100"),
    (["--algo", "a2c", "--resume", "no-such.ckpt"], "--resume", "'no-such.ckpt'"),
    (["--checkpoint", "run.ckpt"], "--checkpoint", "'run.ckpt'"),
]


@pytest.mark.parametrize("args,option,value", BAD_TRAIN_ARGS, ids=[" ".join(a) for a, _, _ in BAD_TRAIN_ARGS])
def test_train_command_refuses_bad_arguments_up_front(args, option, value, no_workers, tmp_path, capsys):
    from replaybench.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", *args, "--out", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert f"argument {option}: " in err and value in err, err
    assert no_workers == [] and list(tmp_path.iterdir()) == []  # nothing started, nothing written


@pytest.mark.parametrize("cell,field", [(dict(algo="td3", env="CartPole-v1"), "env"), (dict(steps=0), "steps"),
                                        (dict(overrides={"lr": "abc"}), "lr"), (dict(timeout_s=-1.0), "timeout_s"),
                                        (dict(buffer="nope"), "buffer"), (dict(fail="actor:x:3"), "fail"),
                                        (dict(policy="nope"), "policy"),
                                        (dict(buffer_params={"K": 3}), "buffer_params"),
                                        (dict(buffer="kary-prefix", policy="deferred"), "policy")])
def test_bad_config_is_refused_before_any_worker_starts(cell, field, no_workers):
    """The suite's cells go through TrainConfig.validate too (both loops call it first)."""
    cfg = tiny("dqn", actors=2, learners=1)
    for key, value in cell.items():
        setattr(cfg, key, value)
    with pytest.raises(ConfigError) as info:
        train(cfg)
    assert info.value.field == field and no_workers == []


def test_learners_with_the_same_seed_start_identical():
    import gymnasium as gym

    from replaybench.impl.rl.algorithms.dqn import DQNConfig, DQNLearner

    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    a, b = (DQNLearner(spaces, DQNConfig(hidden=(8,)), seed=5) for _ in range(2))
    assert a.digest() == b.digest()


# ---------------------------------------------------------------------------------------- bench
def test_training_quick_suite_rows(tmp_path):
    """The training scenario writes the columns the analysis reads, speedup included."""
    from replaybench.bench import driver, suites

    suite = suites.load("training-quick")
    printed = []
    run_dir = driver.run(suite, out=tmp_path, progress=False, echo=printed.append)
    rows = results.read_rows(run_dir)
    meta = results.read_meta(run_dir)
    # `replaybench summary` of the stored run prints what the run printed when it ended: the run
    # line, then the training table (no pyperf line: pyperf did not time it)
    stored = driver.summarize_run(run_dir)
    assert stored == printed[0] and printed[1] == f"\nResults: {run_dir}"
    assert stored.splitlines()[0].startswith(f"Run {meta['run_id']}: complete") and "pyperf" not in stored
    assert "replay/alone" in stored.splitlines()[1] and "process" in stored
    assert meta["complete"] and meta["scenario"] == "training"
    assert {r["status"] for r in rows} <= {"ok", "skipped"}
    assert {r["scenario"] for r in rows} == {"training"} and {r["engine"] for r in rows} == {"sequential", "process"}
    layouts = {(r["actors"], r["learners"]) for r in rows}
    assert layouts == {(0, 0), (2, 1)}
    summary = {(r["actors"], r["metric"]): r for r in rows if r["op"] == "summary"}
    for metric in ("env_steps_per_s", "updates_per_s", "sample_latency_s", "time_to_threshold_s", "actor_wait_s",
                   "learner_wait_s", "speedup"):
        assert (2, metric) in summary and (0, metric) in summary, metric
    assert summary[(2, "time_to_threshold_s")]["status"] == "skipped"
    assert f"threshold not reached in {suite['steps']} steps" in summary[(2, "time_to_threshold_s")]["error"]
    assert summary[(0, "speedup")]["value"] == 1.0 and summary[(2, "speedup")]["value"] > 0
    assert '"baseline": true' in summary[(0, "speedup")]["params"]
    assert summary[(2, "env_steps_per_s")]["policy"] == "lazy-writing" and summary[(0, "speedup")]["policy"] == "none"
    assert summary[(2, "env_steps_per_s")]["K"] == 16 and summary[(2, "env_steps_per_s")]["algo"] == "dqn"
    episodes = [r for r in rows if r["op"] == "episode"]
    assert episodes and all(r["metric"] == "return" and r["env_steps"] > 0 and r["wall_s"] >= 0 for r in episodes)
    profile = {(r["actors"], r["metric"]) for r in rows if r["op"] == "profile"}
    assert {(2, s) for s in ("env_step", "inference", "replay", "sgd", "wait", "other")} <= profile


def test_training_suites_sweep_envs_per_actor_each_with_its_own_baseline():
    """A suite's envs_per_actor list is a grid axis: every E gets the layouts, its own sequential
    baseline (the speedup key holds E) and its label; the throughput suite sweeps 1, 4, 16."""
    from replaybench.bench import suites
    from replaybench.bench.scenarios.training import _baseline_key, cells_for, suite_configs

    suite = {**suites.load("training-quick"), "envs_per_actor": [1, 4]}
    configs = suite_configs(suite)
    assert [(c.envs_per_actor, c.actors) for c in configs] == [(1, 0), (1, 2), (4, 0), (4, 2)]
    assert len({_baseline_key(c) for c in configs}) == 2
    assert [c.label for c in cells_for(configs)][2:] == ["kary-aligned sequential seed=0 E=4",
                                                        "kary-aligned/lazy-writing A=2 L=1 seed=0 E=4"]
    assert cells_for(configs)[2].columns["params"]["envs_per_actor"] == 4
    assert {c.envs_per_actor for c in suite_configs(suites.load("training-throughput"))} == {1, 4, 16}


def test_train_command_sequential(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "replaybench.bench", "train", "--sequential", "--steps", "300", "--buffer", "binary",
         "--set", "hidden=16,16", "--set", "batch_size=16", "--set", "learning_starts=100", "--out", str(tmp_path),
         "--run-id", "t", "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = results.read_rows(tmp_path / "t")
    summary = {r["metric"]: r for r in rows if r["op"] == "summary"}
    assert summary["env_steps_per_s"]["value"] > 0 and summary["env_steps_per_s"]["variant"] == "binary"
    assert summary["env_steps_per_s"]["actors"] == 0 and summary["env_steps_per_s"]["structure"] == "binary"
    assert "speedup" not in summary or summary["speedup"]["value"] == 1.0
    assert "steps/s" in proc.stdout  # the closing table


def test_train_command_rejects_unknown_buffer():
    proc = subprocess.run([sys.executable, "-m", "replaybench.bench", "train", "--buffer", "nope", "--steps", "10"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown variant 'nope'" in proc.stderr
