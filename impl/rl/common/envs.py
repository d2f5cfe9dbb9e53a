"""Environments, the transition schema they produce, the reward thresholds we time, and the
one env-stepping routine both loops use (:class:`EnvRunner`: one batched forward for E
environments, step them, stage their transitions, log episodes).

The replay buffers store one row per environment step with the fields of
:func:`transition_fields`: ``obs``, ``action``, ``reward``, ``next_obs``, ``done`` (true only
when the episode *terminated*: a time-limit truncation still bootstraps) and ``actor`` (the id
of the actor process that produced it; 0 in the sequential loop), so tests can check that
every actor's transitions reach the buffer.

Thresholds (:data:`THRESHOLDS`, mean return over the last :data:`WINDOW` = 20 episodes):

==============  =======  =========================================================
CartPole-v1       475    gymnasium's own ``reward_threshold`` (returns are capped at 500)
LunarLander-v3    200    gymnasium's ``reward_threshold``: "solved"
Acrobot-v1       -100    gymnasium's ``reward_threshold``
Pendulum-v1      -200    ours (gymnasium sets none): a swing-up held upright most of each
                         200-step episode; random actions score about -1200, a good TD3
                         policy -150 to -170
==============  =======  =========================================================

Returns are the training episodes' own (with exploration), as in most RL papers' curves.

What :func:`make_env` adds to ``gym.make`` (so that every loop and every worker process sees
the same environment):

- Atari ids (``ALE/...``, through ale-py: the ``atari`` extra) get the standard DQN/PAAC
  preprocessing: no sticky actions, up to 30 no-op starts, 4 frames skipped with the max of the
  last two, 84x84 grey frames, the last 4 stacked: ``Box(0, 255, (4, 84, 84), uint8)``.
- Observation spaces that are not a Box (Blackjack-v1's ``Tuple(Discrete(32), Discrete(11),
  Discrete(2))``) are flattened to float32 vectors (``gym.spaces.flatten``: one-hot per Discrete).
"""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np
from replaybench.impl.rl.common.atari import AtariOptions, resize_and_stack
from replaybench.impl.rl.common.errors import ConfigError

__all__ = ["THRESHOLDS", "WINDOW", "ATARI_PREFIX", "ACTION_KINDS", "make_env", "transition_fields", "EpisodeLog",
           "TransitionStager", "stage_rows", "EnvRunner"]

THRESHOLDS = {"CartPole-v1": 475.0, "LunarLander-v3": 200.0, "Acrobot-v1": -100.0, "Pendulum-v1": -200.0}
WINDOW = 20


#: Ids made with the Atari preprocessing of :func:`_make_atari`.
ATARI_PREFIX = "ALE/"
ATARI_FRAME_SKIP = 4
ATARI_FRAME_STACK = 4

#: Action kind an algorithm declares -> the gymnasium action space it handles.
ACTION_KINDS = {"discrete": gym.spaces.Discrete, "continuous": gym.spaces.Box}


def make_env(env_id: str, algo=None, atari: AtariOptions | None = None) -> gym.Env:
    """``gym.make(env_id)``, checked: the id exists and, given ``algo`` (an
    :class:`~impl.rl.algorithms.Algorithm`), the action space is of its ``action_kind``.

    Raises ConfigError (field "env") naming the id otherwise, with the environment closed.
    Atari ids get the standard preprocessing with the choices of ``atari``
    (:class:`~impl.rl.common.atari.AtariOptions`; default: gymnasium's; ignored for other
    ids; a bad option raises ConfigError naming it before anything is made) and non-Box
    observations are flattened to float32 (module docstring). Seed it with the first
    ``reset(seed=...)`` (:meth:`EnvRunner.reset`).
    """
    atari = AtariOptions() if atari is None else atari
    atari.validate()
    try:
        env = _make_atari(env_id, atari) if env_id.startswith(ATARI_PREFIX) else gym.make(env_id)
    except (gym.error.Error, ImportError) as err:  # NameNotFound, DependencyNotInstalled, "module:Id" ...
        raise ConfigError("env", env_id, f"env {env_id!r} cannot be made: {err}") from None
    if not isinstance(env.observation_space, gym.spaces.Box):
        env = gym.wrappers.DtypeObservation(gym.wrappers.FlattenObservation(env), np.float32)
    if algo is not None and not isinstance(env.action_space, ACTION_KINDS[algo.action_kind]):
        space = env.action_space
        env.close()
        raise ConfigError("env", env_id, f"{algo.name} needs {algo.action_kind} actions "
                                         f"({ACTION_KINDS[algo.action_kind].__name__}); env {env_id!r} has {space}")
    return env


def _make_atari(env_id: str, opts: AtariOptions) -> gym.Env:
    """An ALE game with the preprocessing of the DQN and PAAC papers (see the module docstring),
    and ``opts``' choices where those codes differ (:mod:`impl.rl.common.atari`).

    The emulator runs every frame (``frameskip=1``) so that the wrapper can max-pool the last
    two of each 4 (Atari sprites flicker between frames); ``repeat_action_probability=0``
    turns off v5's sticky actions, as in the PAAC authors' emulator. Raises ImportError
    without ale-py, or gym.error.Error for an unknown game.
    """
    import ale_py  # the `atari` extra; registers the ALE/ ids with gymnasium

    gym.register_envs(ale_py)
    env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0, max_num_frames_per_episode=opts.max_frames)
    # "nearest": AtariPreprocessing keeps the full screen (cv2.resize to the same size copies it)
    # and NearestResize samples it; "area" is AtariPreprocessing's own INTER_AREA.
    height, width = env.unwrapped.ale.getScreenDims()
    screen = (int(width), int(height)) if opts.resize == "nearest" else 84  # cv2's (width, height)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=opts.noop_max, frame_skip=ATARI_FRAME_SKIP,
                                          screen_size=screen, grayscale_obs=True, terminal_on_life_loss=False,
                                          scale_obs=False)
    return resize_and_stack(env, opts, ATARI_FRAME_STACK)


def transition_fields(env: gym.Env) -> dict:
    """The ``{name: (shape, dtype)}`` schema of one stored transition for ``env``.

    Discrete actions are stored as int64 indices, continuous ones as float32 vectors scaled
    to [-1, 1] (the agent maps them to the action space's bounds).
    """
    obs_shape = tuple(env.observation_space.shape)
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        action = ((), "int64")
    elif isinstance(space, gym.spaces.Box):
        action = (tuple(space.shape), "float32")
    else:
        raise ValueError(f"unsupported action space {space!r}: need Discrete or Box")
    return {"obs": (obs_shape, "float32"), "action": action, "reward": ((), "float32"),
            "next_obs": (obs_shape, "float32"), "done": ((), "bool"), "actor": ((), "int32")}


class EpisodeLog:
    """Episode returns with the env steps and wall seconds at which each episode ended.

    ``reached`` becomes true the first time the mean of the last ``window`` returns is at
    least ``threshold`` (at least ``window`` episodes needed); ``time_to_threshold_s`` and
    ``steps_to_threshold`` record when. Cost: O(1) per episode.
    """

    def __init__(self, threshold: float | None, window: int = WINDOW):
        self.threshold = threshold
        self.window = int(window)
        self.episodes: list[tuple[int, float, float]] = []  # (env_steps, wall_s, return)
        self._recent: deque = deque(maxlen=self.window)
        self._sum = 0.0
        self.time_to_threshold_s: float | None = None
        self.steps_to_threshold: int | None = None

    def record(self, env_steps: int, wall_s: float, ret: float) -> None:
        self.episodes.append((int(env_steps), float(wall_s), float(ret)))
        if len(self._recent) == self.window:
            self._sum -= self._recent[0]
        self._recent.append(float(ret))
        self._sum += float(ret)
        if (self.time_to_threshold_s is None and self.threshold is not None and len(self._recent) == self.window
                and self._sum / self.window >= self.threshold):
            self.time_to_threshold_s = float(wall_s)
            self.steps_to_threshold = int(env_steps)

    @property
    def reached(self) -> bool:
        return self.time_to_threshold_s is not None

    def recent_mean(self) -> float | None:
        """Mean of the last ``window`` returns (fewer at the start); None before any episode."""
        return self._sum / len(self._recent) if self._recent else None


class TransitionStager:
    """Collects steps into preallocated arrays and hands them to ``buffer.add`` as a batch.

    Both loops insert in batches of ``size`` rows (the classic loop with ``size`` 1 would pay
    one buffer call, and in the parallel loop one lock acquisition, per step). A vector step
    of E environments stages E rows at once (:meth:`push`), so an actor's stage holds a
    whole number of vector steps (:func:`stage_rows`). The arrays returned by :meth:`batch`
    are views that the next :meth:`push` overwrites: add them before pushing again. Cost:
    O(rows x row bytes) per push. Thread-safety: none.
    """

    def __init__(self, fields: dict, size: int):
        self.size = int(size)
        self.arrays = {name: np.zeros((self.size, *shape), dtype=dtype) for name, (shape, dtype) in fields.items()}
        self.n = 0

    def push(self, obs, action, reward, next_obs, done, actor) -> bool:
        """Stage k transitions (each argument holds k rows; ``actor`` may be one id for all);
        returns True when the stage is full (call :meth:`batch`). Raises ValueError when the k
        rows do not fit, with the stage unchanged."""
        i = self.n
        k = len(reward)
        if i + k > self.size:
            raise ValueError(f"{k} rows do not fit a stage of {self.size} holding {i}")
        a = self.arrays
        a["obs"][i : i + k] = obs
        a["action"][i : i + k] = action
        a["reward"][i : i + k] = reward
        a["next_obs"][i : i + k] = next_obs
        a["done"][i : i + k] = done
        a["actor"][i : i + k] = actor
        self.n = i + k
        return self.n == self.size

    def batch(self) -> dict:
        """The staged rows as a dict of views (``n`` rows); empties the stage."""
        n, self.n = self.n, 0
        return {name: arr[:n] for name, arr in self.arrays.items()}


def stage_rows(insert_batch: int, envs: int) -> int:
    """Rows per buffer add for an actor stepping ``envs`` environments: ``insert_batch``
    rounded up to a whole number of vector steps (``insert_batch`` itself for one env)."""
    return envs * -(-insert_batch // envs)


class EnvRunner:
    """One actor's side of the loop over E environments, one *vector step* per :meth:`step`:
    ONE batched policy forward for the E observations, E ``env.step`` calls, E staged rows,
    and a report of each finished episode.

    The sequential loop and every actor process drive one each, so both act, stage and log
    the same way; E = 1 is the classic one-env actor. Rows are staged in env order, so env
    ``j``'s transitions are rows ``j, j + E, j + 2E ...`` of a stage filled by full vector
    steps. ``on_episode(env_steps, episode_return)`` is called when an episode ends
    (terminated or truncated; ``env_steps`` counts the steps of the vector step up to and
    including env ``j``'s), then that environment alone is reset (unseeded: its own RNG goes
    on). Time is credited to ``prof``'s ``inference`` (the batched policy) and ``env_step``
    (steps and resets) sections. Cost per vector step: one forward pass of E rows (about the
    cost of one row for small E and MLPs: per-call overhead dominates), E ``env.step``, E
    staged rows. Thread-safety: none.
    """

    def __init__(self, envs, actor, stage: TransitionStager, actor_id: int, prof, on_episode):
        self.envs = list(envs)
        if not self.envs:
            raise ValueError("EnvRunner needs at least one environment")
        self.actor = actor
        self.stage = stage
        self.actor_id = int(actor_id)
        self.on_episode = on_episode
        self._inference, self._env_step = prof.section("inference"), prof.section("env_step")
        n, shape = len(self.envs), tuple(self.envs[0].observation_space.shape)
        self.obs = np.zeros((n, *shape), dtype=np.float32)
        self._next_obs = np.zeros_like(self.obs)
        self._rewards = np.zeros(n, dtype=np.float32)
        self._terminated = np.zeros(n, dtype=bool)
        self.episode_returns = np.zeros(n, dtype=np.float64)

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def reset(self, seeds=None) -> None:
        """Start an episode in every environment; ``seeds`` (one int per env, e.g.
        :meth:`~impl.rl.common.seeding.ActorSeeds.env_seed`) seeds them, on the first reset only."""
        if seeds is not None and len(seeds) != len(self.envs):
            raise ValueError(f"{len(seeds)} seeds for {len(self.envs)} environments")
        with self._env_step:
            for j, env in enumerate(self.envs):
                self.obs[j], _ = env.reset(seed=None if seeds is None else int(seeds[j]))
        self.episode_returns[:] = 0.0

    def step(self, env_steps: int, n: int | None = None) -> bool:
        """One vector step with the policy at ``env_steps`` steps into the run (its
        exploration schedule); only the first ``n`` environments step (default all: a run's
        last step may need fewer). Returns True when the stage is full (add ``stage.batch()``
        next)."""
        n = len(self.envs) if n is None else n
        actor = self.actor
        with self._inference:
            actions = actor.act_batch(self.obs, env_steps)
        truncated = []
        with self._env_step:
            for j in range(n):
                obs, reward, terminated, trunc, _ = self.envs[j].step(actor.env_action(actions[j]))
                self._next_obs[j] = obs
                self._rewards[j] = reward
                self._terminated[j] = terminated
                self.episode_returns[j] += float(reward)
                truncated.append(trunc)
        full = self.stage.push(self.obs[:n], actions[:n], self._rewards[:n], self._next_obs[:n],
                               self._terminated[:n], self.actor_id)
        self.obs[:n] = self._next_obs[:n]
        for j in range(n):
            if self._terminated[j] or truncated[j]:
                self.on_episode(env_steps + j + 1, float(self.episode_returns[j]))
                self.episode_returns[j] = 0.0
                with self._env_step:
                    self.obs[j], _ = self.envs[j].reset()
        return full
