"""The paac scenario (bench/scenarios/paac.py), its figures and its report section.

The quick suite runs every method but gym-async in the test process (no worker processes) and
two short training runs; the methods' worker processes, and the per-env workers' failure path,
are checked by a slow test. Speed is never asserted: the checks are the rows' shape, what each method counts, and
that the ratios are computed from the same run.
"""

from __future__ import annotations

import multiprocessing

import pytest

from replaybench.bench import driver, results, suites
from replaybench.bench.contract import params_of
from replaybench.bench.scenarios import SelectionError, Selection
from replaybench.bench.scenarios import paac as scenario


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("paac")
    run_dir = driver.run(suites.load("paac-quick"), out=out, progress=False, echo=lambda *_: None)
    return run_dir, results.read_rows(run_dir)


def test_quick_suite_rows(quick_run):
    run_dir, rows = quick_run
    assert results.read_meta(run_dir)["complete"]
    unavailable = scenario.envpool_status()
    steps = [r for r in rows if r["op"] == "step"]
    measured = {r["stepping"] for r in steps if r["status"] == "ok"}
    assert all(r["variant"] is None for r in steps)  # not a buffer variant
    expected = {"paac", "paac-halves", "per-env", "gym-sync"} | ({"envpool"} if unavailable is None else set())
    assert measured == expected
    for method in expected:
        mine = [r for r in steps if r["stepping"] == method]
        assert [r["repeat"] for r in mine] == [0, 1] and all(r["value"] > 0 for r in mine)
        assert {(r["batch"], r["env"], r["algo"]) for r in mine} == {(4, "CartPole-v1", "a2c")}
        assert params_of(mine[0]["params"])["n_envs"] == 4 and mine[0]["env_steps"] == 100
        profile = {r["metric"]: r["value"] for r in rows if r["op"] == "profile" and r["stepping"] == method
                   and r.get("unit") == "us/step"}
        assert set(profile) == set(scenario.PROFILE) and profile["inference"] > 0 and profile["env_step"] > 0
        # the profile accounts for the windows' wall time: us per step ~ 1e6 / (steps/s)
        wall_us = 1e6 * sum(1 / r["value"] for r in mine) / len(mine)
        assert sum(profile.values()) == pytest.approx(wall_us, rel=0.05)
    in_process = [r for r in rows if r["op"] == "profile" and r["stepping"] == "paac" and r["metric"] == "sync"]
    assert in_process[0]["value"] == 0.0  # n_w = 0: no synchronisation to count
    training = {(r["variant"], r["metric"]): r for r in rows if r["op"] == "summary"}
    for label in ("paac-a2c", "pal-dqn"):
        assert training[(label, "env_steps_per_s")]["status"] == "ok"
        assert training[(label, "time_to_threshold_s")]["status"] == "skipped"  # 320 steps: not reached
    assert training[("pal-dqn", "env_steps_per_s")]["algo"] == "dqn"
    assert params_of(training[("pal-dqn", "env_steps_per_s")]["params"])["envs_per_actor"] == 4
    assert any(r["op"] == "episode" and r["variant"] == "paac-a2c" for r in rows)


def test_figures_and_ratios_from_the_quick_run(quick_run):
    from replaybench.analysis import load
    from replaybench.analysis.plots import paac_breakdown, paac_throughput

    run_dir, _ = quick_run
    res = load.load_runs([run_dir])
    plot = paac_throughput.build(res.table, res.metas)
    assert set(plot.data["method"]) >= {"paac", "per-env", "gym-sync"} and (plot.data["n"] == 2).all()
    assert set(paac_breakdown.build(res.table, res.metas).data["component"]) == set(scenario.PROFILE)
    assert paac_throughput.target_ratios(res.table, res.metas).empty  # the quick suite records no targets
    goal = {"n_envs": 4, "at_least": {"per-env": 3.0, "gym-sync": 1.3}}
    ratios = paac_throughput.target_ratios(res.table, res.metas, goal)
    by_peer = {r.peer: r for r in ratios.itertuples()}
    assert set(by_peer) >= {"per-env", "gym-sync"}
    per_env = by_peer["per-env"]
    assert per_env.n_workers == per_env.peer_n_workers == 0  # compared at the same n_w
    assert per_env.ratio == pytest.approx(per_env.paac / per_env.peer_median)
    assert per_env.ratio_low <= per_env.ratio <= per_env.ratio_high and per_env.target == 3.0
    from replaybench.analysis import report

    text = "\n".join(report._paac(res))
    assert "PAAC (A2C) vs the PAL loop" in text and "`pal-dqn`" in text


@pytest.mark.parametrize("change,message", [
    ({"stepping": [{"env": "CartPole-v1", "methods": ["nope"], "n_envs": [2], "n_workers": [1], "steps": 10,
                    "repeats": 1}]}, "unknown methods"),
    ({"stepping": [{"env": "CartPole-v1", "n_envs": [0], "n_workers": [1], "steps": 10, "repeats": 1}]}, "'n_envs'"),
    ({"stepping": [{"env": "CartPole-v1", "n_envs": [2], "n_workers": [-1], "steps": 10, "repeats": 1}]},
     "'n_workers'"),
    ({"stepping": None, "training": {"env": "CartPole-v1", "steps": 10, "runs": [
        {"label": "x", "algo": "dqn", "envs_per_actor": 0}]}}, "envs_per_actor"),
    ({"stepping": None, "training": None}, "needs a 'stepping' list"),
])
def test_bad_suites_are_refused_before_anything_runs(change, message):
    suite = {**suites.load("paac-quick"), **change}
    with pytest.raises(SelectionError, match=message):
        scenario.SCENARIO.cells(suite, Selection())


def test_invalid_combinations_are_not_cells_and_missing_libraries_are_unavailable(monkeypatch):
    monkeypatch.setattr(scenario, "envpool_status", lambda: "envpool does not import: ImportError: test")
    suite = {"name": "t", "scenario": "paac", "stepping": [
        {"env": "CartPole-v1", "n_envs": [1, 4], "n_workers": [0, 1, 2], "steps": 10, "repeats": 1},
        {"env": "NoSuchEnv-v9", "methods": ["paac"], "n_envs": [2], "n_workers": [1], "steps": 10, "repeats": 1}]}
    cells = scenario.SCENARIO.cells(suite, Selection())
    got = {(c.columns["stepping"], c.columns["batch"], c.columns["actors"]) for c in cells if c.columns["env"] != "NoSuchEnv-v9"}
    assert ("paac-halves", 1, 0) not in got and ("paac-halves", 4, 2) in got and ("paac-halves", 4, 0) in got
    assert ("paac", 1, 2) not in got and ("envpool", 4, 0) not in got and ("gym-sync", 4, 0) in got
    assert ("gym-async", 4, 4) in got  # its own n_w: one process per env
    envpool = [c for c in cells if c.columns["stepping"] == "envpool"]
    assert envpool and all(c.skip_status == "unavailable" and "ImportError: test" in c.skip for c in envpool)
    missing = [c for c in cells if c.columns["env"] == "NoSuchEnv-v9"]
    assert len(missing) == 1 and missing[0].skip_status == "unavailable" and "NoSuchEnv-v9" in missing[0].skip


@pytest.mark.slow
def test_process_methods_measure_and_a_failing_worker_leaves_no_process():
    """per-env over 2 worker processes, PAAC over 2 and AsyncVectorEnv measure every window;
    a per-env worker that cannot make its env raises in the master, and nothing is left."""
    before = set(multiprocessing.active_children())
    for method in ("per-env", "paac", "gym-async"):
        rates, profile = scenario.measure_stepping(scenario.SteppingSpec("CartPole-v1", method, 4, 2, 40, 2,
                                                                         {"hidden": [8]}))
        assert len(rates) == 2 and min(rates) > 0 and profile["env_step"] > 0, method
    with pytest.raises(RuntimeError, match="NoSuchEnv-v9"):
        scenario.measure_stepping(scenario.SteppingSpec("NoSuchEnv-v9", "per-env", 2, 1, 10, 1, {}))
    assert set(multiprocessing.active_children()) <= before


def test_report_section_puts_the_envs_per_actor_ratio_beside_its_target(tmp_path):
    """Synthetic training rows at 1/16 updates per step, E = 1 and 16: the report's ratio of
    medians, its range and the acting-only ratio (env steps over env_step + inference seconds)."""
    from replaybench.analysis import load, report

    rows = []
    for envs, rates, acting_s in ((1, [1000.0, 1100.0], 30.0), (16, [3000.0, 3600.0], 6.0)):
        for seed, rate in enumerate(rates):
            base = {"schema_version": results.SCHEMA_VERSION, "run_id": "r", "git_sha": "0" * 40, "dirty": False,
                    "machine": "t", "scenario": "training", "variant": "kary-aligned", "policy": "lazy-writing",
                    "algo": "dqn", "env": "CartPole-v1", "mode": "processes", "actors": 1, "learners": 1,
                    "seed": seed, "status": "ok", "repeat": 0}
            params = {"steps": 60000, "updates_per_step": 0.0625, "envs_per_actor": envs}
            rows.append({**base, "op": "summary", "metric": "env_steps_per_s", "value": rate, "unit": "steps/s",
                         "params": params})
            for section in ("env_step", "inference"):
                rows.append({**base, "op": "profile", "metric": section, "value": acting_s / 2, "unit": "s",
                             "params": {**params, "role": "actor", "processes": 1}})
    from replaybench.bench import suites

    targets = suites.load("training-throughput")["targets"]  # the driver copies them into meta.json
    writer = results.RunWriter(tmp_path, "r", {"scenario": "training", "suite": {"name": "t"}, "targets": targets})
    writer.append(rows)
    writer.finish(True)
    text = "\n".join(report._paac(load.load_runs([writer.dir])))
    line = next(x for x in text.splitlines() if x.startswith("| dqn on CartPole-v1"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4:] == ["16", "1,050", "3,300", "3.14x", "2.73-3.6", "5x", ">= 3x"]


def test_ale_vector_stepping_cells_measure_on_pong_and_are_unavailable_elsewhere():
    pytest.importorskip("ale_py", reason="the atari extra is not installed")
    rates, profile = scenario.measure_stepping(scenario.SteppingSpec("ALE/Pong-v5", "ale-vector", 2, 1, 8, 1,
                                                                     {"hidden": [16]}))
    assert len(rates) == 1 and rates[0] > 0 and profile["env_step"] > 0
    suite = {"name": "t", "scenario": "paac",
             "stepping": [{"env": "CartPole-v1", "methods": ["ale-vector"], "n_envs": [2], "n_workers": [0, 1],
                           "steps": 4, "repeats": 1}]}
    cells = scenario.SCENARIO.cells(suite, Selection())
    assert len(cells) == 1 and cells[0].skip_status == "unavailable" and "ALE" in cells[0].skip  # n_w = 0: no cell


def test_the_pong_speed_suite_is_one_valid_run_per_choice():
    pytest.importorskip("ale_py", reason="the atari extra is not installed")
    cells = scenario.SCENARIO.cells(suites.load("paac-pong-speed"), Selection())
    labels = [c.columns["variant"] for c in cells]
    assert len(set(labels)) == len(labels) >= 6
    overrides = {c.columns["variant"]: c.spec.overrides for c in cells}
    assert {o.get("stepping", "shared") for o in overrides.values()} == {"shared", "ale-vector"}
    assert any(o.get("channels_last") for o in overrides.values()) and any(o.get("compile") for o in overrides.values())
