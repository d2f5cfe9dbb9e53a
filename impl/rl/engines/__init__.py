"""The engines a training run can run on, by name: one module each, behind one registry.

An engine owns a run's processes from start to result. Its name is used alike by the CLI
(``--backend`` for the parallel replay loop), :attr:`TrainConfig.engine`, the result
(:attr:`TrainResult.engine`) and the rows:

==========  ========  ================================================================
sequential  replay    one process: act, store, learn in turn (``actors`` or ``learners`` 0)
process     parallel  A actor + L learner processes over one shared-memory buffer
ray         parallel  the same roles as Ray actors, anywhere in a Ray cluster
dataflow    parallel  one server infers for every env, env workers step in lock step
paac        own       A2C's synchronous loop (named by the algorithm, see below)
==========  ========  ================================================================

Which engine runs: the algorithm's own when it names one (:attr:`Algorithm.engine`: a2c ->
paac); else ``sequential`` when ``actors`` or ``learners`` is 0; else ``TrainConfig.backend``
(one of the ``parallel`` engines). Each engine states what it needs installed (``needs``:
modules imported to check; the Ray engine needs ``ray``) and checks a run against its own
limits before anything starts (``check(cfg, acfg)``, raising ConfigError naming the field).
Engine modules never import :mod:`impl.rl.config` at run time (it imports this registry).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from replaybench.impl.rl.common.errors import ConfigError
from replaybench.impl.rl.engines import dataflow, paac, process, sequential
from replaybench.impl.rl.engines import ray as ray_engine

from replaybench.registry import Registry, UnknownName

__all__ = ["Engine", "ENGINES", "get", "parallel_names"]


@dataclass(frozen=True)
class Engine:
    """One engine: ``run(cfg, progress) -> TrainResult``; ``check(cfg, acfg)`` raises
    ConfigError for a run this engine cannot do (called by :meth:`TrainConfig.validate`,
    after the generic checks); ``kind`` is "replay" (the sequential replay loop), "parallel"
    (selectable with ``backend``) or "own" (an algorithm's own loop); ``needs`` names the
    modules it imports, with the extra that installs them; ``smoke`` is a TrainConfig (as
    keyword arguments) of a run of a few hundred steps on this engine, which the conformance
    tests (tests/test_engines.py) run for every registered engine."""

    name: str
    kind: str
    run: Callable
    check: Callable
    smoke: dict
    needs: tuple[tuple[str, str], ...] = ()  # (module, pip extra)

    def unavailable_reason(self) -> str | None:
        """Why this engine cannot run here (a module it needs does not import), or None."""
        for module, extra in self.needs:
            try:
                importlib.import_module(module)
            except ImportError as err:
                return (f"{module.capitalize()} is not installed ({err}); install the extra: "
                        f"pip install 'replaybench[{extra}]'")
        return None


def _no_check(cfg, acfg) -> None:
    return None


ENGINES: Registry[Engine] = Registry("engine")
_TINY_DQN = dict(algo="dqn", env="CartPole-v1", steps=300,
                 overrides=dict(hidden=(16, 16), batch_size=16, learning_starts=100, buffer_capacity=1024))
for _engine in (Engine("sequential", "replay", sequential.run_sequential, _no_check, dict(_TINY_DQN)),
                Engine("process", "parallel", process.run_parallel, _no_check, dict(_TINY_DQN, actors=1, learners=1)),
                Engine("ray", "parallel", ray_engine.run_ray, ray_engine.check,
                       dict(_TINY_DQN, actors=1, learners=1, backend="ray"), needs=(("ray", "ray"),)),
                Engine("dataflow", "parallel", dataflow.run_dataflow, dataflow.check,
                       dict(_TINY_DQN, actors=1, learners=1, backend="dataflow")),
                Engine("paac", "own", paac.run_paac, paac.check,
                       dict(algo="a2c", env="CartPole-v1", steps=300,
                            overrides=dict(n_envs=4, n_workers=1, t_max=5)))):
    ENGINES.register(_engine.name, _engine, origin=__name__)


def get(name: str) -> Engine:
    """The engine called ``name``; ConfigError (field "engine", the registry's message) for an
    unknown name."""
    try:
        return ENGINES.get(name)
    except UnknownName as err:
        raise ConfigError("engine", name, str(err)) from None


def parallel_names() -> tuple[str, ...]:
    """The engines ``TrainConfig.backend`` may name (the parallel replay loop's), sorted."""
    return tuple(n for n, e in ENGINES.items() if e.kind == "parallel")
