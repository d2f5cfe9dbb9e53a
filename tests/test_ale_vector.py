"""ALE's C++ vector env as a PAAC stepping backend (impl.rl.common.ale_vector) against a plain
loop over make_env's environments with the same seeds."""

from __future__ import annotations

import numpy as np
import pytest
from replaybench.impl.rl.common.atari import AtariOptions
from replaybench.impl.rl.common.errors import ConfigError

pytest.importorskip("ale_py", reason="the atari extra is not installed")
from replaybench.impl.rl.common.ale_vector import AleVectorEnv  # noqa: E402
from replaybench.impl.rl.common.envs import make_env  # noqa: E402

ENV = "ALE/Pong-v5"


def plain_loop(opts: AtariOptions, n_envs: int, seed: int, actions: np.ndarray):
    """What SharedVectorEnv's contract says: env i reset with seed + i, reset unseeded when an
    episode ends (its final observation kept), returns summed per episode."""
    envs = [make_env(ENV, atari=opts) for _ in range(n_envs)]
    try:
        obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
        out, ret, length, episodes = [obs.copy()], np.zeros(n_envs), np.zeros(n_envs, int), []
        for t, acts in enumerate(actions):
            step = [env.step(int(a)) for env, a in zip(envs, acts)]
            rewards = np.array([s[1] for s in step])
            term = np.array([s[2] for s in step])
            trunc = np.array([s[3] for s in step])
            final = np.zeros_like(obs)
            ret += rewards
            length += 1
            for i, s in enumerate(step):
                obs[i] = s[0]
                if term[i] or trunc[i]:
                    final[i] = s[0]
                    episodes.append((i, float(ret[i]), int(length[i])))
                    ret[i], length[i] = 0.0, 0
                    obs[i] = envs[i].reset()[0]
            out.append((obs.copy(), rewards, term, trunc, final))
        return out, episodes
    finally:
        for env in envs:
            env.close()


@pytest.mark.parametrize("reset_stack", ["repeat", "zeros"])
def test_same_transitions_as_a_plain_loop_without_noop_starts(reset_stack):
    # 400 frames = 100 steps per episode: two truncations and autoresets per env within 230 steps
    opts = AtariOptions(reset_stack=reset_stack, noop_max=0, max_frames=400)
    n_envs, seed = 2, 3
    actions = np.random.default_rng(0).integers(0, 6, size=(230, n_envs))
    expect, expect_episodes = plain_loop(opts, n_envs, seed, actions)
    with AleVectorEnv(ENV, n_envs, 1, seed=seed, atari=opts) as venv:
        obs = venv.reset()
        assert obs.shape == (n_envs, 4, 84, 84) and obs.dtype == np.uint8
        assert np.array_equal(obs, expect[0])
        truncations = 0
        for t, acts in enumerate(actions):
            obs, rewards, term, trunc = venv.step(acts)
            e_obs, e_rewards, e_term, e_trunc, e_final = expect[t + 1]
            assert rewards.dtype == np.float64 and term.dtype == bool and trunc.dtype == bool
            assert np.array_equal(rewards, e_rewards), t
            assert np.array_equal(term, e_term) and np.array_equal(trunc, e_trunc), t
            assert np.array_equal(obs, e_obs), t
            ended = term | trunc
            assert np.array_equal(venv.final_obs[ended], e_final[ended]), t
            truncations += int(trunc.sum())
        assert truncations == 4
        assert venv.pop_episodes() == expect_episodes and venv.pop_episodes() == []


def test_noop_starts_are_drawn_by_ale_from_the_seed():
    """With noop_max > 0 the starts are drawn by ALE's C++ generator: still reproducible from the
    seed, different across seeds (what is documented; the plain loop draws differently)."""
    opts = AtariOptions(reset_stack="zeros")
    actions = np.random.default_rng(1).integers(0, 6, size=(10, 2))

    def frames(seed):
        with AleVectorEnv(ENV, 2, 2, seed=seed, atari=opts) as venv:
            out = [venv.reset().copy()]
            out += [venv.step(a)[0].copy() for a in actions]
        return np.stack(out)

    a, b = frames(0), frames(0)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, frames(1))


def test_what_ale_vector_cannot_do_is_refused_naming_the_field():
    for opts, field in ((AtariOptions(resize="nearest"), "resize"), (AtariOptions(reset_stack="noop"), "reset_stack")):
        with pytest.raises(ConfigError) as err:
            AleVectorEnv(ENV, 2, 1, seed=0, atari=opts)
        assert err.value.field == field
    for args, field in ((("CartPole-v1", 2, 1), "env"), ((ENV, 0, 1), "n_envs"), ((ENV, 2, 0), "n_threads")):
        with pytest.raises(ConfigError) as err:
            AleVectorEnv(*args, seed=0, atari=AtariOptions())
        assert err.value.field == field
    with AleVectorEnv(ENV, 2, 1, seed=0) as venv:
        with pytest.raises(RuntimeError, match="reset"):
            venv.step(np.zeros(2, np.int64))
        venv.reset()
        with pytest.raises(ValueError, match="shape"):
            venv.step(np.zeros(3, np.int64))


def test_paac_runs_on_ale_vector_and_checks_its_options():
    from replaybench.impl.rl import TrainConfig, train

    base = dict(n_envs=4, n_workers=1, t_max=5, stepping="ale-vector", resize="area", reset_stack="repeat")
    result = train(TrainConfig(algo="a2c", env=ENV, steps=40, overrides=base))
    assert result.env_steps == 40 and result.updates == 2 and result.worker_pids == []
    assert "stepping" not in result.profiles  # no stepping processes: the threads are inside env_step
    for bad, field in (({"resize": "nearest"}, "resize"), ({"reset_stack": "noop"}, "reset_stack"),
                       ({"halves": True}, "halves"), ({"stepping": "envpool"}, "stepping")):
        with pytest.raises(ConfigError) as err:
            train(TrainConfig(algo="a2c", env=ENV, steps=40, overrides={**base, **bad}))
        assert err.value.field == field
    with pytest.raises(ConfigError) as err:
        train(TrainConfig(algo="a2c", env="CartPole-v1", steps=40, overrides={"stepping": "ale-vector"}))
    assert err.value.field == "env"
