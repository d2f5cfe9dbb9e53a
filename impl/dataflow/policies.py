"""Per-agent policies evaluated as one node: the multi-agent inference benchmark's policy side.

In the Lingua Franca paper's multi-agent benchmark every agent has its own policy network
(``obs -> 64 -> actions``, softmax, argmax) in its own actor, and a server sends each the joint
observation and gathers the actions every step. With the topology fixed, the agents' networks
can instead be stacked into one set of batched weights and evaluated for all agents in one
batched matrix product (:meth:`PolicyBank.act`), the multi-agent form of PAAC's one forward
for all environments. :meth:`PolicyBank.module` gives agent i's network as an ordinary
``torch.nn.Module`` with the same weights, for backends with one policy per actor.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["PolicyBank"]


class PolicyBank:
    """``n_agents`` policies ``obs_dim -> hidden -> n_actions`` (ReLU, softmax), weights drawn
    with torch's default Linear initialisation under ``seed``.

    Cost of :meth:`act`: two batched matrix products of ``(n_agents, 1, obs_dim)`` rows, i.e.
    one forward for all agents instead of ``n_agents``. Thread-safety: read-only after
    construction.
    """

    def __init__(self, n_agents: int, obs_dim: int, n_actions: int, hidden: int = 64, seed: int = 0):
        for name, value in (("n_agents", n_agents), ("obs_dim", obs_dim), ("n_actions", n_actions),
                            ("hidden", hidden)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        torch.manual_seed(seed)
        nets = [self._net(obs_dim, hidden, n_actions) for _ in range(n_agents)]
        with torch.no_grad():
            self.w1 = torch.stack([n[0].weight.T for n in nets]).contiguous()  # (agents, obs, hidden)
            self.b1 = torch.stack([n[0].bias for n in nets])[:, None, :]
            self.w2 = torch.stack([n[2].weight.T for n in nets]).contiguous()  # (agents, hidden, actions)
            self.b2 = torch.stack([n[2].bias for n in nets])[:, None, :]
        self._nets = nets
        self.n_agents, self.obs_dim, self.n_actions = n_agents, obs_dim, n_actions

    @staticmethod
    def _net(obs_dim: int, hidden: int, n_actions: int) -> nn.Sequential:
        return nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, n_actions), nn.Softmax(-1))

    def module(self, agent: int) -> nn.Module:
        """Agent ``agent``'s policy as a module (the same weights as the bank's)."""
        return self._nets[agent]

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions ``(n_agents,)`` int64 for joint observations ``(n_agents, obs_dim)``."""
        x = torch.as_tensor(np.asarray(obs, dtype=np.float32)).reshape(self.n_agents, 1, self.obs_dim)
        h = torch.relu(torch.baddbmm(self.b1, x, self.w1))
        probs = torch.softmax(torch.baddbmm(self.b2, h, self.w2), dim=-1)
        return probs.argmax(-1).reshape(self.n_agents).numpy()
