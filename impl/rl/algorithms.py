"""The algorithms the training loops can run, by name.

The loops use only the contract of :mod:`impl.rl.base` (AlgoConfig, Actor, Learner), so
another algorithm is one module plus one entry in :data:`ALGORITHMS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .base import Actor, AlgoConfig, ConfigError, Learner
from .dqn import DQNActor, DQNConfig, DQNLearner
from .td3 import TD3Actor, TD3Config, TD3Learner

__all__ = ["Algorithm", "ALGORITHMS", "get"]


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: ``actor_cls(spaces, cfg, seed, net=None)`` and ``learner_cls(spaces,
    cfg, seed)`` build its halves from a ``config_cls`` (an AlgoConfig); ``action_kind``
    ("discrete" or "continuous", see :data:`impl.rl.envs.ACTION_KINDS`) is the action space
    it handles."""

    name: str
    config_cls: type[AlgoConfig]
    actor_cls: Callable[..., Actor]
    learner_cls: Callable[..., Learner]
    default_env: str
    action_kind: str


ALGORITHMS = {
    "dqn": Algorithm("dqn", DQNConfig, DQNActor, DQNLearner, "CartPole-v1", "discrete"),
    "td3": Algorithm("td3", TD3Config, TD3Actor, TD3Learner, "Pendulum-v1", "continuous"),
}


def get(name: str) -> Algorithm:
    """The algorithm called ``name``; raises ConfigError (field "algo") for an unknown name."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ConfigError("algo", name, f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}") from None
