"""The actor/learner training loop over any registered replay variant.

    from replaybench.impl.rl import TrainConfig, train
    result = train(TrainConfig(algo="dqn", env="CartPole-v1", buffer="kary-aligned", actors=2, learners=1,
                               steps=50_000, seed=0))
    result.env_steps_per_s, result.time_to_threshold_s, result.profiles

Packages and modules, one job each:

==============  ===============================================================
config          TrainConfig: the run, validated up front (fields, algorithm, engine, env)
algorithms/     name -> algorithm (base: the contract; dqn, td3, a2c; nets, optim)
engines/        name -> engine (sequential, process, ray, dataflow, paac), each with its checks
gossip/         GALA/PALA: learners that gossip their models (exchange, learner, launch)
common/         errors, TrainResult, envs, seeding, profiler, processes, shared state,
                vector stepping, the local replay buffer: what every engine shares
==============  ===============================================================
"""

from __future__ import annotations

from replaybench.impl.rl import engines
from replaybench.impl.rl.common.errors import ConfigError, InjectedFailure, WorkerFailed
from replaybench.impl.rl.common.result import TrainResult
from replaybench.impl.rl.config import TrainConfig

__all__ = ["TrainConfig", "TrainResult", "ConfigError", "InjectedFailure", "WorkerFailed", "train"]


def train(cfg: TrainConfig, progress=None) -> TrainResult:
    """Run ``cfg`` on its engine (:attr:`TrainConfig.engine`: the algorithm's own, e.g. PAAC
    for a2c; the sequential baseline when ``actors`` or ``learners`` is 0; else
    ``cfg.backend``).

    ``progress(env_steps, updates, recent_mean_return, episodes)`` is called a few times per
    second from this process, and once at the end; ``episodes`` is the run's finished
    episodes so far, ``(env_steps, wall_s, return)`` in the order recorded (the list the
    result's ``episodes`` will be: it only grows, and the callback must not change it; the Ray
    engine passes ``()`` until its last call, which has them all). A bad ``cfg`` raises
    ConfigError before any work starts (:meth:`TrainConfig.validate`, which every engine
    calls first)."""
    return engines.get(cfg.engine).run(cfg, progress)
