"""DQN with proportional prioritized replay, for discrete-action gymnasium environments.

Deep Q-learning (Mnih et al., 2015) with double-Q targets (van Hasselt et al., 2016), a Huber
loss weighted by importance-sampling weights and |TD error| as the new priority (Schaul et al.,
2016). Read top to bottom:

1. :class:`DQNConfig`: every argument, documented, with per-environment presets.
2. :func:`build_q_network`: the MLP ``obs -> Q(obs, .)``.
3. :class:`DQNActor`: epsilon-greedy ``act_batch(obs, env_steps)`` (one forward for a batch
   of observations) on a CPU copy of the Q network.
   Actor processes hold one each and refresh it with :meth:`DQNActor.set_flat_weights`.
4. :class:`DQNLearner`: online and target networks and the optimizer, on the learner's
   ``device``; ``learn(batch) -> (loss, new_priorities)``; ``get_flat_weights()`` (a host
   copy) for the broadcast.

The replay loop around them lives in :mod:`impl.rl.engines.sequential` and :mod:`impl.rl.engines.process`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from replaybench.impl.rl.algorithms.base import (UPDATES, Actor, AlgoConfig, Learner, PendingLearn, check_range,
                                                 check_update, resolve_update)
from replaybench.impl.rl.algorithms import mlp_kernels as mk
from replaybench.impl.rl.algorithms.compiled_step import CompiledDQNStep
from replaybench.impl.rl.algorithms.nets import load_flat_params, mlp, update_target
from replaybench.impl.cuda_graph import GraphedStep
from replaybench.impl.rl.common.device import HostCopies, on_device
from replaybench.impl.rl.common.errors import ConfigError
from torch import nn

__all__ = ["DQNConfig", "UPDATES", "resolve_update", "build_q_network", "DQNActor", "DQNLearner"]

_INPUTS = ("obs", "action", "reward", "next_obs", "done", "weights")  # the batch fields an update reads


@dataclass
class DQNConfig(AlgoConfig):
    """Arguments of DQN with prioritized replay. The replay-loop fields (``batch_size``,
    ``buffer_capacity``, ``learning_starts``, ``updates_per_step``, ``per_*``) and their
    documentation are :class:`~impl.rl.algorithms.base.AlgoConfig`'s; DQN keeps its defaults."""

    lr: float = 1e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    hidden: tuple[int, ...] = (128, 128)
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
    """... over this many env steps, then constant (unless ``eps_decay_updates`` is set)."""
    eps_decay_updates: int = 0
    """When > 0: the fall takes this many learner *updates* instead, so that changing the
    replay ratio leaves epsilon at a given update count unchanged (an update count is an env
    step count through the ratio every engine holds: updates = (env_steps - learning_starts)
    x updates_per_step; epsilon stays at eps_start until learning starts)."""
    double_q: bool = True
    """Select the next action with the online network, evaluate it with the target network."""
    max_grad_norm: float | None = 10.0
    """Clip the gradient's global norm (None: no clipping)."""
    update: str = "auto"
    """How an update runs: ``"torch"``, torch's eager step (the reference, and the only one off
    the CPU); ``"numba"``, the compiled kernels of :mod:`impl.rl.algorithms.mlp_kernels` (CPU
    only: the same arithmetic within float32 rounding, a fraction of the eager step's dispatch;
    their first use in a process loads or compiles them, which a run's warm-up pays); ``"auto"``
    (the default), numba on the CPU and torch elsewhere: the fastest the learner benchmark
    (``learner`` suites) measured. :func:`~impl.rl.algorithms.base.resolve_update` gives the
    choice a run makes."""
    cuda_graph: bool = True
    """On a CUDA device, replay each update as one captured CUDA graph after 3 eager ones
    (:mod:`impl.cuda_graph`: one launch instead of ~60, the same arithmetic).
    Ignored on the CPU and while a ``grad_hook`` (L > 1 learners) is set: the hook runs on the
    host between backward and the step."""

    PRESETS = {}  # filled below the class: env id -> overrides

    def validate(self) -> None:
        super().validate()
        check_range(self, "lr", 0.0, low_open=True)
        check_range(self, "gamma", 0.0, 1.0)
        check_range(self, "hidden", 1)
        check_range(self, "target_update_every", 1)
        check_range(self, "tau", 0.0, 1.0, low_open=True)
        check_range(self, "eps_start", 0.0, 1.0)
        check_range(self, "eps_end", 0.0, 1.0)
        check_range(self, "eps_decay_updates", 0)
        check_update(self)
        if not isinstance(self.cuda_graph, bool):
            raise ConfigError("cuda_graph", self.cuda_graph, f"cuda_graph must be True or False, got {self.cuda_graph!r}")

    def epsilon(self, env_steps: int) -> float:
        if self.eps_decay_updates > 0:
            frac = min(1.0, self.updates_at(env_steps) / self.eps_decay_updates)
        else:
            frac = min(1.0, env_steps / max(1, self.eps_decay_steps))
        return self.eps_start + frac * (self.eps_end - self.eps_start)


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


class DQNActor(Actor):
    """Epsilon-greedy policy over a Q network (an :class:`~impl.rl.algorithms.base.Actor`).

    Parameters
    ----------
    spaces : (observation_space, action_space)
    cfg : DQNConfig
    seed : int or numpy.random.SeedSequence
        Seeds the exploration draws.
    net : nn.Module, optional
        Share this Q network (the sequential loop passes the learner's); otherwise a new CPU
        copy is built, to be filled with :meth:`set_flat_weights`.

    Cost per ``act_batch``: one forward pass of the batch: compiled
    (:func:`~impl.rl.algorithms.mlp_kernels.greedy`) when the update resolves to ``"numba"``
    (:func:`resolve_update`; the network is then a view of a flat vector, its own or the shared
    learner's), else torch's. Thread-safety: none.
    """

    def __init__(self, spaces, cfg: DQNConfig, seed, net: nn.Module | None = None):
        obs_dim, self.n_actions = _spaces(spaces)
        self.cfg = cfg
        self.q = net if net is not None else build_q_network(obs_dim, self.n_actions, cfg.hidden)
        self.rng = np.random.default_rng(seed)
        # With the compiled update the forward is compiled too (one call, no torch dispatch): on
        # the vector of a shared compiled learner's network, or on this actor's own copy
        self._flat = mk.bind_for_acting(self.q, (obs_dim, *cfg.hidden, self.n_actions),
                                        own=net is None and resolve_update(cfg, "cpu") == "numba")
        self._scratch: dict[int, tuple] = {}
        if self._flat is not None:  # load (or compile) the kernel now, before a run's clock starts
            self._greedy(np.zeros((1, obs_dim), np.float32))

    def _greedy(self, obs: np.ndarray) -> np.ndarray:
        """argmax Q per row of ``obs``: compiled on a bound vector, else one torch forward."""
        obs = np.ascontiguousarray(obs, dtype=np.float32).reshape(len(obs), -1)
        if self._flat is None:
            with torch.inference_mode():
                return self.q(torch.from_numpy(obs)).argmax(1).numpy()
        layout, flat = self._flat
        scratch = self._scratch.get(len(obs))
        if scratch is None:
            scratch = self._scratch[len(obs)] = tuple(np.empty((len(obs), int(d)), np.float32)
                                                      for d in layout.dims[1:])
        return mk.greedy(flat, layout.offsets, layout.dims, obs, scratch)

    def act_batch(self, obs: np.ndarray, env_steps: int) -> np.ndarray:
        """Actions (int64, one per row of ``obs``): each random with probability
        epsilon(env_steps), else argmax Q; one forward pass for the rows that need it."""
        explore = self.rng.random(len(obs)) < self.cfg.epsilon(env_steps)
        actions = np.empty(len(obs), dtype=np.int64)
        if not explore.all():
            actions[:] = self._greedy(obs)
        actions[explore] = self.rng.integers(self.n_actions, size=int(explore.sum()))
        return actions

    def greedy_batch(self, obs: np.ndarray) -> np.ndarray:
        """argmax Q of each row of ``obs`` (int64): the policy with exploration off, which an
        evaluation plays (:mod:`impl.rl.common.snapshots`)."""
        return self._greedy(obs)

    @staticmethod
    def env_action(action: int) -> int:
        """The action as the environment takes it (discrete: unchanged)."""
        return action

    def set_flat_weights(self, flat) -> None:
        """Load the Q network from a vector made by :meth:`DQNLearner.get_flat_weights`."""
        if self._flat is not None:  # in place: the network's parameters are views of the vector
            self._flat[1][:] = flat.numpy() if isinstance(flat, torch.Tensor) else np.asarray(flat)
        else:
            load_flat_params(self.q, flat)


class DQNLearner(Learner):
    """Online and target Q networks, Adam, and one update per :meth:`learn` call (a
    :class:`~impl.rl.algorithms.base.Learner`; ``seed`` seeds torch, so equal seeds give equal networks).

    ``grad_hook(params)``, when set, is called between backward and the optimizer step: the
    parallel loops set it to a gradient averager (the process engine's
    :class:`~impl.rl.common.allreduce.SharedGradientAverager`, Ray's
    :class:`~impl.rl.algorithms.nets.GradientAverager`) so L learners apply the same averaged gradient. ``device`` (:mod:`impl.rl.common.device`) holds both networks and
    Adam's state; they are built on the CPU from ``seed`` and moved there. Cost per ``learn``:
    forward of 3 networks (online on obs and next_obs, target on next_obs), one backward, one
    Adam step, and off the CPU one host-to-device copy per field given as a numpy array plus
    one device-to-host copy of the loss and priorities. With ``cfg.update`` resolved to
    ``"numba"`` (:func:`resolve_update`) the same arithmetic runs as compiled kernels
    (:class:`~impl.rl.algorithms.compiled_step.CompiledDQNStep`) on flat vectors that the
    networks' parameters are views of, and ``optimizer`` is None. Thread-safety: none.
    """

    def __init__(self, spaces, cfg: DQNConfig, seed: int, device=torch.device("cpu")):
        obs_dim, n_actions = _spaces(spaces)
        self.cfg = cfg
        self.device = torch.device(device)
        torch.manual_seed(seed)  # same seed -> same initial weights on every learner
        self.q = build_q_network(obs_dim, n_actions, cfg.hidden).to(self.device)
        self.target = build_q_network(obs_dim, n_actions, cfg.hidden).to(self.device)
        self.target.load_state_dict(self.q.state_dict())
        self.target.requires_grad_(False)
        self.update = resolve_update(cfg, self.device)
        self.grad_hook = None
        self.updates = 0
        if self.update == "numba":
            self._compiled = CompiledDQNStep(self.q, self.target, cfg)
            self.optimizer = None  # Adam's state is the compiled step's (its m, v and step)
            self._graphed = None
            return
        graphed = self.device.type == "cuda" and cfg.cuda_graph
        # fused: ~3x faster on CPU; capturable: Adam's step count on the device, as a graph needs
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.lr, fused=True, capturable=graphed)
        self._graphed = GraphedStep(self._step) if graphed else None
        self._to_host = HostCopies(self.device, 1 + cfg.batch_size)  # a loss and the batch's |TD errors|

    def modules(self) -> list[nn.Module]:
        """Every network whose weights learners must agree on (for :func:`params_digest`)."""
        return [self.q, self.target]

    def learn(self, batch: dict) -> tuple[float, np.ndarray]:
        """One gradient step on ``batch`` (a buffer sample); returns (loss, |TD errors|).

        ``batch`` holds ``obs, action, reward, next_obs, done`` and ``weights`` (importance
        weights), numpy arrays or tensors on the learner's device; the returned priorities line
        up with ``batch["indices"]``.
        """
        return self.learn_async(batch).result()

    def learn_async(self, batch: dict) -> PendingLearn:
        """:meth:`learn` with its result still on its way from the device (one queued
        device-to-host copy; on the CPU the update is done and nothing is copied)."""
        cfg, dev = self.cfg, self.device
        if self.update == "numba":
            loss, td = self._compiled.learn(batch, self.grad_hook)
            self.updates += 1
            if self.updates % cfg.target_update_every == 0:
                self._compiled.update_target(cfg.tau)
            return PendingLearn(done=(loss, td))
        inputs = {f: on_device(batch[f], dev) for f in _INPUTS}
        if self._graphed is not None and self.grad_hook is None:
            loss, td = self._graphed(inputs)
        else:
            loss, td = self._step(inputs)
        self.updates += 1
        if self.updates % cfg.target_update_every == 0:
            update_target(self.target, self.q, cfg.tau)
        return PendingLearn(host=self._to_host.start(loss, td))

    def _step(self, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradient step on device tensors: (loss, |TD errors|), both detached. Capture-safe
        (:class:`~impl.cuda_graph.GraphedStep`) when ``grad_hook`` is None: no host
        synchronisation, no branch on the data."""
        cfg = self.cfg
        obs, next_obs, rewards, weights = inputs["obs"], inputs["next_obs"], inputs["reward"], inputs["weights"]
        actions = inputs["action"].long().unsqueeze(1)
        not_done = 1.0 - inputs["done"].float()
        with torch.no_grad():
            if cfg.double_q:
                next_actions = self.q(next_obs).argmax(1, keepdim=True)
                next_q = self.target(next_obs).gather(1, next_actions).squeeze(1)
            else:
                next_q = self.target(next_obs).max(1).values
            td_target = rewards + cfg.gamma * not_done * next_q
        q = self.q(obs).gather(1, actions).squeeze(1)
        loss = (weights * F.smooth_l1_loss(q, td_target, reduction="none")).mean()

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_hook is not None:
            self.grad_hook(self.q.parameters())
        if cfg.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(self.q.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        return loss.detach(), (td_target - q).detach().abs()

    @property
    def policy_net(self) -> nn.Module:
        """The network actors run (the online Q network)."""
        return self.q
