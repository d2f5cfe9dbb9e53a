"""TD3 with proportional prioritized replay, for continuous-action gymnasium environments.

Twin Delayed DDPG (Fujimoto et al., 2018): two critics and the smaller of their targets,
target-policy smoothing noise, and policy updates every ``policy_delay`` critic updates. The
critic loss is weighted by importance-sampling weights and the new priority of a transition
is the mean |TD error| of the two critics (Schaul et al., 2016). Read top to bottom:

1. :class:`TD3Config`: every argument, documented, with per-environment presets.
2. :func:`build_actor`, :func:`build_critic`: the MLPs. Actions live in [-1, 1] everywhere
   inside the agent and the buffer; :meth:`TD3Actor.env_action` scales them to the bounds.
3. :class:`TD3Actor`: ``act_batch(obs, env_steps)``: uniform random before ``learning_starts``,
   then the deterministic policy plus Gaussian noise, on a CPU copy of the policy network.
4. :class:`TD3Learner`: actor, two critics, their targets and optimizers, on the learner's
   ``device``; ``learn(batch) -> (critic loss, new_priorities)``; ``get_flat_weights()`` (the
   policy, a host copy). On the CPU the update runs as compiled kernels by default
   (:attr:`TD3Config.update`, :class:`~impl.rl.algorithms.compiled_step.CompiledTD3Step`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from replaybench.impl.rl.algorithms import mlp_kernels as mk
from replaybench.impl.rl.algorithms.base import Actor, AlgoConfig, Learner, check_range, check_update, resolve_update
from replaybench.impl.rl.algorithms.compiled_step import CompiledTD3Step
from replaybench.impl.rl.algorithms.nets import load_flat_params, mlp, update_target
from replaybench.impl.rl.common.device import host_arrays, on_device
from torch import nn

__all__ = ["TD3Config", "build_actor", "build_critic", "TD3Actor", "TD3Learner"]


@dataclass
class TD3Config(AlgoConfig):
    """Arguments of TD3 with prioritized replay. The replay-loop fields (``batch_size``,
    ``buffer_capacity``, ``learning_starts``, ``updates_per_step``, ``per_*``) are documented
    in :class:`~impl.rl.algorithms.base.AlgoConfig`; TD3 changes four defaults."""

    batch_size: int = 256
    buffer_capacity: int = 100_000
    updates_per_step: float = 1.0
    per_beta_steps: int = 30_000
    lr_actor: float = 1e-3
    """Adam learning rate of the policy."""
    lr_critic: float = 1e-3
    """Adam learning rate of both critics."""
    gamma: float = 0.99
    """Discount factor."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the policy and of each critic."""
    tau: float = 0.005
    """Polyak factor of the target networks, applied at every policy update."""
    exploration_noise: float = 0.1
    """Std of the Gaussian noise added to the policy's action (actions scaled to [-1, 1]).
    Before ``learning_starts`` the actor draws uniformly random actions instead."""
    policy_noise: float = 0.2
    """Std of the target-policy smoothing noise ..."""
    noise_clip: float = 0.5
    """... clipped to +-noise_clip."""
    policy_delay: int = 2
    """Critic updates per policy (and target) update."""
    max_grad_norm: float | None = None
    """Clip each network's gradient norm (None: no clipping)."""
    update: str = "auto"
    """How an update runs: ``"torch"``, torch's eager step (the reference, and the only one off
    the CPU); ``"numba"``, the compiled kernels of :mod:`impl.rl.algorithms.td3_kernels` (CPU
    only: the same arithmetic within float32 rounding, the same smoothing noise from torch's
    generator, a fraction of the eager step's dispatch; their first use in a process loads or
    compiles them, which a run's warm-up pays); ``"auto"`` (the default), numba on the CPU and
    torch elsewhere. :func:`~impl.rl.algorithms.base.resolve_update` gives the choice a run
    makes."""

    PRESETS = {}  # env id -> overrides, filled below the class

    def validate(self) -> None:
        super().validate()
        check_range(self, "lr_actor", 0.0, low_open=True)
        check_range(self, "lr_critic", 0.0, low_open=True)
        check_range(self, "gamma", 0.0, 1.0)
        check_range(self, "hidden", 1)
        check_range(self, "tau", 0.0, 1.0, low_open=True)
        check_range(self, "exploration_noise", 0.0)
        check_range(self, "policy_noise", 0.0)
        check_range(self, "noise_clip", 0.0)
        check_range(self, "policy_delay", 1)
        check_update(self)


# Pendulum: the usual TD3 settings with a smaller network and batch (CPU-bound here); the
# sequential loop reaches a mean return of -200 over 20 episodes at 9,000 env steps (seed 0).
TD3Config.PRESETS.update({
    "Pendulum-v1": dict(hidden=(128, 128), batch_size=128, buffer_capacity=50_000, learning_starts=1_000,
                        updates_per_step=1.0, per_beta_steps=20_000),
})


def build_actor(obs_dim: int, act_dim: int, hidden) -> nn.Sequential:
    """MLP ``obs -> action in [-1, 1]`` (tanh output)."""
    return mlp([obs_dim, *hidden, act_dim], out_activation=nn.Tanh())


def build_critic(obs_dim: int, act_dim: int, hidden) -> nn.Sequential:
    """MLP ``concat(obs, action) -> Q``."""
    return mlp([obs_dim + act_dim, *hidden, 1])


def _spaces(spaces):
    obs_space, act_space = spaces
    return int(np.prod(obs_space.shape)), int(np.prod(act_space.shape))


class TD3Actor(Actor):
    """Deterministic policy plus Gaussian exploration noise, actions in [-1, 1] (an
    :class:`~impl.rl.algorithms.base.Actor`; ``seed``, an int or SeedSequence, seeds the noise).

    ``spaces`` is (observation_space, action_space); pass ``net`` to share a network (the
    sequential loop shares the learner's). Cost per ``act_batch``: one forward pass of the
    batch: compiled (:func:`~impl.rl.algorithms.mlp_kernels.forward_tanh`) when the update
    resolves to ``"numba"`` (:func:`~impl.rl.algorithms.base.resolve_update`; the network is then
    a view of a flat vector, its own or the shared learner's), else torch's; the exploration
    draws are the same either way. Thread-safety: none.
    """

    def __init__(self, spaces, cfg: TD3Config, seed, net: nn.Module | None = None):
        obs_dim, self.act_dim = _spaces(spaces)
        act_space = spaces[1]
        self.cfg = cfg
        self.pi = net if net is not None else build_actor(obs_dim, self.act_dim, cfg.hidden)
        self.low = np.asarray(act_space.low, dtype=np.float32)
        self.high = np.asarray(act_space.high, dtype=np.float32)
        self.rng = np.random.default_rng(seed)
        # With the compiled update the forward is compiled too (one call, no torch dispatch): on
        # the vector of a shared compiled learner's policy, or on this actor's own copy
        self._flat = mk.bind_for_acting(self.pi, (obs_dim, *cfg.hidden, self.act_dim),
                                        own=net is None and resolve_update(cfg, "cpu") == "numba")
        self._scratch: dict[int, tuple] = {}
        if self._flat is not None:  # load (or compile) the kernel now, before a run's clock starts
            self._policy(np.zeros((1, obs_dim), np.float32))

    def _policy(self, obs) -> np.ndarray:
        """The policy's actions (float32, rows x act_dim) for the rows of ``obs``: compiled on a
        bound vector (a view of this actor's scratch, valid until the next call), else one torch
        forward."""
        obs = np.ascontiguousarray(obs, dtype=np.float32).reshape(len(obs), -1)
        if self._flat is None:
            with torch.inference_mode():
                return self.pi(torch.from_numpy(obs)).numpy()
        layout, flat = self._flat
        scratch = self._scratch.get(len(obs))
        if scratch is None:
            scratch = self._scratch[len(obs)] = tuple(np.empty((len(obs), int(d)), np.float32)
                                                      for d in layout.dims[1:])
        return mk.forward_tanh(flat, layout.offsets, layout.dims, obs, scratch)

    def act_batch(self, obs: np.ndarray, env_steps: int) -> np.ndarray:
        """Scaled actions in [-1, 1]^act_dim, one row per row of ``obs`` (store these; step
        the env with :meth:`env_action`); one forward pass for the batch."""
        shape = (len(obs), self.act_dim)
        if env_steps < self.cfg.learning_starts:
            return self.rng.uniform(-1.0, 1.0, shape).astype(np.float32)
        a = self._policy(obs) + self.rng.normal(0.0, self.cfg.exploration_noise, shape)
        return np.clip(a, -1.0, 1.0).astype(np.float32)

    def greedy_batch(self, obs: np.ndarray) -> np.ndarray:
        """The deterministic policy's actions in [-1, 1] for each row of ``obs``, without the
        exploration noise: what an evaluation plays (:mod:`impl.rl.common.snapshots`)."""
        return np.clip(self._policy(obs), -1.0, 1.0).astype(np.float32)

    def env_action(self, action: np.ndarray) -> np.ndarray:
        """Map a [-1, 1] action to the environment's bounds."""
        return self.low + (action + 1.0) * 0.5 * (self.high - self.low)

    def set_flat_weights(self, flat) -> None:
        """Load the policy from a vector made by :meth:`TD3Learner.get_flat_weights`."""
        if self._flat is not None:  # in place: the network's parameters are views of the vector
            self._flat[1][:] = flat.numpy() if isinstance(flat, torch.Tensor) else np.asarray(flat)
        else:
            load_flat_params(self.pi, flat)


class TD3Learner(Learner):
    """Policy, twin critics, target copies of all three, one Adam per network (a
    :class:`~impl.rl.algorithms.base.Learner`; ``seed`` seeds torch: initial weights and smoothing noise).

    ``grad_hook(params)`` (set by the parallel loop to average gradients across learners) is
    called after each backward, once for the critics and, on policy updates, once for the
    policy. Cost per ``learn``: forward of target policy + 2 target critics + 2 critics, one
    backward; every ``policy_delay``-th call also a policy forward/backward and 3 Polyak
    updates. ``device`` (:mod:`impl.rl.common.device`) holds the six networks and both Adams'
    state (built on the CPU from ``seed``, then moved); off the CPU the smoothing noise comes
    from the device's generator (seeded by the same ``torch.manual_seed``), and each ``learn``
    brings the loss and priorities back in one device-to-host copy. With ``cfg.update``
    resolved to ``"numba"`` (:func:`~impl.rl.algorithms.base.resolve_update`, before anything is
    built) the same arithmetic, the same smoothing noise and the same hook calls run as
    compiled kernels (:class:`~impl.rl.algorithms.compiled_step.CompiledTD3Step`) on flat
    vectors that the six networks' parameters are views of, and both optimizers are None.
    Thread-safety: none.
    """

    def __init__(self, spaces, cfg: TD3Config, seed: int, device=torch.device("cpu")):
        obs_dim, act_dim = _spaces(spaces)
        self.cfg = cfg
        self.device = torch.device(device)
        self.update = resolve_update(cfg, self.device)  # a refused choice raises before any work
        torch.manual_seed(seed)  # same seed -> same initial weights on every learner
        self.pi = build_actor(obs_dim, act_dim, cfg.hidden)
        self.q1 = build_critic(obs_dim, act_dim, cfg.hidden)
        self.q2 = build_critic(obs_dim, act_dim, cfg.hidden)
        self.pi_target, self.q1_target, self.q2_target = (build_actor(obs_dim, act_dim, cfg.hidden),
                                                         build_critic(obs_dim, act_dim, cfg.hidden),
                                                         build_critic(obs_dim, act_dim, cfg.hidden))
        for net in (self.pi, self.q1, self.q2, self.pi_target, self.q1_target, self.q2_target):
            net.to(self.device)
        for target, net in ((self.pi_target, self.pi), (self.q1_target, self.q1), (self.q2_target, self.q2)):
            target.load_state_dict(net.state_dict())
            target.requires_grad_(False)
        self.critic_params = [*self.q1.parameters(), *self.q2.parameters()]
        self.grad_hook = None
        self.updates = 0
        if self.update == "numba":
            self._compiled = CompiledTD3Step(self.pi, self.q1, self.q2, self.pi_target, self.q1_target,
                                             self.q2_target, cfg)
            self.pi_optimizer = self.q_optimizer = None  # Adam's state is the compiled step's
            return
        self.pi_optimizer = torch.optim.Adam(self.pi.parameters(), lr=cfg.lr_actor, fused=True)
        self.q_optimizer = torch.optim.Adam(self.critic_params, lr=cfg.lr_critic, fused=True)

    def modules(self) -> list[nn.Module]:
        return [self.pi, self.q1, self.q2, self.pi_target, self.q1_target, self.q2_target]

    def learn(self, batch: dict) -> tuple[float, np.ndarray]:
        """One critic step (and every ``policy_delay``-th call a policy step); returns
        (critic loss, mean |TD error| of the two critics) lined up with ``batch["indices"]``."""
        cfg, dev = self.cfg, self.device
        if self.update == "numba":
            self.updates += 1
            return self._compiled.learn(batch, self.updates % cfg.policy_delay == 0, self.grad_hook)
        obs = on_device(batch["obs"], dev)
        actions = on_device(batch["action"], dev)
        rewards = on_device(batch["reward"], dev).unsqueeze(1)
        next_obs = on_device(batch["next_obs"], dev)
        not_done = 1.0 - on_device(batch["done"], dev).float().unsqueeze(1)
        weights = on_device(batch["weights"], dev).unsqueeze(1)

        with torch.no_grad():
            noise = (torch.randn_like(actions) * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
            next_actions = (self.pi_target(next_obs) + noise).clamp(-1.0, 1.0)
            next_in = torch.cat([next_obs, next_actions], 1)
            next_q = torch.min(self.q1_target(next_in), self.q2_target(next_in))
            td_target = rewards + cfg.gamma * not_done * next_q
        q_in = torch.cat([obs, actions], 1)
        q1, q2 = self.q1(q_in), self.q2(q_in)
        loss = (weights * ((q1 - td_target) ** 2 + (q2 - td_target) ** 2)).mean()

        self.q_optimizer.zero_grad()
        loss.backward()
        self._sync_and_clip(self.critic_params)
        self.q_optimizer.step()
        self.updates += 1

        if self.updates % cfg.policy_delay == 0:
            pi_loss = -self.q1(torch.cat([obs, self.pi(obs)], 1)).mean()
            self.pi_optimizer.zero_grad()
            pi_loss.backward()  # also leaves gradients on the critics; q_optimizer zeroes them next time
            self._sync_and_clip(list(self.pi.parameters()))
            self.pi_optimizer.step()
            for target, net in ((self.pi_target, self.pi), (self.q1_target, self.q1), (self.q2_target, self.q2)):
                update_target(target, net, cfg.tau)

        td = 0.5 * ((td_target - q1).abs() + (td_target - q2).abs())
        loss_h, td_h = host_arrays(loss, td.detach().squeeze(1))  # one device-to-host copy off the CPU
        return float(loss_h), td_h.astype(np.float64)

    def _sync_and_clip(self, params: list) -> None:
        if self.grad_hook is not None:
            self.grad_hook(params)
        if self.cfg.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)

    @property
    def policy_net(self) -> nn.Module:
        """The network actors run (the policy)."""
        return self.pi
