"""Training and concurrency rows record what the buffer's "auto" speed settings chose
(``resolved_storage``, ``resolved_prefetch`` in ``params``), as micro rows do and
docs/using.md promises (issue 41, item 18)."""

import os

import pytest

from replaybench.bench import driver, suites
from replaybench.bench.scenarios import RunState
from replaybench.impl.concurrent import leaked_segments


def _check(rows):
    assert rows
    for r in rows:
        assert r["params"]["resolved_storage"] in ("rows", "columns", "rows-packed"), r
        assert isinstance(r["params"]["resolved_prefetch"], bool), r


def test_concurrency_rows_record_the_resolved_speed_parameters(tmp_path, cache):
    """Before: concurrency rows carried the asked-for params only."""
    p = driver.plan(suites.load("concurrency-quick"))
    cell = next(c for c in p.cells if c.columns["mode"] == "threads" and c.columns["policy"] == "lazy-writing")
    rows = p.scenario.measure(cell, RunState(tmp_path, {}, False, None, 1))
    _check(rows)
    from replaybench.impl import working_set

    want = working_set.choose_storage("auto", cell.columns["capacity"], [8, 8, 40])  # the scenario's schema(40)
    assert want == "rows" or cache == "machine-cache"
    assert {r["params"]["resolved_storage"] for r in rows} == {want}
    assert not leaked_segments(os.getpid())


def test_training_resolution_matches_the_runs_buffer(cache):
    """What the training rows record (computed without building a buffer of the run's size
    where the rows outgrow the cache) is what the run's buffer resolves."""
    from replaybench.bench.scenarios import training
    from replaybench.impl.rl import algorithms
    from replaybench.impl.rl.common.envs import make_env, transition_fields
    from replaybench.impl.rl.common.local_replay import make_local_buffer

    cfg = next(c.spec for c in driver.plan(suites.load("training-quick")).cells if c.spec.sequential)
    acfg = cfg.validate()
    env = make_env(cfg.env, algorithms.get(cfg.algo))
    fields = transition_fields(env)
    env.close()
    built = make_local_buffer(cfg, acfg, fields, 0).resolved_params
    got = training._resolved(cfg)
    assert {"resolved_storage": built["storage"], "resolved_prefetch": built["prefetch"]}.items() <= got.items()


@pytest.mark.slow
def test_training_rows_record_the_resolved_speed_parameters(tmp_path):
    """Before: training rows (summary, episodes, profile) carried the asked-for params only."""
    p = driver.plan(suites.load("training-quick"))
    cell = next(c for c in p.cells if c.spec.sequential)
    written = []
    rows = p.scenario.measure(cell, RunState(tmp_path, {}, False, None, 1, write=written.extend))
    _check(rows + written)
