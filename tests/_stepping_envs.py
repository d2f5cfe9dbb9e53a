"""Tiny environments for the stepping tests (not a test module): made in worker processes
through gymnasium's ``"module:Id"`` form, e.g. ``make_env("_stepping_envs:FailAt-v0")``.

- ``FailAt-v0``: raises RuntimeError("injected failure") on its 5th step.
- ``DieAt-v0``: the process exits with code 3 on its 5th step (a death without a report).
- ``Slow-v0``: each step sleeps 50 ms (to interrupt a master that waits for it).
- ``HangAt-v0``: its 5th step never returns (sleeps an hour; first creating the file
  ``$HANG_FLAG`` when set): a run's time limit, or a Ctrl-C, must end it.
- ``Image-v0``: 3x32x32 uint8 frames, which no A2C network takes.
"""

import os
import time

import gymnasium as gym
import numpy as np

FAIL_STEP = 5


class CountingEnv(gym.Env):
    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, mode: str):
        self.mode = mode
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.mode == "fail" and self.t == FAIL_STEP:
            raise RuntimeError("injected failure")
        if self.mode == "die" and self.t == FAIL_STEP:
            os._exit(3)
        if self.mode == "slow":
            time.sleep(0.05)
        if self.mode == "hang" and self.t == FAIL_STEP:
            if os.environ.get("HANG_FLAG"):  # tells a test the step is hung (to interrupt it then)
                open(os.environ["HANG_FLAG"], "a").close()
            time.sleep(3600)
        return np.full(1, self.t, np.float32), 1.0, False, False, {}


for _id, _mode in (("FailAt-v0", "fail"), ("DieAt-v0", "die"), ("Slow-v0", "slow"), ("HangAt-v0", "hang")):
    gym.register(id=_id, entry_point=CountingEnv, kwargs={"mode": _mode})


class ImageEnv(gym.Env):
    """3x32x32 frames: no A2C network takes them (neither a vector nor 4x84x84)."""

    observation_space = gym.spaces.Box(0, 255, (3, 32, 32), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((3, 32, 32), np.uint8), {}

    def step(self, action):
        return np.zeros((3, 32, 32), np.uint8), 0.0, False, False, {}


gym.register(id="Image-v0", entry_point=ImageEnv)
