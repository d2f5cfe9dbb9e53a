"""The algorithms the training loops can run, by name.

The replay loops use only the contract of :mod:`impl.rl.base` (AlgoConfig, Actor, Learner),
so another replay algorithm is one module plus one entry in :data:`ALGORITHMS`. An on-policy
algorithm brings its own loop (``run``): A2C runs the PAAC loop of :mod:`impl.rl.paac`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .a2c import A2CConfig, A2CLearner
from .base import Actor, AlgoConfig, ConfigError, Learner
from .dqn import DQNActor, DQNConfig, DQNLearner
from .td3 import TD3Actor, TD3Config, TD3Learner

__all__ = ["Algorithm", "ALGORITHMS", "get"]


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: ``actor_cls(spaces, cfg, seed, net=None)`` and ``learner_cls(spaces,
    cfg, seed)`` build its halves from a ``config_cls`` (an AlgoConfig); ``action_kind``
    ("discrete" or "continuous", see :data:`impl.rl.envs.ACTION_KINDS`) is the action space
    it handles. ``run(cfg, progress) -> TrainResult``, when set, is the algorithm's own loop,
    which :func:`impl.rl.train` calls instead of the replay loops (then ``actor_cls`` is None
    and ``config_cls`` needs only ``for_env`` and ``validate``)."""

    name: str
    config_cls: type[AlgoConfig]
    actor_cls: Callable[..., Actor] | None
    learner_cls: Callable[..., Learner]
    default_env: str
    action_kind: str
    run: Callable | None = None


def _run_paac(cfg, progress=None):
    from .paac import run_paac  # imported on use: paac imports config, which imports this module

    return run_paac(cfg, progress)


ALGORITHMS = {
    "dqn": Algorithm("dqn", DQNConfig, DQNActor, DQNLearner, "CartPole-v1", "discrete"),
    "td3": Algorithm("td3", TD3Config, TD3Actor, TD3Learner, "Pendulum-v1", "continuous"),
    "a2c": Algorithm("a2c", A2CConfig, None, A2CLearner, "CartPole-v1", "discrete", run=_run_paac),
}


def get(name: str) -> Algorithm:
    """The algorithm called ``name``; raises ConfigError (field "algo") for an unknown name."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ConfigError("algo", name, f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}") from None
