"""Peers' own trainers under the snapshot protocol (bench/peers/trainers.py, issue 56 item 5):
each peer's snapshots load into our evaluator, are taken in order with the last at the run's
end, are copies of the weights, and bad arguments fail by name before any training."""

from __future__ import annotations

import numpy as np
import pytest

from replaybench.bench.peers import trainers
from replaybench.impl.rl.common.snapshots import evaluate

pytest.importorskip("stable_baselines3")
pytest.importorskip("tianshou")


def _check_run(run, name: str, every: int, env_id: str, exact: bool) -> None:
    assert run.name == name and run.snapshots
    updates = [s.updates for s in run.snapshots]
    assert updates == sorted(set(updates)), updates  # strictly increasing
    assert np.all(np.diff([s.env_steps for s in run.snapshots]) >= 0)
    assert np.all(np.diff([s.wall_s for s in run.snapshots]) >= 0)
    # every snapshot but the last at (Tianshou) or just past (SB3's bursts) a multiple of snapshot_every
    for k, u in enumerate(updates[:-1], start=1):
        assert (u == k * every) if exact else (u >= k * every)
    final = run.snapshots[-1]
    assert (final.updates, final.env_steps) == (run.updates, run.env_steps)
    assert 0 < final.wall_s <= run.wall_s
    for snap in (run.snapshots[0], final):
        returns = evaluate(snap.policy, env_id, 20)
        assert returns.shape == (20,) and np.isfinite(returns).all()


@pytest.mark.parametrize("name, steps, every, exact", [("tianshou", 1000, 10, True), ("sb3", 1300, 100, False)])
def test_cartpole_snapshots_load_into_our_evaluator(name, steps, every, exact):
    run = trainers.train_peer(name, "dqn", "CartPole-v1", 0, steps, every)
    assert run.env_steps >= steps and run.updates > every
    assert run.hyper["buffer"] == "own" and run.hyper["lr"] == trainers.SETTINGS[(name, "dqn", "CartPole-v1")][
        "hyper"]["lr"]
    _check_run(run, name, every, "CartPole-v1", exact)
    # each snapshot holds its own copy: the first and last weights differ after training
    first, last = run.snapshots[0].policy._state, run.snapshots[-1].policy._state
    assert any(not np.array_equal(first[k].numpy(), last[k].numpy()) for k in first)


@pytest.mark.parametrize("name", trainers.PEER_TRAINERS)
def test_our_buffer_inside_each_peer(name):
    run = trainers.train_peer(name, "dqn", "CartPole-v1", 1, 1100, 40, buffer="kary-aligned")
    assert run.hyper["buffer"] == "kary-aligned"
    _check_run(run, name, 40, "CartPole-v1", name == "tianshou")


def test_td3_pendulum_snapshots():
    run = trainers.train_peer("tianshou", "td3", "Pendulum-v1", 0, 160, 5)
    _check_run(run, "tianshou", 5, "Pendulum-v1", True)
    actions = run.snapshots[-1].policy(np.zeros((3, 3), np.float32))
    assert actions.shape == (3, 1) and np.all(np.abs(actions) <= 2.0)
    # SB3's zoo settings learn from step 10,000 on: a short run has only the final snapshot
    run = trainers.train_peer("sb3", "td3", "Pendulum-v1", 0, 200, 5)
    assert [s.updates for s in run.snapshots] == [0] and run.env_steps == 200
    assert np.isfinite(evaluate(run.snapshots[0].policy, "Pendulum-v1", 20)).all()


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "rllib"}, "name: unknown peer 'rllib'"),
    ({"algo": "ppo"}, "algo: 'ppo' is not supported"),
    ({"env_id": "MountainCar-v0"}, "env_id: 'MountainCar-v0'"),
    ({"algo": "td3"}, "env_id: 'CartPole-v1' has no published td3"),
    ({"snapshot_every": 0}, "snapshot_every must be a positive integer"),
    ({"snapshot_every": 2.5}, "snapshot_every must be a positive integer"),
    ({"steps": -1}, "steps must be a positive integer"),
    ({"seed": -3}, "seed must be a non-negative integer"),
    ({"timeout_s": 0}, "timeout_s must be a positive number"),
    ({"buffer": "no-such-buffer"}, "buffer: 'no-such-buffer' is neither None"),
    ({"name": "sb3", "algo": "td3", "env_id": "Pendulum-v1", "buffer": "kary-aligned"}, "buffer: SB3's TD3 takes"),
])
def test_bad_arguments_fail_by_name_before_training(monkeypatch, kwargs, message):
    def no_training(*args, **kw):
        raise AssertionError("training started")

    monkeypatch.setattr(trainers, "_train_tianshou", no_training)
    monkeypatch.setattr(trainers, "_train_sb3", no_training)
    args = {"name": "tianshou", "algo": "dqn", "env_id": "CartPole-v1", "seed": 0, "steps": 100,
            "snapshot_every": 10, **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        trainers.train_peer(**args)


def test_missing_framework_raises_import_error(monkeypatch):
    from replaybench.bench.scenarios import frameworks

    monkeypatch.setattr(frameworks, "missing_framework", lambda fw: f"{fw} is not installed: pip install x")
    with pytest.raises(ImportError, match="peer 'sb3': sb3 is not installed"):
        trainers.train_peer("sb3", "dqn", "CartPole-v1", 0, 100, 10)


@pytest.mark.parametrize("name", trainers.PEER_TRAINERS)
def test_timeout_names_the_peer(name):
    with pytest.raises(TimeoutError, match=f"peer '{name}': past timeout_s"):
        trainers.train_peer(name, "dqn", "CartPole-v1", 0, 5000, 10, timeout_s=1e-9)


def test_cartpole_settings_are_the_frameworks_suites():
    """The CartPole entries and the frameworks suite's per_framework settings (the scenario that
    times the same frameworks' loops) do not drift apart."""
    from replaybench.bench import suites

    per = suites.load("frameworks-sb3-tianshou")["per_framework"]
    for name in trainers.PEER_TRAINERS:
        mine = trainers.SETTINGS[(name, "dqn", "CartPole-v1")]["hyper"]
        # Tianshou's epsilon is its test's absolute schedule here, a fraction of 100k there
        shared = set(per[name]["hyper"]) & set(mine) - {"eps_fraction"}
        assert {k: mine[k] for k in shared} == {k: per[name]["hyper"][k] for k in shared}
        assert shared >= {"hidden", "lr", "gamma", "batch_size", "buffer_size", "train_freq", "target_update"}


@pytest.mark.parametrize("env_id, decay_steps", [("CartPole-v1", 0.16 * 50_000), ("Acrobot-v1", 0.12 * 100_000)])
@pytest.mark.parametrize("steps", [20_000, 60_000, 150_000])
def test_sb3_epsilon_reaches_its_floor_at_the_zoos_env_step_whatever_the_budget(monkeypatch, env_id, decay_steps,
                                                                                  steps):
    """SB3 counts exploration_fraction against the steps given to learn(): the trainer rescales
    the zoo's fraction (of the zoo's n_timesteps) to the run's budget, so a 60k-step budget does
    not stretch CartPole's decay by a fifth, and the recorded settings stay the zoo's."""
    from replaybench.bench.scenarios import frameworks

    seen = {}

    class Built(Exception):
        pass

    def capture(env_id, buffer, seed, h, atari=False):
        seen.update(h)
        raise Built

    monkeypatch.setattr(frameworks, "sb3_dqn", capture)
    with pytest.raises(Built):
        trainers.train_peer("sb3", "dqn", env_id, 0, steps, 100)
    assert seen["eps_fraction"] * steps == pytest.approx(decay_steps)
    assert trainers.settings("sb3", "dqn", env_id)["hyper"]["eps_fraction"] in (0.16, 0.12)
