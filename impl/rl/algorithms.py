"""The algorithms the training loops can run, by name: config class, actor and learner.

Both loops only use this interface, so another algorithm is one module plus one entry here:

- ``Config.for_env(env_id, **overrides)``; fields ``batch_size``, ``buffer_capacity``,
  ``learning_starts``, ``updates_per_step``, ``per_alpha``, ``per_eps`` and ``beta(env_steps)``.
- ``Actor(spaces, cfg, seed, net=None)`` with ``act(obs, env_steps)``, ``env_action(a)`` and
  ``set_flat_weights(flat)``.
- ``Learner(spaces, cfg, seed)`` with ``learn(batch) -> (loss, priorities)``, ``grad_hook``,
  ``policy_net``, ``get_flat_weights()``, ``modules()`` and ``digest()``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dqn import DQNActor, DQNConfig, DQNLearner
from .td3 import TD3Actor, TD3Config, TD3Learner

__all__ = ["Algorithm", "ALGORITHMS", "get"]


@dataclass(frozen=True)
class Algorithm:
    name: str
    config_cls: type
    actor_cls: type
    learner_cls: type
    default_env: str
    action_kind: str  # "discrete" or "continuous"


ALGORITHMS = {
    "dqn": Algorithm("dqn", DQNConfig, DQNActor, DQNLearner, "CartPole-v1", "discrete"),
    "td3": Algorithm("td3", TD3Config, TD3Actor, TD3Learner, "Pendulum-v1", "continuous"),
}


def get(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}") from None
