"""Conformance of every registered training engine (impl.rl.engines.ENGINES).

Each engine brings a tiny run (``Engine.smoke``); the same checks hold for every one: the
run goes through :func:`impl.rl.train` to that engine, which names itself in the result,
does every env step it was asked for and the updates the ratio allows, accounts its
processes' time by section, and leaves no process and no shared-memory segment behind.
A new engine registered in the registry is tested here with no edit. Engines that start
worker processes are slow tests here (``make test-slow``): their own test files already run
them in ``make test``, which must stay under 10 minutes.
"""

from __future__ import annotations

import math

import pytest

from replaybench.impl.rl import TrainConfig, engines, train
from replaybench.impl.rl.common.profiler import SECTIONS
from replaybench.impl.rl.common.result import total_updates

from _support import assert_exited, own_segments

FAST = {"sequential"}


def _param(name):
    return pytest.param(name, marks=() if name in FAST else pytest.mark.slow)


@pytest.mark.parametrize("name", [_param(n) for n in engines.ENGINES.names()])
def test_every_engine_keeps_the_run_contract(name):
    engine = engines.get(name)
    if engine.unavailable_reason():
        pytest.skip(engine.unavailable_reason())
    cfg = TrainConfig(**engine.smoke, seed=1, timeout_s=240)
    assert cfg.engine == name
    progress = []
    result = train(cfg, lambda *args: progress.append(args))
    assert result.engine == name  # each engine names itself in its result
    acfg = cfg.algo_config()
    if name == "paac":  # whole rollouts of n_envs x t_max steps
        per_rollout = acfg.n_envs * acfg.t_max
        assert result.env_steps == math.ceil(cfg.steps / per_rollout) * per_rollout
        assert result.updates == result.env_steps // per_rollout
    else:
        assert result.env_steps == cfg.steps
        assert result.updates == total_updates(cfg.steps, acfg.updates_per_step, acfg.learning_starts)
    assert result.wall_s > 0 and result.episodes and progress
    for role, sections in result.profiles.items():
        assert set(sections) <= set(SECTIONS) and all(v >= 0 for v in sections.values()), role
    assert_exited(result.worker_pids)
    assert own_segments() == []


def test_every_engine_is_named_alike_in_the_registry_and_its_smoke_run():
    for name, engine in engines.ENGINES.items():
        assert engine.name == name and engine.kind in ("replay", "parallel", "own")
        assert TrainConfig(**engine.smoke).engine == name
