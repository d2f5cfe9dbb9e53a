"""A2C: the returns and the loss against a two-step example computed by hand, the gradients
it gives, the sampler, the networks and the config."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from replaybench.impl.rl import ConfigError
from replaybench.impl.rl.algorithms.a2c import A2CConfig, A2CLearner, Rollout, make_network, n_step_returns
from replaybench.impl.rl.algorithms.optim import TFRMSprop

GAMMA = 0.9
VECTOR = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
TWO_ACTIONS = gym.spaces.Discrete(2)


def test_n_step_returns_by_hand():
    # env 0 runs on; env 1 terminates at t=0; env 2 hits a time limit at t=0 (value of its last obs: 10)
    rewards = [[1.0, 3.0, 5.0], [2.0, 4.0, 6.0]]
    terminated = [[False, True, False], [False, False, False]]
    truncated = [[False, False, True], [False, False, False]]
    truncation_values = [[0.0, 0.0, 10.0], [0.0, 0.0, 0.0]]
    got = n_step_returns(rewards, terminated, [0.5, 0.5, 0.5], GAMMA, truncated, truncation_values)
    # R_1 = r_1 + 0.9 * 0.5 ;  R_0 = r_0 + 0.9 * R_1 (env 0), r_0 (env 1), r_0 + 0.9 * 10 (env 2)
    want = [[1 + 0.9 * 2.45, 3.0, 5 + 9.0], [2.45, 4.45, 6.45]]
    assert np.allclose(got, want, rtol=0, atol=1e-12)
    assert np.allclose(n_step_returns(rewards, terminated, [0.5] * 3, GAMMA)[0], [3.205, 3.0, 5 + 0.9 * 6.45])


def _uniform_learner(**cfg) -> A2CLearner:
    """A learner whose network is all zeros except the value bias (0.5): pi = (1/2, 1/2), V = 0.5."""
    learner = A2CLearner(VECTOR, TWO_ACTIONS, A2CConfig(hidden=(1,), **cfg), seed=0)
    with torch.no_grad():
        for p in learner.net.parameters():
            p.zero_()
        learner.net.value.bias.fill_(0.5)
    return learner


def _two_step_rollout() -> Rollout:
    ro = Rollout.empty(2, 2, (1,), np.float32)
    ro.rewards[:] = [[1.0, 3.0], [2.0, 4.0]]
    ro.terminated[0, 1] = True
    ro.actions[:] = [[0, 1], [1, 1]]
    return ro


def test_loss_and_gradients_of_a_two_step_example_by_hand():
    learner = _uniform_learner(gamma=GAMMA, loss_scale=2.0, value_coef=0.25, entropy=0.1)
    parts = learner.losses(_two_step_rollout())
    # returns (t, env): R_10 = 2 + .9 * .5 = 2.45, R_00 = 1 + .9 * 2.45 = 3.205, R_01 = 3, R_11 = 4 + .45 = 4.45
    assert np.allclose(parts["returns"], [[3.205, 3.0], [2.45, 4.45]])
    # advantages R - 0.5 = 2.705, 2.5, 1.95, 3.95 (mean 2.77625); log pi = -ln 2 for every action
    mean_adv, mean_sq = 11.105 / 4, (2.705**2 + 2.5**2 + 1.95**2 + 3.95**2) / 4   # 8.24300625
    assert float(parts["policy_loss"]) == pytest.approx(math.log(2) * mean_adv, rel=1e-6)
    assert float(parts["entropy"]) == pytest.approx(math.log(2), rel=1e-6)
    assert float(parts["value_loss"]) == pytest.approx(mean_sq, rel=1e-6)
    want = 2.0 * (math.log(2) * mean_adv - 0.1 * math.log(2) + 0.25 * mean_sq)
    assert float(parts["loss"].detach()) == pytest.approx(want, rel=1e-6)

    parts["loss"].backward()
    # d loss / d value bias = 2 * 0.25 * mean(-2 (R - V)) = -mean_adv
    assert float(learner.net.value.bias.grad) == pytest.approx(-mean_adv, rel=1e-6)
    # d loss / d logit_0 bias = 2 * -mean((1[a=0] - 1/2) A) (the entropy's gradient is 0 at uniform):
    # (+.5 * 2.705 - .5 * 2.5 - .5 * 1.95 - .5 * 3.95) / 4 = -0.711875
    assert learner.net.policy.bias.grad.tolist() == pytest.approx([2 * 0.711875, -2 * 0.711875], rel=1e-6)


def test_update_clips_anneals_and_moves_the_weights():
    learner = _uniform_learner(gamma=GAMMA, lr=0.01, lr_anneal_steps=8, clip_norm=0.5)
    before = learner.digest()
    stats = learner.update(_two_step_rollout())
    assert stats["lr"] == 0.01 and stats["grad_norm"] > 0.5   # clipped from above 0.5
    assert learner.env_steps == 4 and learner.digest() != before
    assert learner.update(_two_step_rollout())["lr"] == pytest.approx(0.005)  # 4 of 8 annealing steps done
    assert learner.cfg.lr_at(8) == 0.0 and learner.cfg.lr_at(100) == 0.0


def test_tf_rmsprop_by_hand_and_against_torchs():
    # loss = p^2 at p = 1: g = 2. lr 0.1, alpha 0.9, eps 0.1; the mean square starts at 1.
    p = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = TFRMSprop([p], lr=0.1, alpha=0.9, eps=0.1)
    want, ms = 1.0, 1.0
    for _ in range(3):
        opt.zero_grad()
        (p**2).sum().backward()
        g = 2 * want
        ms = 0.9 * ms + 0.1 * g * g
        want -= 0.1 * g / math.sqrt(ms + 0.1)
        opt.step()
        assert float(p) == pytest.approx(want, rel=1e-12)
    assert float(p) == pytest.approx(0.5869, abs=1e-4)   # 1 - 0.1690 - 0.1337 - 0.1104
    # torch's RMSprop (ms from 0, eps outside the root) takes a 1.6x larger first step here
    q = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    torch_opt = torch.optim.RMSprop([q], lr=0.1, alpha=0.9, eps=0.1)
    (q**2).sum().backward()
    torch_opt.step()
    assert 1.0 - float(q) == pytest.approx(0.1 * 2 / (math.sqrt(0.4) + 0.1), rel=1e-12)
    for bad in (dict(lr=0.0), dict(lr=0.1, alpha=1.5), dict(lr=0.1, eps=-1.0)):
        with pytest.raises(ValueError, match=next(iter(bad.keys() - {"lr"}), "lr")):
            TFRMSprop([q], **bad)


def test_learner_uses_the_authors_rmsprop_unless_a_preset_says_torchs():
    assert isinstance(_uniform_learner().optimizer, TFRMSprop)
    assert isinstance(_uniform_learner(rmsprop_tf=False).optimizer, torch.optim.RMSprop)
    assert not A2CConfig.for_env("CartPole-v1").rmsprop_tf and A2CConfig.for_env("ALE/Pong-v5").rmsprop_tf


def test_act_samples_the_softmax_in_one_forward():
    learner = _uniform_learner()
    with torch.no_grad():
        learner.net.policy.bias.copy_(torch.tensor([0.0, math.log(3.0)]))  # P(a=1) = 0.75
    calls = []
    learner.net.register_forward_hook(lambda *_: calls.append(1))
    actions, values = learner.act(np.zeros((20_000, 1), np.float32))
    assert len(calls) == 1 and actions.dtype == np.int64 and values.shape == (20_000,)
    assert abs(actions.mean() - 0.75) < 4 * math.sqrt(0.75 * 0.25 / 20_000)
    again = _uniform_learner()  # same seed, same weights: the same draws
    again.net.load_state_dict(learner.net.state_dict())
    assert np.array_equal(again.act(np.zeros((20_000, 1), np.float32))[0], actions)


def test_networks_for_vectors_and_frames_and_spaces_they_refuse():
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    net = make_network(frames, gym.spaces.Discrete(6), A2CConfig())
    logits, values = net(torch.zeros((3, 4, 84, 84), dtype=torch.uint8))
    assert logits.shape == (3, 6) and values.shape == (3,)
    assert [type(m).__name__ for m in net.body][:4] == ["Conv2d", "ReLU", "Conv2d", "ReLU"]
    for obs, act in ((VECTOR, gym.spaces.Box(-1, 1, (1,))), (gym.spaces.Box(0, 1, (3, 3)), TWO_ACTIONS),
                     (gym.spaces.Box(0, 255, (4, 64, 64), np.uint8), TWO_ACTIONS)):
        with pytest.raises(ConfigError) as err:
            make_network(obs, act, A2CConfig())
        assert err.value.field == "env"


def test_config_presets_and_refusals():
    for env_id in A2CConfig.PRESETS:
        A2CConfig.for_env(env_id)
    cfg = A2CConfig.for_env("CartPole-v1", t_max=7, hidden=32)
    assert cfg.t_max == 7 and cfg.hidden == (32,) and cfg.batch_size == cfg.n_envs * 7
    for field, value in (("t_max", 0), ("n_envs", 0), ("gamma", 1.5), ("lr", 0.0), ("nonsense", 1)):
        with pytest.raises(ConfigError) as err:
            A2CConfig.for_env("CartPole-v1", **{field: value})
        assert err.value.field == field
    with pytest.raises(ConfigError) as err:
        A2CConfig.for_env("CartPole-v1", n_envs=2, n_workers=3)
    assert err.value.field == "n_workers"


@pytest.mark.parametrize("n_workers", [0, 2])
def test_collect_with_halves_gives_the_rollouts_of_one_batch(n_workers):
    from replaybench.impl.rl.algorithms.a2c import collect
    from replaybench.impl.rl.common.stepping import SharedVectorEnv

    rollouts = {}
    for halves in (False, True):
        cfg = A2CConfig.for_env("CartPole-v1", n_envs=6, t_max=4)
        with SharedVectorEnv("CartPole-v1", 6, n_workers if halves else 0, seed=5, halves=halves,
                             start_method="forkserver") as venv:
            learner = A2CLearner(venv.single_observation_space, venv.single_action_space, cfg, seed=2)
            obs, got = venv.reset(), []
            for _ in range(12):  # 48 steps per env: episode ends and their resets in the middle of rollouts
                ro, obs = collect(venv, learner, obs, cfg.t_max)
                got.append(ro)
            rollouts[halves] = got
    for plain, halved in zip(rollouts[False], rollouts[True]):
        for name in ("obs", "actions", "rewards", "terminated", "truncated", "next_obs"):
            assert np.array_equal(getattr(plain, name), getattr(halved, name)), name
    assert any(ro.terminated.any() for ro in rollouts[True])


def _frame_rollout(t_max=2, n_envs=3) -> Rollout:
    rng = np.random.default_rng(0)
    ro = Rollout.empty(t_max, n_envs, (4, 84, 84), np.uint8)
    ro.obs[:] = rng.integers(0, 256, ro.obs.shape)
    ro.next_obs[:] = rng.integers(0, 256, ro.next_obs.shape)
    ro.actions[:] = rng.integers(0, 6, ro.actions.shape)
    ro.rewards[:] = rng.normal(size=ro.rewards.shape)
    return ro


FRAMES = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


def test_channels_last_is_the_same_network_in_another_layout():
    plain = A2CLearner(FRAMES, gym.spaces.Discrete(6), A2CConfig(), seed=0)
    nhwc = A2CLearner(FRAMES, gym.spaces.Discrete(6), A2CConfig(channels_last=True), seed=0)
    conv = nhwc.net.body[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    assert plain.digest() == nhwc.digest()  # the same values, only their order in memory differs
    ro = _frame_rollout()
    a, b = plain.losses(ro), nhwc.losses(ro)
    assert torch.allclose(a["loss"], b["loss"], rtol=1e-5, atol=1e-6)
    plain.update(ro)
    nhwc.update(ro)
    for p, q in zip(plain.net.parameters(), nhwc.net.parameters()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6)
    with pytest.raises(ConfigError) as err:
        A2CConfig(channels_last=1).validate()
    assert err.value.field == "channels_last"


@pytest.mark.slow  # inductor compiles C++ for each batch shape: about a minute on 2 busy cores
def test_compiled_forward_matches_the_module():
    plain = A2CLearner(FRAMES, gym.spaces.Discrete(6), A2CConfig(), seed=0)
    compiled = A2CLearner(FRAMES, gym.spaces.Discrete(6), A2CConfig(compile=True), seed=0)
    ro = _frame_rollout()
    assert torch.allclose(plain.losses(ro)["loss"], compiled.losses(ro)["loss"], rtol=1e-4, atol=1e-5)
    compiled.update(ro)
    assert compiled.updates == 1 and compiled.forward is not compiled.net


def _random_rollout(rng, t_max, n_envs, obs_shape, dtype, n_actions) -> Rollout:
    ro = Rollout.empty(t_max, n_envs, obs_shape, dtype)
    ro.obs[...] = rng.integers(0, 256, ro.obs.shape) if dtype == np.uint8 else rng.random(ro.obs.shape)
    ro.next_obs[...] = rng.integers(0, 256, ro.next_obs.shape) if dtype == np.uint8 else rng.random(ro.next_obs.shape)
    ro.actions[...] = rng.integers(0, n_actions, ro.actions.shape)
    ro.rewards[...] = rng.normal(size=ro.rewards.shape)
    ro.terminated[...] = rng.random(ro.terminated.shape) < 0.2
    return ro


@pytest.mark.parametrize("frames", [False, True])
def test_warm_up_leaves_the_learner_bit_for_bit_as_it_was(frames):
    """A learner warmed up (an action draw and an update on zeros, its state put back) and one
    that was not, both of one seed, checkpoint-resumed mid-run: the same actions, values and
    update statistics, call for call, and the same weights after (the warm-up did run: it
    is the learner's own act and update)."""
    space, n_actions = (FRAMES, 6) if frames else (gym.spaces.Box(-1.0, 1.0, (4,), np.float32), 3)
    cfg = A2CConfig() if frames else A2CConfig(hidden=(16,))
    rng = np.random.default_rng(1)
    rollouts = [_random_rollout(rng, 5, 4, space.shape, space.dtype, n_actions) for _ in range(3)]
    learners = [A2CLearner(space, gym.spaces.Discrete(n_actions), cfg, seed=3) for _ in range(2)]
    for learner in learners:
        learner.update(rollouts[0])  # optimizer state and counters that the warm-up must put back
    warm = learners[1]
    act, update, calls = warm.act, warm.update, []
    warm.act = lambda obs: calls.append(("act", obs.shape)) or act(obs)
    warm.update = lambda ro: calls.append(("update", ro.obs.shape)) or update(ro)
    warm.warm_up(rollouts[0].next_obs, 5)
    assert calls == [("act", (4, *space.shape)), ("update", (5, 4, *space.shape))]
    del warm.act, warm.update
    assert warm.updates == learners[0].updates == 1 and warm.env_steps == learners[0].env_steps
    for ro in rollouts[1:]:
        a, b = (learner.act(ro.next_obs) for learner in learners)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        assert learners[0].update(ro) == learners[1].update(ro)
    assert learners[0].digest() == learners[1].digest()


def test_warm_up_acts_on_each_batch_size_a_run_with_halves_acts_on():
    learner = A2CLearner(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(3), A2CConfig(hidden=(8,)),
                         seed=0)
    act, sizes = learner.act, []
    learner.act = lambda obs: sizes.append(len(obs)) or act(obs)
    learner.warm_up(np.zeros((5, 4), np.float32), 3, act_sizes=[3, 2])
    assert sizes == [3, 2] and learner.updates == 0 and learner.env_steps == 0
