"""DQN with proportional prioritized replay, for discrete-action gymnasium environments.

Deep Q-learning (Mnih et al., 2015) with double-Q targets (van Hasselt et al., 2016), a Huber
loss weighted by importance-sampling weights and |TD error| as the new priority (Schaul et al.,
2016). Read top to bottom:

1. :class:`DQNConfig`: every argument, documented, with per-environment presets.
2. :func:`build_q_network`: the MLP ``obs -> Q(obs, .)``.
3. :class:`DQNActor`: epsilon-greedy ``act(obs, env_steps)`` on a CPU copy of the Q network.
   Actor processes hold one each and refresh it with :meth:`DQNActor.set_flat_weights`.
4. :class:`DQNLearner`: online and target networks and the optimizer;
   ``learn(batch) -> (loss, new_priorities)``; ``get_flat_weights()`` for the broadcast.

The replay loop around them lives in :mod:`impl.rl.sequential` and :mod:`impl.rl.parallel`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .nets import flat_params, load_flat_params, mlp, params_digest

__all__ = ["DQNConfig", "build_q_network", "DQNActor", "DQNLearner"]


@dataclass
class DQNConfig:
    """Arguments of DQN with prioritized replay. Step counts are *environment* steps over all
    actors; update counts are *learner* updates (one optimizer step on ``batch_size`` rows)."""

    lr: float = 1e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    batch_size: int = 64
    """Transitions per update; with L learners each samples ``batch_size // L``."""
    buffer_capacity: int = 50_000
    """Replay capacity (transitions); the oldest are overwritten first."""
    hidden: tuple = (128, 128)
    """Hidden layer widths of the Q network."""
    target_update_every: int = 500
    """Learner updates between target-network updates."""
    tau: float = 1.0
    """Target update: ``target <- tau * online + (1 - tau) * target`` (1.0 = hard copy)."""
    eps_start: float = 1.0
    """Exploration: epsilon of the epsilon-greedy policy at step 0 ..."""
    eps_end: float = 0.05
    """... falling linearly to this ..."""
    eps_decay_steps: int = 10_000
    """... over this many env steps, then constant."""
    learning_starts: int = 1_000
    """Env steps stored before the first update (must be >= batch_size)."""
    updates_per_step: float = 0.25
    """The replay ratio: learner updates per env step (0.25 = one update every 4 steps).
    Samples per insert = ``updates_per_step * batch_size``; the parallel loop holds it with a
    rate limiter."""
    double_q: bool = True
    """Select the next action with the online network, evaluate it with the target network."""
    max_grad_norm: float | None = 10.0
    """Clip the gradient's global norm (None: no clipping)."""
    per_alpha: float = 0.6
    """Priority exponent: P(i) proportional to (|td_i| + per_eps) ** per_alpha."""
    per_beta_start: float = 0.4
    """Importance-sampling exponent at step 0, annealed linearly to 1.0 ..."""
    per_beta_steps: int = 50_000
    """... over this many env steps."""
    per_eps: float = 1e-6
    """Added to every priority so no transition becomes unsampleable."""

    PRESETS = {}  # filled below the class: env id -> overrides

    @classmethod
    def for_env(cls, env_id: str, **overrides) -> "DQNConfig":
        """The preset for ``env_id`` (defaults when there is none) with ``overrides`` applied."""
        cfg = replace(cls(), **{**cls.PRESETS.get(env_id, {}), **overrides})
        cfg.hidden = (cfg.hidden,) if isinstance(cfg.hidden, int) else tuple(cfg.hidden)  # "--set hidden=64"
        return cfg

    def epsilon(self, env_steps: int) -> float:
        frac = min(1.0, env_steps / max(1, self.eps_decay_steps))
        return self.eps_start + frac * (self.eps_end - self.eps_start)

    def beta(self, env_steps: int) -> float:
        frac = min(1.0, env_steps / max(1, self.per_beta_steps))
        return self.per_beta_start + frac * (1.0 - self.per_beta_start)


# Presets. CartPole: tuned here so that a fixed seed reaches a mean return of 475 over 20
# episodes well inside tests/test_rl_slow.py's budget. LunarLander and Acrobot follow the
# rl-baselines3-zoo DQN settings (lr 6.3e-4, batch 128, 256x256, one update per 4 steps,
# target every 250 updates, epsilon 1 -> 0.1 over the first 12% of 100k steps).
DQNConfig.PRESETS.update({
    "CartPole-v1": dict(lr=1e-3, batch_size=64, hidden=(128, 128), buffer_capacity=100_000, target_update_every=1,
                        tau=0.01, eps_end=0.02, eps_decay_steps=10_000, learning_starts=1_000,
                        updates_per_step=0.5, per_beta_steps=50_000),
    "LunarLander-v3": dict(lr=6.3e-4, batch_size=128, hidden=(256, 256), buffer_capacity=50_000,
                           target_update_every=250, eps_end=0.1, eps_decay_steps=12_000, learning_starts=1_000,
                           updates_per_step=0.25, per_beta_steps=100_000),
    "Acrobot-v1": dict(lr=6.3e-4, batch_size=128, hidden=(256, 256), buffer_capacity=50_000,
                       target_update_every=250, eps_end=0.1, eps_decay_steps=12_000, learning_starts=1_000,
                       updates_per_step=0.25, per_beta_steps=100_000),
})


def build_q_network(obs_dim: int, n_actions: int, hidden) -> nn.Sequential:
    """MLP ``obs (obs_dim) -> Q values (n_actions)``."""
    return mlp([obs_dim, *hidden, n_actions])


def _spaces(env_or_spaces):
    obs_space, act_space = env_or_spaces
    return int(np.prod(obs_space.shape)), int(act_space.n)


class DQNActor:
    """Epsilon-greedy policy over a Q network.

    Parameters
    ----------
    spaces : (observation_space, action_space)
    cfg : DQNConfig
    seed : int
        Seeds the exploration draws.
    net : nn.Module, optional
        Share this Q network (the sequential loop passes the learner's); otherwise a new CPU
        copy is built, to be filled with :meth:`set_flat_weights`.

    Cost per ``act``: one forward pass of one observation (~20-60 us on a CPU for small MLPs).
    Thread-safety: none.
    """

    def __init__(self, spaces, cfg: DQNConfig, seed: int, net: nn.Module | None = None):
        obs_dim, self.n_actions = _spaces(spaces)
        self.cfg = cfg
        self.q = net if net is not None else build_q_network(obs_dim, self.n_actions, cfg.hidden)
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, env_steps: int) -> int:
        """Action for one observation: random with probability epsilon(env_steps), else argmax Q."""
        if self.rng.random() < self.cfg.epsilon(env_steps):
            return int(self.rng.integers(self.n_actions))
        with torch.inference_mode():
            return int(self.q(torch.from_numpy(np.asarray(obs, dtype=np.float32))).argmax())

    @staticmethod
    def env_action(action: int) -> int:
        """The action as the environment takes it (discrete: unchanged)."""
        return action

    def set_flat_weights(self, flat) -> None:
        """Load the Q network from a vector made by :meth:`DQNLearner.get_flat_weights`."""
        load_flat_params(self.q, flat)


class DQNLearner:
    """Online and target Q networks, Adam, and one update per :meth:`learn` call.

    ``grad_hook(params)``, when set, is called between backward and the optimizer step: the
    parallel loop sets it to a :class:`~impl.rl.nets.GradientAverager` so L learners apply the
    same averaged gradient. Cost per ``learn``: forward of 3 networks (online on obs and
    next_obs, target on next_obs), one backward, one Adam step. Thread-safety: none.
    """

    def __init__(self, spaces, cfg: DQNConfig, seed: int):
        obs_dim, n_actions = _spaces(spaces)
        self.cfg = cfg
        torch.manual_seed(seed)  # same seed -> same initial weights on every learner
        self.q = build_q_network(obs_dim, n_actions, cfg.hidden)
        self.target = build_q_network(obs_dim, n_actions, cfg.hidden)
        self.target.load_state_dict(self.q.state_dict())
        self.target.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.lr, fused=True)  # fused: ~3x faster on CPU
        self.grad_hook = None
        self.updates = 0

    def modules(self) -> list[nn.Module]:
        """Every network whose weights learners must agree on (for :func:`params_digest`)."""
        return [self.q, self.target]

    def learn(self, batch: dict) -> tuple[float, np.ndarray]:
        """One gradient step on ``batch`` (a buffer sample); returns (loss, |TD errors|).

        ``batch`` holds ``obs, action, reward, next_obs, done`` and ``weights`` (importance
        weights); the returned priorities line up with ``batch["indices"]``.
        """
        cfg = self.cfg
        obs = torch.from_numpy(batch["obs"])
        actions = torch.from_numpy(batch["action"]).long().unsqueeze(1)
        rewards = torch.from_numpy(batch["reward"])
        next_obs = torch.from_numpy(batch["next_obs"])
        not_done = 1.0 - torch.from_numpy(batch["done"]).float()
        weights = torch.from_numpy(batch["weights"])

        with torch.no_grad():
            if cfg.double_q:
                next_actions = self.q(next_obs).argmax(1, keepdim=True)
                next_q = self.target(next_obs).gather(1, next_actions).squeeze(1)
            else:
                next_q = self.target(next_obs).max(1).values
            td_target = rewards + cfg.gamma * not_done * next_q
        q = self.q(obs).gather(1, actions).squeeze(1)
        loss = (weights * F.smooth_l1_loss(q, td_target, reduction="none")).mean()

        self.optimizer.zero_grad()
        loss.backward()
        if self.grad_hook is not None:
            self.grad_hook(self.q.parameters())
        if cfg.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(self.q.parameters(), cfg.max_grad_norm)
        self.optimizer.step()

        self.updates += 1
        if self.updates % cfg.target_update_every == 0:
            self._update_target()
        return float(loss.detach()), (td_target - q).detach().abs().numpy().astype(np.float64)

    @torch.no_grad()
    def _update_target(self) -> None:
        tau = self.cfg.tau
        if tau >= 1.0:
            self.target.load_state_dict(self.q.state_dict())
            return
        torch._foreach_lerp_(list(self.target.parameters()), list(self.q.parameters()), tau)  # one call, all tensors

    @property
    def policy_net(self) -> nn.Module:
        """The network actors run (the online Q network)."""
        return self.q

    def get_flat_weights(self) -> torch.Tensor:
        """The policy's weights (the online Q network) as one float32 vector (a copy)."""
        return flat_params(self.q)

    def digest(self) -> str:
        return params_digest(*self.modules())
