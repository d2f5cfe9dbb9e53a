"""The algorithms the training loops can run, by name.

The replay loops use only the contract of :mod:`impl.rl.algorithms.base` (AlgoConfig, Actor, Learner),
so another replay algorithm is one module plus one registration in :data:`ALGORITHMS`. An on-policy
algorithm names its own engine as data (``engine``): A2C runs on ``paac``
(:mod:`impl.rl.engines.paac`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from replaybench.impl.rl.algorithms.a2c import A2CConfig, A2CLearner
from replaybench.impl.rl.algorithms.base import Actor, AlgoConfig, Learner
from replaybench.impl.rl.algorithms.dqn import DQNActor, DQNConfig, DQNLearner
from replaybench.impl.rl.algorithms.td3 import TD3Actor, TD3Config, TD3Learner
from replaybench.impl.rl.common.errors import ConfigError
from replaybench.registry import Registry, UnknownName

__all__ = ["Algorithm", "ALGORITHMS", "get"]


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: ``actor_cls(spaces, cfg, seed, net=None)`` and ``learner_cls(spaces,
    cfg, seed)`` build its halves from a ``config_cls`` (an AlgoConfig); ``action_kind``
    ("discrete" or "continuous", see :data:`impl.rl.common.envs.ACTION_KINDS`) is the action space
    it handles. ``engine``, when set, names the algorithm's own engine (in
    :data:`impl.rl.engines.ENGINES`), which :func:`impl.rl.train` runs instead of the replay
    loops (then ``actor_cls`` is None and ``config_cls`` needs only ``for_env`` and ``validate``)."""

    name: str
    config_cls: type[AlgoConfig]
    actor_cls: Callable[..., Actor] | None
    learner_cls: Callable[..., Learner]
    default_env: str
    action_kind: str
    engine: str | None = None



ALGORITHMS: Registry[Algorithm] = Registry("algorithm")
for _algo in (Algorithm("dqn", DQNConfig, DQNActor, DQNLearner, "CartPole-v1", "discrete"),
              Algorithm("td3", TD3Config, TD3Actor, TD3Learner, "Pendulum-v1", "continuous"),
              Algorithm("a2c", A2CConfig, None, A2CLearner, "CartPole-v1", "discrete", engine="paac")):
    ALGORITHMS.register(_algo.name, _algo, origin=__name__)


def get(name: str) -> Algorithm:
    """The algorithm called ``name``; raises ConfigError (field "algo", the registry's
    message) for an unknown name."""
    try:
        return ALGORITHMS.get(name)
    except UnknownName as err:
        raise ConfigError("algo", name, str(err)) from None
