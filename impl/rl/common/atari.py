"""The choices inside Atari preprocessing that published agents make differently, as data.

:func:`impl.rl.common.envs.make_env` builds every ``ALE/...`` environment the same way (no
sticky actions, frames skipped by 4 with the max of the last two, 84x84 grey, the last 4
stacked); :class:`AtariOptions` names what differs between codes that all claim "the DQN
preprocessing":

=============  ============================  ==========================================
option         values                        who uses which
=============  ============================  ==========================================
``resize``     ``"area"`` (cv2.INTER_AREA)   gymnasium's AtariPreprocessing, SB3's
                                             WarpFrame, ALE's vector env
               ``"nearest"``                 the PAAC authors (scipy ``imresize(...,
                                             'nearest')``, i.e. PIL's NEAREST: the source
                                             pixel under each target pixel's centre)
``reset_stack`` ``"repeat"``                 gymnasium's FrameStackObservation: the first
                                             frame fills the stack
               ``"zeros"``                   SB3's VecFrameStack, ALE's vector env: zeros,
                                             then the first frame
               ``"noop"``                    the PAAC authors: 4 no-op steps after the reset,
                                             so the stack holds 4 real frames (their rewards
                                             are dropped, as the authors drop them)
``noop_max``   0..                           random no-op *frames* at a reset, drawn from
                                             1..noop_max (gymnasium; 30 everywhere)
``max_frames`` 1..                           emulator frames before an episode is truncated
                                             (v5's 108,000 = 30 minutes of play)
=============  ============================  ==========================================

Cost: ``"nearest"`` is one fancy-indexing gather of 84x84 bytes per env step (cheaper than
INTER_AREA); ``"noop"`` adds 4 env steps per episode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from replaybench.impl.rl.common.errors import ConfigError

__all__ = ["RESIZE_MODES", "RESET_STACKS", "AtariOptions", "nearest_indices", "NearestResize", "NoopStackReset",
           "resize_and_stack"]

RESIZE_MODES = ("area", "nearest")
RESET_STACKS = ("repeat", "zeros", "noop")
SCREEN = 84


@dataclass(frozen=True)
class AtariOptions:
    """The preprocessing choices of one Atari environment (module docstring). Defaults are
    gymnasium's (what :func:`~impl.rl.common.envs.make_env` always built); A2C's paper preset
    asks for the PAAC authors' (``resize="nearest", reset_stack="noop"``)."""

    resize: str = "area"
    reset_stack: str = "repeat"
    noop_max: int = 30
    max_frames: int = 108_000

    def validate(self) -> None:
        """Raise ConfigError naming the first field out of range (before any env is made)."""
        if self.resize not in RESIZE_MODES:
            raise ConfigError("resize", self.resize, f"resize must be one of {RESIZE_MODES}, got {self.resize!r}")
        if self.reset_stack not in RESET_STACKS:
            raise ConfigError("reset_stack", self.reset_stack,
                              f"reset_stack must be one of {RESET_STACKS}, got {self.reset_stack!r}")
        for name, low in (("noop_max", 0), ("max_frames", 1)):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise ConfigError(name, value, f"{name} must be an integer >= {low}, got {value!r}")


def nearest_indices(src: int, dst: int) -> np.ndarray:
    """Source rows (or columns) of a nearest-neighbour resize from ``src`` to ``dst`` pixels, as
    PIL's NEAREST computes them (the authors' ``scipy.misc.imresize(..., interp='nearest')``
    called it): the centre of target pixel 0 is ``0.5 * src / dst``, each next centre adds
    ``src / dst`` in double precision, and the source pixel is the floor. That is
    ``floor((i + 0.5) * src / dst)`` except at exact ties, where the accumulated rounding can
    fall one pixel lower (160 -> 84: columns 52 and 73 take 99 and 139, not 100 and 140).
    cv2's INTER_NEAREST takes ``floor(i * src / dst)`` instead. Cost: O(dst), once per env."""
    step, x, out = src / dst, 0.5 * (src / dst), []
    for _ in range(dst):
        out.append(min(int(math.floor(x)), src - 1))
        x += step
    return np.array(out, dtype=np.intp)


class NearestResize(gym.ObservationWrapper):
    """2-D uint8 frames resized to ``size x size`` by :func:`nearest_indices` (one gather)."""

    def __init__(self, env: gym.Env, size: int = SCREEN):
        super().__init__(env)
        h, w = env.observation_space.shape[:2]
        self._rows = nearest_indices(h, size)[:, None]
        self._cols = nearest_indices(w, size)[None, :]
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)

    def observation(self, obs: np.ndarray) -> np.ndarray:
        return obs[self._rows, self._cols]


class NoopStackReset(gym.Wrapper):
    """Over a frame stack of ``n`` frames: after each reset, ``n`` no-op steps (action 0), so
    the first observation holds the frames of those ``n`` steps (the PAAC authors' initial
    state: their ``get_initial_state`` repeats action 0 four times and stacks the frames).

    The no-op steps' rewards are dropped and they are not counted as steps of the episode
    (the authors did the same). An episode that ends inside them raises RuntimeError (the
    authors' "This should never happen": no Atari game ends within 4 steps of a reset).
    """

    def __init__(self, env: gym.Env, n: int):
        super().__init__(env)
        self.n = int(n)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.n):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                raise RuntimeError("an episode ended during the no-op steps after a reset")
        return obs, info


def resize_and_stack(env: gym.Env, opts: AtariOptions, n: int) -> gym.Env:
    """The end of the Atari chain over ``env``'s 2-D uint8 frames (grey, max-pooled, already
    84x84 for ``resize="area"``, the full screen for ``"nearest"``): the nearest resize, then a
    stack of the last ``n`` frames filled after a reset as ``opts.reset_stack`` says."""
    if opts.resize == "nearest":
        env = NearestResize(env, SCREEN)
    env = gym.wrappers.FrameStackObservation(env, n, padding_type="zero" if opts.reset_stack == "zeros" else "reset")
    return NoopStackReset(env, n) if opts.reset_stack == "noop" else env
