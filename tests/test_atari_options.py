"""The Atari preprocessing choices (impl.rl.common.atari) on hand-made frame sequences, and
through make_env on Pong."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from replaybench.impl.rl.algorithms.a2c import PONG_PAPER_SETTINGS, A2CConfig
from replaybench.impl.rl.common.atari import AtariOptions, nearest_indices, resize_and_stack
from replaybench.impl.rl.common.errors import ConfigError


class FrameCounter(gym.Env):
    """Frames of ``shape`` whose every pixel is the number of steps since the reset (0 at the
    reset); reward 1 per step; the episode terminates after ``length`` steps."""

    def __init__(self, shape=(84, 84), length=100):
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.shape, self.length, self.t, self.actions = shape, length, 0, []

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(self.shape, np.uint8), {}

    def step(self, action):
        self.actions.append(int(action))
        self.t += 1
        return np.full(self.shape, self.t, np.uint8), 1.0, self.t >= self.length, False, {}


def firsts(obs):
    return [int(frame[0, 0]) for frame in obs]


@pytest.mark.parametrize("reset_stack, after_reset, after_step", [
    ("repeat", [0, 0, 0, 0], [0, 0, 0, 1]),   # gymnasium: the reset frame fills the stack
    ("zeros", [0, 0, 0, 0], [0, 0, 0, 1]),    # a zero frame pads: same values here, told apart below
    ("noop", [1, 2, 3, 4], [2, 3, 4, 5]),     # the authors: 4 no-op steps, 4 real frames
])
def test_reset_stack_fills_the_stack_as_named(reset_stack, after_reset, after_step):
    env = resize_and_stack(FrameCounter(), AtariOptions(reset_stack=reset_stack), 4)
    obs, _ = env.reset()
    assert firsts(obs) == after_reset
    obs, reward, *_ = env.step(1)
    assert firsts(obs) == after_step and reward == 1.0
    if reset_stack == "noop":
        assert env.unwrapped.actions == [0, 0, 0, 0, 1]  # the no-ops are action 0


def test_zeros_and_repeat_differ_when_the_reset_frame_is_not_black():
    class Lit(FrameCounter):
        def reset(self, *, seed=None, options=None):
            self.t = 0
            return np.full(self.shape, 200, np.uint8), {}

    repeat = resize_and_stack(Lit(), AtariOptions(reset_stack="repeat"), 4).reset()[0]
    zeros = resize_and_stack(Lit(), AtariOptions(reset_stack="zeros"), 4).reset()[0]
    assert firsts(repeat) == [200, 200, 200, 200] and firsts(zeros) == [0, 0, 0, 200]


def test_noop_reset_refuses_an_episode_that_ends_in_the_noops():
    env = resize_and_stack(FrameCounter(length=3), AtariOptions(reset_stack="noop"), 4)
    with pytest.raises(RuntimeError, match="no-op steps"):
        env.reset()


def test_nearest_resize_takes_the_pixel_under_each_target_centre():
    # 210 -> 84: floor((2i + 1) * 210 / 168) = 1, 3, 6, 8, 11 ...; 160 -> 84: 0, 2, 4, 6, 8, 10 ...
    assert nearest_indices(210, 84)[:5].tolist() == [1, 3, 6, 8, 11]
    assert nearest_indices(160, 84)[:6].tolist() == [0, 2, 4, 6, 8, 10]
    assert nearest_indices(210, 84)[-1] == 208 and nearest_indices(160, 84)[-1] == 159
    # exact ties (52.5 * 160 / 84 = 100): PIL's accumulated double rounding falls one pixel lower
    assert nearest_indices(160, 84)[[52, 73]].tolist() == [99, 139]

    class Screen(FrameCounter):  # pixel (r, c) = r on even columns, 255 - r on odd ones
        def reset(self, *, seed=None, options=None):
            r = np.arange(210)[:, None]
            c = np.arange(160)[None, :]
            return np.where(c % 2 == 0, r, 255 - r).astype(np.uint8), {}

    near = resize_and_stack(Screen((210, 160)), AtariOptions(resize="nearest"), 4)
    frame = near.reset()[0][-1]
    assert frame.shape == (84, 84) and near.observation_space.shape == (4, 84, 84)
    rows, cols = nearest_indices(210, 84), nearest_indices(160, 84)
    expect = np.where(cols[None, :] % 2 == 0, rows[:, None], 255 - rows[:, None])
    assert np.array_equal(frame, expect)
    pil = pytest.importorskip("PIL.Image")  # the authors' imresize called PIL's NEAREST
    screen = Screen((210, 160)).reset()[0]
    assert np.array_equal(frame, np.asarray(pil.fromarray(screen).resize((84, 84), pil.NEAREST)))


def test_area_and_nearest_differ_on_stripes_through_make_env_chain():
    """Alternating 0/255 columns: INTER_AREA averages them (grey values), nearest keeps 0 or 255."""
    import cv2

    stripes = np.tile(np.array([0, 255], np.uint8), (210, 80))
    area = cv2.resize(stripes, (84, 84), interpolation=cv2.INTER_AREA)
    near = stripes[nearest_indices(210, 84)[:, None], nearest_indices(160, 84)[None, :]]
    assert set(np.unique(near)) <= {0, 255} and len(set(np.unique(area)) - {0, 255}) > 0


def test_bad_options_raise_naming_the_field():
    for kwargs, field in (({"resize": "bilinear"}, "resize"), ({"reset_stack": "none"}, "reset_stack"),
                          ({"noop_max": -1}, "noop_max"), ({"max_frames": 0}, "max_frames")):
        with pytest.raises(ConfigError) as err:
            AtariOptions(**kwargs).validate()
        assert err.value.field == field
    for kwargs in ({"resize": "bilinear"}, {"reset_stack": "none"}):  # A2C's fields, checked by the config
        with pytest.raises(ConfigError) as err:
            A2CConfig.for_env("ALE/Pong-v5", **kwargs)
        assert err.value.field == next(iter(kwargs))


def test_the_pong_preset_is_the_fast_one_and_the_paper_settings_take_the_authors_preprocessing():
    fast = A2CConfig.for_env("ALE/Pong-v5")
    assert (fast.stepping, fast.channels_last, fast.resize, fast.reset_stack) == ("ale-vector", True, "area", "repeat")
    acfg = A2CConfig.for_env("ALE/Pong-v5", **PONG_PAPER_SETTINGS)
    assert (acfg.stepping, acfg.resize, acfg.reset_stack) == ("shared", "nearest", "noop")
    assert (acfg.lr, acfg.entropy, acfg.reward_clip) == (fast.lr, fast.entropy, fast.reward_clip)  # the same learning
    assert AtariOptions() == AtariOptions(resize="area", reset_stack="repeat")  # make_env's default unchanged


def test_make_env_pong_with_the_authors_options():
    pytest.importorskip("ale_py", reason="the atari extra is not installed")
    from replaybench.impl.rl.common.envs import make_env

    env = make_env("ALE/Pong-v5", atari=AtariOptions(resize="nearest", reset_stack="noop", noop_max=0))
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        screen = env.unwrapped.ale.getScreenGrayscale()  # the last frame (Pong's start screen is still)
        near = screen[nearest_indices(210, 84)[:, None], nearest_indices(160, 84)[None, :]]
        assert np.array_equal(obs[-1], near)
    finally:
        env.close()


def test_the_training_pong_suite_runs_the_paper_settings():
    from replaybench.bench import suites
    assert suites.load("training-pong")["overrides"] == PONG_PAPER_SETTINGS
