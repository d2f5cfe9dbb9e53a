"""Synchronous advantage actor-critic (A2C), as PAAC trains it, for discrete-action environments.

PAAC (Clemente, Castejon and Chandra, 2017) steps ``n_envs`` environments with one batched
forward pass per step and, every ``t_max`` steps, makes ONE update on the ``t_max x n_envs``
batch: n-step returns bootstrapped from the value of the last states, the policy gradient
weighted by the advantage, an entropy bonus and a squared value error, RMSProp, a clip of the
gradients' global norm and a learning rate annealed linearly to zero. Read top to bottom:

1. :class:`A2CConfig`: every argument, documented (defaults: the PAAC authors' code for Atari),
   with per-environment presets.
2. :func:`n_step_returns`: the targets, by hand-checkable recursion.
3. :class:`ActorCritic` and :func:`make_network`: one body (an MLP for vectors, the paper's
   convolutional network for 4x84x84 frames) with a policy head and a value head.
4. :class:`Rollout` and :func:`collect`: ``t_max`` batched steps of a
   :class:`~impl.rl.common.stepping.SharedVectorEnv`.
5. :class:`A2CLearner`: ``act`` (one batched forward), ``loss``, ``update``, on the learner's
   ``device`` (:mod:`impl.rl.common.device`).

The loop around them (workers, episode log, time to threshold) is :mod:`impl.rl.engines.paac`.

Where we differ from the authors' TensorFlow code, and why:

- Optimizer: the authors' TF1 RMSProp (:class:`~impl.rl.algorithms.optim.TFRMSprop`: eps inside the
  square root, the mean square starting at 1) by default. ``torch.optim.RMSprop`` takes up to
  10x larger early steps with eps 0.1 and collapsed the policy on Pong; the CartPole and
  LunarLander presets, tuned with it, keep it (``rmsprop_tf=False``).
- Time-limit truncation (CartPole's 500 steps) bootstraps from the value of the episode's last
  observation instead of cutting the return, so the time limit is not learned as a terminal
  state; the authors' Atari runs had none.
- Actions are sampled with the Gumbel-max trick from a seeded numpy generator, so a run is
  reproducible from its seed.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from replaybench.impl.rl.algorithms.base import AlgoConfig, check_range
from replaybench.impl.rl.algorithms.nets import mlp, params_digest
from replaybench.impl.rl.algorithms.optim import TFRMSprop
from replaybench.impl.rl.common.atari import AtariOptions
from replaybench.impl.rl.common.device import host_arrays, on_device
from replaybench.impl.rl.common.errors import ConfigError
from torch import nn

__all__ = ["A2CConfig", "PONG_PAPER_SETTINGS", "n_step_returns", "ActorCritic", "make_network", "check_env", "Rollout", "collect",
           "A2CLearner"]

STEPPING = ("shared", "ale-vector")
FRAME_SHAPE = (4, 84, 84)  # what the convolutional network takes (impl.rl.common.envs' Atari preprocessing)


@dataclass(frozen=True)
class A2CConfig:
    """Arguments of A2C as PAAC runs it. Defaults are the PAAC authors' (Atari); see
    :data:`PRESETS` for the other environments."""

    n_envs: int = 32
    """n_e: environments stepped in lock step; one update per ``t_max`` steps of all of them."""
    n_workers: int = 8
    """n_w: worker processes stepping them (capped at the machine's cores and at ``n_envs`` by
    the PAAC loop); 0 steps them in the learner's process."""
    t_max: int = 5
    """Steps per environment between updates (the n of the n-step returns)."""
    gamma: float = 0.99
    """Discount factor."""
    lr: float = 0.0224
    """Initial RMSProp learning rate, annealed linearly ..."""
    lr_anneal_steps: int = 80_000_000
    """... to zero over this many env steps (over all envs); constant afterwards at zero.
    0: no annealing."""
    rmsprop_alpha: float = 0.99
    """RMSProp smoothing constant of the mean square."""
    rmsprop_eps: float = 0.1
    """RMSProp epsilon (large on purpose: it damps steps on rarely-active weights)."""
    rmsprop_tf: bool = True
    """TF1's RMSProp (the authors': eps inside the square root, mean square starting at 1;
    :mod:`impl.rl.algorithms.optim`); False: ``torch.optim.RMSprop``."""
    clip_norm: float = 3.0
    """Clip the global L2 norm of the gradients to this (0: no clipping)."""
    entropy: float = 0.02
    """Weight of the policy's entropy bonus."""
    value_coef: float = 0.25
    """Weight of the squared value error against the policy loss (the authors' 0.25)."""
    loss_scale: float = 5.0
    """The whole loss is multiplied by this (the authors' code: their learning rate was tuned
    with losses summed over 5 steps and kept when the sum became a mean)."""
    reward_clip: float = 0.0
    """Clip rewards to [-reward_clip, reward_clip] for learning (Atari: 1); 0: no clipping.
    Episode returns are always the environment's own."""
    hidden: tuple[int, ...] = (128, 128)
    """Hidden widths of the MLP body (vector observations). Frames use the paper's conv net."""
    halves: bool = False
    """Step the two halves of the envs in alternation, so that the forward pass of one half
    overlaps the workers' stepping of the other (the same transitions and actions)."""
    resize: str = "nearest"
    """Atari frames: "nearest" (the authors' imresize) or "area" (cv2.INTER_AREA: gymnasium's,
    SB3's); :mod:`impl.rl.common.atari`. Ignored by other environments."""
    reset_stack: str = "noop"
    """Atari frame stack after a reset: "noop" (the authors': 4 no-op steps, 4 real frames),
    "repeat" (the first frame 4 times: gymnasium's) or "zeros" (SB3's, ALE's vector env)."""
    stepping: str = "shared"
    """Stepping backend of the PAAC loop: "shared" (:class:`~impl.rl.common.stepping.SharedVectorEnv`:
    ``n_workers`` processes, any environment) or "ale-vector" (ALE's C++ vector env,
    :mod:`impl.rl.common.ale_vector`: ``n_workers`` threads, Atari only)."""
    channels_last: bool = False
    """Keep the conv net's weights and frame batches channels-last (NHWC) in memory, oneDNN's
    preferred layout on CPU; the arithmetic is the same up to summation order."""
    compile: bool = False
    """``torch.compile`` the network's forward (used by the inference and the update)."""

    PRESETS = {}  # env id -> overrides, filled below the class (a class attribute, not a field)

    # The presets-plus-typed-overrides constructor every algorithm config uses (it needs only
    # the dataclass fields, PRESETS and validate); A2C has no replay fields to inherit.
    for_env = classmethod(AlgoConfig.for_env.__func__)

    def validate(self) -> None:
        """Raise ConfigError naming the first field out of range."""
        check_range(self, "n_envs", 1)
        check_range(self, "n_workers", 0)
        if self.n_workers > self.n_envs:
            raise ConfigError("n_workers", self.n_workers,
                              f"n_workers ({self.n_workers}) must be <= n_envs ({self.n_envs})")
        check_range(self, "t_max", 1)
        if self.halves and self.n_envs < 2:
            raise ConfigError("halves", self.halves, f"halves needs n_envs >= 2, got n_envs={self.n_envs}")
        check_range(self, "gamma", 0.0, 1.0)
        check_range(self, "lr", 0.0, low_open=True)
        check_range(self, "lr_anneal_steps", 0)
        check_range(self, "rmsprop_alpha", 0.0, 1.0)
        check_range(self, "rmsprop_eps", 0.0)
        for name in ("clip_norm", "entropy", "value_coef", "reward_clip"):
            check_range(self, name, 0.0)
        check_range(self, "loss_scale", 0.0, low_open=True)
        check_range(self, "hidden", 1)
        self.atari_options().validate()
        if self.stepping not in STEPPING:
            raise ConfigError("stepping", self.stepping, f"stepping must be one of {STEPPING}, got {self.stepping!r}")
        for name in ("channels_last", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), f"{name} must be true or false, got {getattr(self, name)!r}")

    def atari_options(self) -> AtariOptions:
        """The Atari preprocessing these settings ask for (other fields at their defaults)."""
        return AtariOptions(resize=self.resize, reset_stack=self.reset_stack)

    def lr_at(self, env_steps: int) -> float:
        """The learning rate after ``env_steps`` env steps: lr -> 0 linearly over lr_anneal_steps."""
        if self.lr_anneal_steps == 0:
            return self.lr
        return self.lr * max(0.0, 1.0 - env_steps / self.lr_anneal_steps)

    # The replay loops' vocabulary, for result rows shared with them: one update takes the
    # n_envs x t_max batch; it is the only "storage" there is.
    @property
    def batch_size(self) -> int:
        return self.n_envs * self.t_max

    @property
    def updates_per_step(self) -> float:
        return 1.0 / self.batch_size

    @property
    def buffer_capacity(self) -> int:
        return self.batch_size


# Presets. CartPole: tuned here so that a fixed seed reaches a mean return of 475 over 20
# episodes inside tests/test_paac.py's budget (a smaller batch updates more often; Adam-like
# rates suit the small MLP; no loss scaling). LunarLander: rl-baselines3-zoo's A2C settings
# (8 x 5 steps per update, lr 8.3e-4 annealed, entropy 1e-5, value 0.5, gamma 0.995).
# Pong: the authors' learning settings with rewards clipped to [-1, 1], as in their code, on the
# fastest speed choices the suite paac-pong-speed measured (ALE's C++ vector env, channels-last).
# ALE's vector env resizes with INTER_AREA and cannot take no-op steps of one env, so the
# preprocessing differs from the authors' (nearest resize, 4 no-op frames after a reset):
# PONG_PAPER_SETTINGS restores theirs (the suite training-pong runs it).
A2CConfig.PRESETS.update({
    "CartPole-v1": dict(n_envs=16, n_workers=2, t_max=5, lr=3e-3, lr_anneal_steps=0, rmsprop_eps=1e-5,
                        rmsprop_tf=False, entropy=0.01, value_coef=0.5, loss_scale=1.0, clip_norm=0.5, hidden=(64, 64)),
    "LunarLander-v3": dict(n_envs=8, n_workers=2, t_max=5, gamma=0.995, lr=8.3e-4, lr_anneal_steps=1_000_000,
                           rmsprop_eps=1e-5, rmsprop_tf=False, entropy=1e-5, value_coef=0.5, loss_scale=1.0, clip_norm=0.5,
                           hidden=(64, 64)),
    "ALE/Pong-v5": dict(reward_clip=1.0, stepping="ale-vector", channels_last=True, resize="area", reset_stack="repeat"),
})

PONG_PAPER_SETTINGS = dict(stepping="shared", channels_last=False, resize="nearest", reset_stack="noop")
"""Overrides of the Pong preset that give the authors' preprocessing (nearest-neighbour resize,
4 no-op frames after a reset) on our shared-memory stepping workers: slower, the paper's frames."""


# ------------------------------------------------------------------------------------------ returns
def n_step_returns(rewards, terminated, bootstrap_values, gamma: float, truncated=None,
                   truncation_values=None) -> np.ndarray:
    """Discounted n-step returns ``(t_max, n_envs)`` of one rollout, from the last step back::

        R_t = r_t + gamma * (0                      if terminated_t
                             V(last obs of episode) if truncated_t (a time limit)
                             R_{t+1}                otherwise),    R_{t_max} = bootstrap_values

    Parameters: ``rewards``, ``terminated`` (and ``truncated``, ``truncation_values``) of shape
    ``(t_max, n_envs)``; ``bootstrap_values`` ``(n_envs,)``, the value of the states after the
    last step. Cost: O(t_max * n_envs); float64 arithmetic.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    t_max = rewards.shape[0]
    running = np.asarray(bootstrap_values, dtype=np.float64).copy()
    out = np.empty_like(rewards)
    for t in reversed(range(t_max)):
        following = np.where(np.asarray(terminated[t], bool), 0.0, running)
        if truncated is not None:
            following = np.where(np.asarray(truncated[t], bool), truncation_values[t], following)
        running = rewards[t] + gamma * following
        out[t] = running
    return out


# ------------------------------------------------------------------------------------------ network
class ActorCritic(nn.Module):
    """``obs -> (policy logits (batch, n_actions), value (batch,))`` over one shared body.

    uint8 frames are scaled to [0, 1] inside :meth:`forward`, so callers pass the frames as the
    environment gives them (and rollouts store 1 byte per pixel). With ``channels_last`` the
    scaled frames are laid out NHWC before the convolutions (the weights are, by make_network).
    """

    def __init__(self, body: nn.Module, features: int, n_actions: int, frames: bool, channels_last: bool = False):
        super().__init__()
        self.body = body
        self.policy = nn.Linear(features, n_actions)
        self.value = nn.Linear(features, 1)
        self.frames = frames
        self.channels_last = channels_last

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs.float() / 255.0 if self.frames else obs
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        h = self.body(x)
        return self.policy(h), self.value(h).squeeze(-1)


def make_network(obs_space: gym.Space, action_space: gym.Space, cfg: A2CConfig) -> ActorCritic:
    """The actor-critic for these spaces: an MLP body (``cfg.hidden``, ReLU) for 1-D Box
    observations; for uint8 ``(4, 84, 84)`` frames the network of the PAAC paper (the NIPS
    DQN's): conv 16x8x8 stride 4, conv 32x4x4 stride 2, dense 256, all ReLU.

    Raises ConfigError (field "env") for spaces it cannot take: actions that are not Discrete,
    observations that are neither 1-D vectors nor such frames.
    """
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError("env", str(action_space), f"A2C needs Discrete actions, got {action_space}")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ConfigError("env", str(obs_space), f"A2C needs Box observations, got {obs_space}")
    n_actions = int(action_space.n)
    if obs_space.dtype == np.uint8 and tuple(obs_space.shape) == FRAME_SHAPE:
        body = nn.Sequential(nn.Conv2d(4, 16, 8, stride=4), nn.ReLU(), nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(),
                             nn.Flatten(), nn.Linear(32 * 9 * 9, 256), nn.ReLU())
        net = ActorCritic(body, 256, n_actions, frames=True, channels_last=cfg.channels_last)
        # the conv weights NHWC too (same values): oneDNN then skips the reorders around each conv
        return net.to(memory_format=torch.channels_last) if cfg.channels_last else net
    if len(obs_space.shape) != 1:
        raise ConfigError("env", str(obs_space), f"A2C takes 1-D observations or uint8 {FRAME_SHAPE} frames, "
                                                 f"got shape {obs_space.shape} ({obs_space.dtype})")
    body = nn.Sequential(mlp([int(obs_space.shape[0]), *cfg.hidden]), nn.ReLU())
    return ActorCritic(body, cfg.hidden[-1], n_actions, frames=False)


def check_env(env_id: str, cfg: A2CConfig) -> None:
    """Raise ConfigError (field "env", value ``env_id``) unless ``env_id`` exists and
    :func:`make_network` takes its spaces (Discrete actions; vector or frame observations).
    Cost: one ``gym.make`` and one small network, before any process starts."""
    from replaybench.impl.rl.common.envs import make_env

    env = make_env(env_id)  # ConfigError ("env") for an id that does not exist
    try:
        make_network(env.observation_space, env.action_space, cfg)
    except ConfigError as err:
        raise ConfigError("env", env_id, f"env {env_id!r}: {err}") from None
    finally:
        env.close()


# ------------------------------------------------------------------------------------------ rollout
@dataclass
class Rollout:
    """``t_max`` steps of ``n_envs`` envs: what one update learns from.

    ``obs[t]`` is the state acted on at step t (``(t_max, n_envs, *obs_shape)``, the envs'
    dtype); ``actions``, ``rewards`` (float32), ``terminated``, ``truncated`` are
    ``(t_max, n_envs)``; ``next_obs`` ``(n_envs, *obs_shape)`` the states after the last step
    (bootstrap); ``truncated_obs`` maps ``(t, env)`` of each truncated step to the last
    observation of that episode (to bootstrap it).
    """

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_obs: np.ndarray
    truncated_obs: dict

    @property
    def n_steps(self) -> int:
        """Env steps in the rollout (t_max * n_envs)."""
        return int(self.rewards.size)

    @classmethod
    def empty(cls, t_max: int, n_envs: int, obs_shape: tuple, obs_dtype) -> "Rollout":
        return cls(obs=np.zeros((t_max, n_envs, *obs_shape), obs_dtype), actions=np.zeros((t_max, n_envs), np.int64),
                   rewards=np.zeros((t_max, n_envs), np.float32), terminated=np.zeros((t_max, n_envs), bool),
                   truncated=np.zeros((t_max, n_envs), bool), next_obs=np.zeros((n_envs, *obs_shape), obs_dtype),
                   truncated_obs={})


def collect(venv, learner: "A2CLearner", obs: np.ndarray, t_max: int, prof=None) -> tuple[Rollout, np.ndarray]:
    """Run ``t_max`` lock steps of ``venv`` (a SharedVectorEnv, or anything with its ``step``
    and ``final_obs``) from observations ``obs``, one batched :meth:`A2CLearner.act` per step.

    With a SharedVectorEnv made with ``halves=True`` the two halves alternate: the forward
    pass of one half runs while the workers step the other (the same actions as one batched
    pass: the action draws come in the same order). Returns the rollout and the observations
    to continue from (``rollout.next_obs``). ``prof`` (a SectionProfiler), when given, gets
    ``inference`` and ``env_step`` (waiting for the workers) time. Cost: t_max forward passes
    of n_envs states (2 t_max of n_envs / 2 with halves) plus t_max steps of every env.
    """
    inference, env_step = ((prof.section("inference"), prof.section("env_step")) if prof is not None
                           else (contextlib.nullcontext(), contextlib.nullcontext()))
    ro = Rollout.empty(t_max, len(obs), obs.shape[1:], obs.dtype)

    def record(t: int, part: slice, stepped) -> np.ndarray:
        next_obs, ro.rewards[t, part], ro.terminated[t, part], ro.truncated[t, part] = stepped
        for i in np.flatnonzero(ro.truncated[t, part] & ~ro.terminated[t, part]) + part.start:
            ro.truncated_obs[(t, int(i))] = venv.final_obs[i].copy()  # valid until env i steps again
        return next_obs

    if not getattr(venv, "halves", False):
        everything = slice(0, len(obs))
        for t in range(t_max):
            ro.obs[t] = obs
            with inference:
                ro.actions[t] = learner.act(obs)[0]
            with env_step:
                obs = record(t, everything, venv.step(ro.actions[t]))
        ro.next_obs[:] = obs
        return ro, ro.next_obs

    s0, s1 = venv.part_slice(0), venv.part_slice(1)
    obs0, obs1 = obs[s0], obs[s1]
    for t in range(t_max):
        ro.obs[t, s0] = obs0
        with inference:                   # overlaps half 1's step t - 1
            ro.actions[t, s0] = learner.act(obs0)[0]
        if t > 0:
            with env_step:
                obs1 = record(t - 1, s1, venv.step_wait(1))
        venv.step_async(ro.actions[t, s0], 0)
        ro.obs[t, s1] = obs1
        with inference:                   # overlaps half 0's step t
            ro.actions[t, s1] = learner.act(obs1)[0]
        with env_step:
            obs0 = record(t, s0, venv.step_wait(0))
        venv.step_async(ro.actions[t, s1], 1)
    with env_step:
        obs1 = record(t_max - 1, s1, venv.step_wait(1))
    ro.next_obs[s0], ro.next_obs[s1] = obs0, obs1
    return ro, ro.next_obs


# ------------------------------------------------------------------------------------------ learner
class A2CLearner:
    """The actor-critic, its RMSProp optimizer and the action sampler.

    ``seed`` seeds torch (the initial weights: equal seeds give equal networks) and the numpy
    generator of the action draws. ``grad_hook(params)``, when set, is called between backward
    and the clip (e.g. to average gradients over learners). Cost per :meth:`act`: one forward
    pass of the batch; per :meth:`update`: one forward and backward over ``t_max * n_envs``
    states plus one forward over the ``n_envs`` bootstrap states. ``device`` holds the network
    and the optimizer state (the network is built on the CPU from ``seed``, then moved): off the
    CPU, :meth:`act` copies the observations there and its logits and values back in one copy,
    :meth:`update` copies the rollout there and its statistics back in one copy; on a CUDA
    device it turns on ``torch.backends.cudnn.benchmark`` for the process. Thread-safety:
    none.
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, cfg: A2CConfig, seed: int,
                 device=torch.device("cpu")):
        self.cfg = cfg
        self.device = torch.device(device)
        if self.device.type == "cuda":
            # the shapes repeat (n_envs for act, t_max * n_envs for the update): let cuDNN time
            # its convolution algorithms once per shape and keep the fastest (process-wide)
            torch.backends.cudnn.benchmark = True
        torch.manual_seed(seed)
        self.net = make_network(obs_space, action_space, cfg).to(self.device)  # a move keeps channels-last
        # what act, the update and the bootstrap values call: the module, or its compiled graph
        # (the same parameters; a compiled graph is built per batch shape on first use)
        self.forward = torch.compile(self.net) if cfg.compile else self.net
        rmsprop = TFRMSprop if cfg.rmsprop_tf else torch.optim.RMSprop
        self.optimizer = rmsprop(self.net.parameters(), lr=cfg.lr, alpha=cfg.rmsprop_alpha, eps=cfg.rmsprop_eps)
        self.rng = np.random.default_rng(seed)
        self.grad_hook = None
        self.env_steps = 0  # learned from so far (drives the lr annealing)
        self.updates = 0

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sample one action per row of ``obs`` from the policy: ONE forward pass of the batch.
        Returns ``(actions int64 (n,), values float32 (n,))``."""
        # a copy (on the device): the venv's views are read-only
        logits, values = host_arrays(*self.forward(torch.tensor(obs, device=self.device)))
        gumbel = self.rng.gumbel(size=logits.shape)  # argmax(logits + Gumbel noise) ~ softmax(logits)
        actions = (logits + gumbel).argmax(axis=1)
        return actions.astype(np.int64), values

    def _values(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return host_arrays(self.forward(torch.tensor(obs, device=self.device))[1])[0].astype(np.float64)

    def losses(self, rollout: Rollout) -> dict:
        """The loss and its parts (tensors; ``loss`` carries the graph)::

            R = n_step_returns(rewards (clipped), terminated, V(next_obs), gamma, truncated, V(final obs))
            A = R - V(obs)                                    (no gradient through A)
            loss = loss_scale * (-mean(log pi(a|s) A) - entropy * mean(H(pi(.|s)))
                                 + value_coef * mean((R - V(s))^2))
        """
        cfg = self.cfg
        t_max, n_envs = rollout.rewards.shape
        rewards = rollout.rewards
        if cfg.reward_clip > 0:
            rewards = np.clip(rewards, -cfg.reward_clip, cfg.reward_clip)
        truncation_values = np.zeros((t_max, n_envs))
        if rollout.truncated_obs:
            keys = list(rollout.truncated_obs)
            values = self._values(np.stack([rollout.truncated_obs[k] for k in keys]))
            for (t, i), v in zip(keys, values):
                truncation_values[t, i] = v
        returns = n_step_returns(rewards, rollout.terminated, self._values(rollout.next_obs), cfg.gamma,
                                 rollout.truncated & ~rollout.terminated, truncation_values)

        obs = on_device(rollout.obs.reshape(t_max * n_envs, *rollout.obs.shape[2:]), self.device)
        logits, values = self.forward(obs)
        log_probs = F.log_softmax(logits, dim=1)
        returns_t = on_device(returns.reshape(-1).astype(np.float32), self.device)
        advantages = returns_t - values.detach()
        actions = on_device(rollout.actions.reshape(-1), self.device)
        policy_loss = -(log_probs.gather(1, actions.unsqueeze(1)).squeeze(1) * advantages).mean()
        entropy = -(log_probs.exp() * log_probs).sum(1).mean()
        value_loss = (returns_t - values).pow(2).mean()
        loss = cfg.loss_scale * (policy_loss - cfg.entropy * entropy + cfg.value_coef * value_loss)
        return {"loss": loss, "policy_loss": policy_loss.detach(), "value_loss": value_loss.detach(),
                "entropy": entropy.detach(), "returns": returns}

    def loss(self, rollout: Rollout) -> torch.Tensor:
        """The scalar A2C loss of ``rollout`` (see :meth:`losses`), ready for ``backward``."""
        return self.losses(rollout)["loss"]

    def update(self, rollout: Rollout) -> dict:
        """One A2C step on ``rollout``: loss, backward, ``grad_hook``, global-norm clip, RMSProp at
        the annealed learning rate. Returns floats: loss, policy_loss, value_loss, entropy,
        grad_norm (before clipping), lr."""
        parts = self.losses(rollout)
        lr = self.cfg.lr_at(self.env_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad()
        parts["loss"].backward()
        params = list(self.net.parameters())
        if self.grad_hook is not None:
            self.grad_hook(params)
        if self.cfg.clip_norm > 0:
            grad_norm = nn.utils.clip_grad_norm_(params, self.cfg.clip_norm)
        else:
            grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        self.optimizer.step()
        self.env_steps += rollout.n_steps
        self.updates += 1
        stats = host_arrays(parts["loss"], parts["policy_loss"], parts["value_loss"], parts["entropy"], grad_norm)
        return {"loss": float(stats[0]), "policy_loss": float(stats[1]), "value_loss": float(stats[2]),
                "entropy": float(stats[3]), "grad_norm": float(stats[4]), "lr": lr}

    def warm_up(self, obs: np.ndarray, t_max: int, act_sizes=None) -> None:
        """Pay before a run what its first calls would pay once, and change nothing: one action
        draw on zeros of ``obs``'s shape (or one per batch size in ``act_sizes``: the halves a
        run with ``halves`` acts on) and one update on a rollout of ``t_max`` steps of zeros of
        all ``len(obs)`` envs, then the whole state put back (:meth:`state_dict`, gradients
        cleared). What is paid: the device's kernels loaded on first use, cuDNN's timing of its
        algorithms for these shapes (``cudnn.benchmark``), a ``compile`` graph built per shape.
        The calls after it are bit for bit those of a learner that was not warmed up. Cost:
        about one update and the action draws, plus those one-time costs."""
        state = copy.deepcopy(self.state_dict())
        for n in (len(obs),) if act_sizes is None else act_sizes:
            self.act(np.zeros((n, *obs.shape[1:]), obs.dtype))
        self.update(Rollout.empty(t_max, len(obs), obs.shape[1:], obs.dtype))
        self.load_state_dict(state)
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict:
        """Everything an update and an action draw depend on: the network, the optimizer's
        state, the step counters, the action sampler's generator and torch's (for a checkpoint;
        :meth:`load_state_dict` puts it back so that the next updates are bit for bit the same)."""
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(), "env_steps": self.env_steps,
                "updates": self.updates, "rng": self.rng.bit_generator.state, "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.env_steps, self.updates = int(state["env_steps"]), int(state["updates"])
        self.rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])

    def modules(self) -> list[nn.Module]:
        return [self.net]

    def digest(self) -> str:
        """SHA-1 of every parameter: equal iff two learners agree bitwise."""
        return params_digest(self.net)

