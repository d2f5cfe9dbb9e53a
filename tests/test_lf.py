"""The LF benchmarks: backends step what they say, the scenario checks its suite, ratios are
taken the right way round, and a whole quick run goes through the driver, figure and report.

One default test starts Ray (``num_cpus=2``, always shut down); the rest that start Ray or
many processes are marked slow.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing as mp

import gymnasium as gym
import numpy as np
import pytest

from replaybench.bench import suites
from replaybench.bench.lf import lockstep, multiagent, raysession
from replaybench.bench.scenarios import SelectionError
from replaybench.bench.derive import lf_ratios
from replaybench.bench.scenarios.lf import SCENARIO
from replaybench.impl.dataflow import PQLConfig

needs_ray = pytest.mark.skipif(bool(raysession.unavailable()), reason=raysession.unavailable() or "ray")
needs_mpe2 = pytest.mark.skipif(importlib.util.find_spec("mpe2") is None, reason="mpe2 is not installed")


def test_random_actions_lie_in_their_space():
    rng = np.random.default_rng(0)
    d = lockstep.random_actions(gym.spaces.Discrete(3, start=1), 50, rng)
    assert d.shape == (50,) and set(d.tolist()) == {1, 2, 3}
    box = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    b = lockstep.random_actions(box, 50, rng)
    assert b.shape == (50, 1) and b.dtype == np.float32 and all(box.contains(x) for x in b)


@pytest.mark.parametrize("name", ["sync", "dataflow"])
def test_in_process_backends_step_every_env(name):
    with lockstep.open_backend(name, "CartPole-v1", 3, 0, 0) as backend:
        for _ in range(30):  # past the end of some random episodes: auto-reset keeps stepping
            backend.round()
    with pytest.raises(ValueError, match="backend"):
        lockstep.open_backend("threads", "CartPole-v1", 3, 0, 0)


@needs_ray
def test_ray_lockstep_steps_and_the_session_always_shuts_down():
    with pytest.raises(RuntimeError, match="inside"):
        with raysession.session(2) as ray:
            with lockstep.open_backend("ray", "CartPole-v1", 2, 0, 0) as backend:
                for _ in range(30):
                    backend.round()
            assert ray.is_initialized()
            raise RuntimeError("inside")
    assert not ray.is_initialized()


@needs_ray
@pytest.mark.slow
def test_ray_parallel_q_learning_runs_every_round():
    from replaybench.bench.lf.pql_ray import run_pql_ray

    with raysession.session(2):
        for replay in ("prioritized", "deque"):
            res = run_pql_ray(PQLConfig(actors=2, steps_per_round=10, rounds=2, batch_size=16, replay_capacity=64,
                                        replay=replay))
            assert res.rounds == 2 and res.env_steps == 40 and res.updates == 2 and res.returns


def _suite(**blocks):
    return {"name": "t", "scenario": "lf", **blocks}


@pytest.mark.parametrize("suite, message", [
    (_suite(lockstep=[{"backends": ["dask"], "envs": ["CartPole-v1"], "rounds": 5}]), "backends"),
    (_suite(lockstep=[{"backends": ["sync"], "envs": "CartPole-v1", "rounds": 5}]), "envs"),
    (_suite(lockstep=[{"backends": ["sync"], "envs": ["CartPole-v1"], "rounds": 0}]), "rounds"),
    (_suite(pql=[{"backends": ["ray"], "actors": [16], "batch_sizes": [500], "replays": ["lifo"]}]), "replay"),
    (_suite(pql=[{"backends": ["ray"], "actors": [16], "batch_sizes": [500], "replays": ["deque"], "lr0": 1}]), "lr0"),
    (_suite(multiagent=[{"backends": ["ray"], "env": "traffic", "steps": 5}]), "env"),
    (_suite(), "no work"),
    ({**_suite(), "lockstpe": []}, "lockstpe"),
])
def test_bad_suites_are_refused_by_name_before_anything_runs(suite, message):
    from replaybench.bench.scenarios import Selection

    with pytest.raises(SelectionError, match=message):
        SCENARIO.cells(suite, Selection())


def test_shipped_suites_expand():
    from replaybench.bench.scenarios import Selection

    for name in ("lf-quick", "lf"):
        cells = SCENARIO.cells(suites.load(name), Selection())
        assert {c.columns["op"] for c in cells} == {"lockstep", "pql", "multiagent"}


def _row(op, backend, value, metric, **cols):
    return {"op": op, "backend": backend, "metric": metric, "value": value, "status": "ok", "env": cols.get("env"),
            "policy": cols.get("policy", "none"), "actors": cols.get("actors", 15), "batch": cols.get("batch")}


def test_ratios_are_speed_over_ray_with_the_papers_beside_ours():
    rows = [_row("lockstep", "ray", v, "env_steps_per_s", env="CartPole-v1") for v in (100, 110, 90)]
    rows += [_row("lockstep", "dataflow", v, "env_steps_per_s", env="CartPole-v1") for v in (1000, 900)]
    rows += [_row("lockstep", "sync", 475.0, "env_steps_per_s", env="CartPole-v1")]
    rows += [_row("pql", "ray", 30.0, "time_s", env="Blackjack-v1", actors=16, batch=500, policy="deque"),
             _row("pql", "dataflow", 10.0, "time_s", env="Blackjack-v1", actors=16, batch=500, policy="deque"),
             _row("pql", "dataflow", 1e6, "env_steps_per_s", env="Blackjack-v1", actors=16, batch=500, policy="deque"),
             {**_row("pql", "ray", 1.0, "time_s", env="Blackjack-v1", actors=16, batch=500, policy="deque"),
              "status": "failed"}]
    paper = suites.load("lf")["paper"]["lf_over_ray"]["cells"]
    out = {(e["op"], e["backend"]): e for e in lf_ratios(rows, paper)}
    assert out["lockstep", "dataflow"]["x_ray"] == pytest.approx(950 / 100)
    assert out["lockstep", "dataflow"]["x_single"] == pytest.approx(2.0) and out["pql", "ray"]["x_single"] is None
    assert out["lockstep", "ray"]["x_ray"] == 1.0 and out["lockstep", "ray"]["paper"] is None
    assert out["lockstep", "dataflow"]["paper"] == pytest.approx(3814 / 3277)  # the paper's 15 envs
    assert out["pql", "dataflow"]["x_ray"] == pytest.approx(3.0)  # a time: Ray's over ours
    assert out["pql", "dataflow"]["paper"] == pytest.approx(136.95 / 94.22) and out["pql", "dataflow"]["n"] == 1
    # a cell the paper did not measure (other actors), or no paper recorded: no paper ratio
    assert all(e["paper"] is None for e in lf_ratios([{**r, "actors": 4} for r in rows], paper))
    assert all(e["paper"] is None for e in lf_ratios(rows))


@needs_mpe2
def test_multiagent_backends_choose_the_same_actions():
    env = multiagent.make_env("simple_spread", 3)
    obs, _ = env.reset(seed=0)
    joint = np.stack([obs[a] for a in env.possible_agents])
    dim, n = joint.shape[1], int(env.action_space(env.possible_agents[0]).n)
    serial, batched = (multiagent.open_backend(b, 3, dim, n, seed=1) for b in ("serial", "dataflow"))
    assert serial.act(joint).tolist() == batched.act(joint).tolist()
    assert multiagent.run(env, batched, 30, seed=0) > 0  # past the 25-step episode: it restarts
    env.close()
    with pytest.raises(ValueError, match="multi-agent env"):
        multiagent.make_env("traffic", 3)


@pytest.mark.slow
def test_quick_suite_through_driver_figure_and_report(tmp_path):
    from replaybench.analysis import load
    from replaybench.analysis.plots import lf as lf_plot
    from replaybench.bench import contract, driver

    out = driver.run(suites.load("lf-quick"), out=tmp_path, run_id="lfq", progress=False, echo=lambda *_: None)
    rows = contract.read_rows(out)
    by_status = {}
    for r in rows:
        by_status.setdefault(r["status"], []).append(r)
    assert not by_status.get("failed"), [r["error"] for r in by_status.get("failed", [])]
    assert {r["backend"] for r in by_status["ok"] if r["op"] == "lockstep"} == {"ray", "dataflow", "sync", "async",
                                                                                 "mp-queues"}
    assert json.loads((out / "meta.json").read_text())["complete"]
    res = load.load_runs([out])
    plot = lf_plot.build(res.table, res.metas)
    assert {"lockstep", "pql", "multiagent"} == set(plot.data["op"])
    assert not mp.active_children()
