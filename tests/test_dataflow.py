"""impl.dataflow: the parallel Q-learning topology, its replays and the policy bank.

The topology is checked for what it computes (rounds, updates, weights that move, every
transition from its env) and for its exit paths: a learner killed mid-run and a server
interrupted mid-run both end with no child process left. The run with worker processes is
slow (several process start-ups), so it and the exit-path tests are marked slow; the
in-process run (``workers=0``) covers the learner process and the ports in the default run.
"""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
import torch

from replaybench.impl.dataflow import DequeReplay, PolicyBank, PQLConfig, QLearner, make_replay, run_pql
from replaybench.impl.dataflow.qlearning import transition_fields
from replaybench.impl.rl import ConfigError

TINY = dict(actors=2, steps_per_round=10, rounds=3, batch_size=16, replay_capacity=64, workers=0)


@pytest.mark.parametrize("field, value", [("replay", "lifo"), ("actors", 0), ("workers", 3), ("batch_size", 65),
                                          ("lr", 0.0), ("epsilon", 1.5), ("rounds", True)])
def test_config_refuses_bad_fields_by_name(field, value):
    with pytest.raises(ConfigError) as err:
        PQLConfig(**{**TINY, field: value}).validate()
    assert err.value.field == field and repr(value) in str(err.value)


def test_deque_replay_keeps_the_newest_rows_and_samples_only_them():
    fields = transition_fields(3)
    replay = DequeReplay(5, fields, seed=0)
    for start in (0, 4):  # rows 0..3, then 4..7: the first three are evicted
        n = 4
        replay.add({"obs": np.arange(start, start + n, dtype=np.float32)[:, None].repeat(3, 1),
                    "action": np.arange(start, start + n), "reward": np.zeros(n, np.float32),
                    "next_obs": np.zeros((n, 3), np.float32), "done": np.zeros(n, bool)})
    assert len(replay) == 5
    out = replay.sample(200)
    assert out["obs"].shape == (200, 3) and out["obs"].dtype == np.float32 and out["action"].dtype == np.int64
    assert set(out["action"].tolist()) == {3, 4, 5, 6, 7}
    assert np.array_equal(out["obs"][:, 0], out["action"].astype(np.float32))  # rows stay whole


def test_prioritized_replay_round_trips_priorities():
    replay = make_replay("prioritized", 64, transition_fields(2), seed=0)
    assert replay.prioritized and not DequeReplay.prioritized
    replay.add({"obs": np.zeros((8, 2), np.float32), "action": np.arange(8), "reward": np.zeros(8, np.float32),
                "next_obs": np.zeros((8, 2), np.float32), "done": np.zeros(8, bool)})
    out = replay.sample(4)
    assert {"indices", "weights"} <= set(out)
    replay.update_priorities(out["indices"], np.full(4, 5.0))
    with pytest.raises(ValueError, match="replay"):
        make_replay("lifo", 8, transition_fields(2))


def test_learner_update_reduces_the_td_error_on_a_fixed_batch():
    cfg = PQLConfig(**TINY, lr=0.01)
    learner = QLearner(4, 2, cfg, seed=0)
    rng = np.random.default_rng(0)
    batch = {"obs": rng.normal(size=(64, 4)).astype(np.float32), "action": rng.integers(2, size=64),
             "reward": rng.normal(size=64).astype(np.float32), "next_obs": rng.normal(size=(64, 4)).astype(np.float32),
             "done": np.ones(64, bool)}  # done: the target is the reward, so the error can only fall
    first = learner.update(batch).mean()
    for _ in range(50):
        last = learner.update(batch).mean()
    assert last < 0.7 * first


def test_policy_bank_equals_each_agents_own_network():
    bank = PolicyBank(5, 7, 4, hidden=16, seed=3)
    obs = np.random.default_rng(0).normal(size=(5, 7)).astype(np.float32)
    with torch.no_grad():
        one_by_one = [int(bank.module(i)(torch.from_numpy(obs[i])[None]).argmax()) for i in range(5)]
    assert bank.act(obs).tolist() == one_by_one
    with pytest.raises(ValueError, match="n_agents"):
        PolicyBank(0, 7, 4)


def test_in_process_topology_runs_every_round_and_moves_the_weights():
    cfg = PQLConfig(**TINY)
    res = run_pql(cfg)
    assert res.rounds == 3 and res.env_steps == 2 * 10 * 3
    assert res.updates == 3  # every round's 20 rows already fill a mini-batch of 16
    initial = QLearner(45, 2, cfg, seed=cfg.seed).flat_weights()  # Blackjack's flattened tuple: 32 + 11 + 2
    assert res.weights.shape == initial.shape and not np.array_equal(res.weights, initial)
    assert res.returns and all(r in (-1.0, 0.0, 1.0, 1.5) for r in res.returns)
    assert not mp.active_children()


@pytest.mark.slow
def test_worker_processes_give_the_same_run_as_in_process():
    a = run_pql(PQLConfig(**{**TINY, "workers": 0}))
    b = run_pql(PQLConfig(**{**TINY, "workers": 2}))
    assert np.array_equal(a.weights, b.weights) and a.returns == b.returns
    assert not mp.active_children()


@pytest.mark.slow
def test_a_killed_learner_ends_the_run_with_its_exit_code_and_no_process_left():
    def kill_learner(r):
        for child in mp.active_children():
            if child.name == "pql-learner":
                child.kill()

    with pytest.raises(RuntimeError, match="learner process failed"):
        run_pql(PQLConfig(**{**TINY, "workers": 1, "rounds": 50}), progress=kill_learner)
    assert not mp.active_children()


@pytest.mark.slow
def test_an_interrupted_server_leaves_no_process():
    def interrupt(r):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_pql(PQLConfig(**{**TINY, "workers": 2}), progress=interrupt)
    assert not mp.active_children()
