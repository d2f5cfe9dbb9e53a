"""ALE's own C++ vector environment as a PAAC stepping backend (``A2CConfig.stepping="ale-vector"``).

:class:`AleVectorEnv` wraps ``ale_py.AtariVectorEnv`` (ale-py >= 0.12) behind the part of
:class:`~impl.rl.common.stepping.SharedVectorEnv`'s interface that the PAAC loop uses
(``reset``, ``step``, ``final_obs``, ``pop_episodes``, the spaces): the emulators, frame
skipping, max-pooling, grey conversion, INTER_AREA resize and stacking all run in C++ on
``n_threads`` threads of this process, which release the GIL while they step. No worker
processes, no pipes.

What equals :func:`~impl.rl.common.envs.make_env`'s environments (tested, bit for bit, with
``noop_max=0``): the observations (uint8 ``(4, 84, 84)``), the rewards (unclipped: the
learner clips), terminated / truncated (at ``max_frames`` emulator frames), the episode
returns and lengths, and the autoreset (an env whose episode ended starts its next one in the
same step; :attr:`final_obs` holds the last observation of the finished one). The stack after
a reset is ALE's zeros, or, for ``reset_stack="repeat"``, the first frame written over the
zero slots for the first 3 steps of each episode (exactly gymnasium's stack).

What cannot be equal, and why:

- ``resize="nearest"`` and ``reset_stack="noop"`` (the PAAC authors'): ALE's C++ resizes with
  INTER_AREA only, and its reset cannot be followed by no-op steps of one env alone (a step
  steps every env). Both raise ConfigError naming the field.
- Random no-op starts (``noop_max > 0``): ALE draws the count from its own C++ generator
  seeded from the reset seed, gymnasium's AtariPreprocessing from the env's numpy generator,
  so the same seed gives different starts (the distributions differ too: see ale-py's
  ``PreprocessedEnv``). Episode starts are then equal in law, not bit for bit.
- Seeding: env ``i`` is reset with ``seed + i`` at the first :meth:`reset`, as in
  SharedVectorEnv, but ALE derives its emulator seed differently from gymnasium's AtariEnv;
  with ``repeat_action_probability=0`` and no no-op starts the emulator is deterministic, so
  this matters only through the no-op counts above.

Cost per :meth:`step`: the C++ step of every env over the threads, plus O(n_envs) numpy in
this process (and a copy of each ended episode's final frame stack). Thread-safety: one thread.
"""

from __future__ import annotations

import re
import time

import numpy as np
from replaybench.impl.rl.common.atari import AtariOptions
from replaybench.impl.rl.common.envs import ATARI_FRAME_SKIP, ATARI_FRAME_STACK, ATARI_PREFIX
from replaybench.impl.rl.common.errors import ConfigError

__all__ = ["AleVectorEnv", "ale_game", "check_options"]


def ale_game(env_id: str) -> str:
    """The ROM name of an ``ALE/<Game>-v5`` id (``ALE/MsPacman-v5`` -> ``ms_pacman``); ConfigError
    (field "env") for an id that is not an ALE game, or without ale-py's vector env."""
    match = re.fullmatch(r"ALE/([A-Za-z0-9]+)-v\d+", env_id) if env_id.startswith(ATARI_PREFIX) else None
    if match is None:
        raise ConfigError("env", env_id, f"stepping 'ale-vector' runs ALE games ('ALE/<Game>-v5'), got {env_id!r}")
    try:
        from ale_py import AtariVectorEnv, roms  # noqa: F401  (the `atari` extra, ale-py >= 0.12)
    except ImportError as err:
        raise ConfigError("env", env_id, f"stepping 'ale-vector' needs ale-py >= 0.12: {err}") from None
    game = re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(1)).lower()
    if roms.get_rom_path(game) is None:
        raise ConfigError("env", env_id, f"env {env_id!r}: ale-py has no ROM {game!r}")
    return game


def check_options(opts: AtariOptions) -> None:
    """ConfigError naming ``resize`` or ``reset_stack`` when ALE's vector env cannot do them."""
    opts.validate()
    if opts.resize != "area":
        raise ConfigError("resize", opts.resize, f"stepping 'ale-vector' resizes with INTER_AREA only (resize 'area'), "
                                                 f"got resize={opts.resize!r}")
    if opts.reset_stack == "noop":
        raise ConfigError("reset_stack", opts.reset_stack, "stepping 'ale-vector' cannot take no-op steps of one env "
                                                           "after its reset: reset_stack must be 'repeat' or 'zeros'")


class AleVectorEnv:
    """``n_envs`` copies of an ALE game stepped by ALE's C++ vector env on ``n_threads`` threads
    (module docstring for what equals make_env's environments and what cannot).

    Parameters: ``env_id`` an ``ALE/<Game>-v5`` id; ``n_envs`` >= 1; ``n_threads`` >= 1;
    ``seed`` >= 0 (env ``i`` reset with ``seed + i`` at the first :meth:`reset`); ``atari`` the
    preprocessing options (None: defaults). Raises ConfigError naming the argument before
    anything is made.
    """

    halves = False  # one part: the C++ env steps every env per call

    def __init__(self, env_id: str, n_envs: int, n_threads: int, *, seed: int, atari: AtariOptions | None = None):
        for name, value, low in (("n_envs", n_envs, 1), ("n_threads", n_threads, 1), ("seed", seed, 0)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise ConfigError(name, value, f"{name} must be an integer >= {low}, got {value!r}")
        opts = AtariOptions() if atari is None else atari
        check_options(opts)
        game = ale_game(env_id)
        from ale_py import AtariVectorEnv

        self.env_id, self.num_envs, self.n_threads, self.seed, self.atari = env_id, int(n_envs), int(n_threads), int(seed), opts
        # The same emulator settings as make_env: no sticky actions, no fire at reset, raw
        # rewards, whole-game episodes; SameStep autoreset = SharedVectorEnv's semantics.
        self._env = AtariVectorEnv(game, self.num_envs, num_threads=self.n_threads, repeat_action_probability=0.0,
                                   max_num_frames_per_episode=opts.max_frames, autoreset_mode="SameStep",
                                   img_height=84, img_width=84, grayscale=True, stack_num=ATARI_FRAME_STACK,
                                   frameskip=ATARI_FRAME_SKIP, maxpool=True, noop_max=opts.noop_max,
                                   episodic_life=False, reward_clipping=False, use_fire_reset=False)
        self.single_observation_space = self._env.single_observation_space
        self.single_action_space = self._env.single_action_space
        self.obs_shape = tuple(self.single_observation_space.shape)
        self.obs_dtype = np.dtype(np.uint8)
        n = self.num_envs
        self._final_obs = np.zeros((n, *self.obs_shape), np.uint8)
        self._ep_return = np.zeros(n)
        self._ep_length = np.zeros(n, np.int64)
        self._age = np.zeros(n, np.int64)  # steps since each env's reset (for reset_stack="repeat")
        self._first = np.zeros((n, *self.obs_shape[1:]), np.uint8)
        self._episodes: list[tuple[int, float, int]] = []
        self._was_reset = False
        self._closed = False
        self._busy = 0.0

    def _repeat_first(self, obs: np.ndarray, reset: np.ndarray) -> np.ndarray:
        """Gymnasium's stack from ALE's: the zero slots of the first 3 steps hold the first frame."""
        if self.atari.reset_stack != "repeat":
            return obs
        obs = np.array(obs)  # ours to write
        self._first[reset] = obs[reset, -1]
        for i in np.flatnonzero(self._age < ATARI_FRAME_STACK - 1).tolist():
            obs[i, : ATARI_FRAME_STACK - 1 - self._age[i]] = self._first[i]
        return obs

    def reset(self) -> np.ndarray:
        """Start an episode in every env (the first call seeds env ``i`` with ``seed + i``);
        returns the observations ``(n_envs, 4, 84, 84)``."""
        self._check_open()
        t0 = time.perf_counter()
        obs, _ = self._env.reset(seed=None if self._was_reset else self.seed)
        self._busy += time.perf_counter() - t0
        self._was_reset = True
        self._ep_return[:] = 0.0
        self._ep_length[:] = 0
        self._age[:] = 0
        self._episodes.clear()
        return self._repeat_first(obs, np.ones(self.num_envs, bool))

    def step(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step every env; returns ``(obs, rewards float64, terminated, truncated)`` like
        SharedVectorEnv.step (an env whose episode ended already shows its next episode's first
        observation). Raises RuntimeError before :meth:`reset`, ValueError for a wrong shape."""
        self._check_open()
        if not self._was_reset:
            raise RuntimeError("step before reset(): call reset() first")
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,) or actions.dtype.kind not in "iu":
            raise ValueError(f"actions must be integers of shape {(self.num_envs,)}, got {actions.dtype} {actions.shape}")
        t0 = time.perf_counter()
        obs, rewards, terminated, truncated, info = self._env.step(actions.astype(np.int64, copy=False))
        self._busy += time.perf_counter() - t0
        rewards = rewards.astype(np.float64)
        ended = terminated | truncated
        self._ep_return += rewards
        self._ep_length += 1
        self._age += 1
        for i in np.flatnonzero(ended).tolist():
            self._final_obs[i] = info["final_obs"][i]
            self._episodes.append((i, float(self._ep_return[i]), int(self._ep_length[i])))
        self._ep_return[ended] = 0.0
        self._ep_length[ended] = 0
        self._age[ended] = 0
        return self._repeat_first(obs, ended), rewards, terminated.astype(bool), truncated.astype(bool)

    @property
    def final_obs(self) -> np.ndarray:
        """``(n_envs, 4, 84, 84)``: the last observation of the episode that ended at env ``i``'s
        latest step (valid where that step's terminated | truncated)."""
        return self._final_obs

    def pop_episodes(self) -> list[tuple[int, float, int]]:
        """``(env_index, return, length)`` of each episode finished since the last call."""
        episodes, self._episodes = self._episodes, []
        return episodes

    @property
    def worker_busy_s(self) -> np.ndarray:
        """Seconds this process spent in ALE's reset and step calls (one entry: the threads
        are not timed one by one)."""
        return np.array([self._busy])

    @property
    def envs_per_worker(self) -> list[int]:
        return [self.num_envs]

    @property
    def worker_pids(self) -> list[int]:
        return []

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("AleVectorEnv is closed")

    def close(self) -> None:
        """Close the C++ vector env (its threads). Idempotent."""
        if not self._closed:
            self._closed = True
            self._env.close()

    def __enter__(self) -> "AleVectorEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
