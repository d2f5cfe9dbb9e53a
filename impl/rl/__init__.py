"""The actor/learner training loop over any registered replay variant.

    from replaybench.impl.rl import TrainConfig, train
    result = train(TrainConfig(algo="dqn", env="CartPole-v1", buffer="kary-aligned", actors=2, learners=1,
                               steps=50_000, seed=0))
    result.env_steps_per_s, result.time_to_threshold_s, result.profiles

Modules, one job each:

==============  ===============================================================
base            the algorithm contract: AlgoConfig, Actor and Learner protocols, ConfigError
dqn, td3        the algorithms (config dataclass, network builders, actor, learner)
a2c             synchronous advantage actor-critic (PAAC's), with its own loop in paac
algorithms      name -> algorithm
envs            environments, transition schema, thresholds, episode log, staging, EnvRunner
config          TrainConfig (the run, validated up front) and TrainResult (what it measured)
seeding         RunSeeds: every process's, env's and network's seed from one SeedSequence
replay          building and warming up the in-process buffer
profiler        per-section perf_counter accumulators
sequential      the one-process baseline loop
shared          counters, rate limiter and weight broadcast in shared memory
parallel        A actor + L learner processes over the shared buffer
stepping        SharedVectorEnv: n_e envs over n_w worker processes in lock step (PAAC's runners)
paac            the PAAC loop: batched inference over a SharedVectorEnv, one A2C update per t_max steps
ray_backend     the parallel loop on a Ray cluster (ray_workers: its server, actors, learners)
gossip          gossip averaging of models between learners by point-to-point messages (GALA/PALA)
gossip_train    one gossip / all-reduce / independent A2C learner process and the run's result
gossip_launch   starts a run's learner processes on loopback nodes or machines, as torchrun does
==============  ===============================================================
"""

from __future__ import annotations

from .base import ConfigError
from .config import InjectedFailure, TrainConfig, TrainResult, WorkerFailed

__all__ = ["TrainConfig", "TrainResult", "ConfigError", "InjectedFailure", "WorkerFailed", "train"]


def train(cfg: TrainConfig, progress=None) -> TrainResult:
    """Run ``cfg``: the algorithm's own loop when it has one (``a2c``: the PAAC loop), else
    the sequential baseline when ``actors`` or ``learners`` is 0, else the parallel loop on
    ``cfg.backend`` (processes, Ray, or the static dataflow).

    ``progress(env_steps, updates, recent_mean_return, episodes)`` is called a few times per
    second from this process, and once at the end; ``episodes`` is the run's finished
    episodes so far, ``(env_steps, wall_s, return)`` in the order recorded (the list the
    result's ``episodes`` will be: it only grows, and the callback must not change it; the Ray
    backend passes ``()`` until its last call, which has them all). A bad ``cfg`` raises
    ConfigError before any work starts (:meth:`TrainConfig.validate`)."""
    from . import algorithms

    own_loop = algorithms.get(cfg.algo).run
    if own_loop is not None:
        return own_loop(cfg, progress)
    if cfg.sequential:
        from .sequential import run_sequential

        return run_sequential(cfg, progress)
    if cfg.backend == "ray":
        from .ray_backend import run_ray

        return run_ray(cfg, progress)
    if cfg.backend == "dataflow":
        from replaybench.impl.dataflow.train import run_dataflow

        return run_dataflow(cfg, progress)
    from .parallel import run_parallel

    return run_parallel(cfg, progress)
