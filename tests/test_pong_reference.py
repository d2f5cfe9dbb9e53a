"""The Pong reference figure (analysis/plots/pong_reference.py) on hand-made rows written and
read through the results contract: both curves on one axis, the newest run per suite, and
"no rows" naming the side that is missing."""


import pandas as pd
import pytest

from replaybench.analysis import load
from replaybench.analysis.plots import NoRows, pong_reference
from replaybench.bench import results

ENV = "ALE/Pong-v5"


def episodes(returns, every, **columns):
    """One contract row per finished episode: ``returns[i]`` at env step ``every * (i + 1)``."""
    return [{"schema_version": results.SCHEMA_VERSION, "git_sha": "0" * 40, "dirty": False, "machine": "test",
             "status": "ok", "op": "episode", "metric": "return", "unit": "return", "value": float(r), "repeat": i,
             "env_steps": every * (i + 1), "wall_s": 0.1 * (i + 1), **columns} for i, r in enumerate(returns)]


def paac(returns, every=1000, env=ENV, seed=0):
    return episodes(returns, every, scenario="training", algo="a2c", env=env, variant="kary-aligned", seed=seed,
                    actors=0, learners=0, params={"envs_per_actor": 32})


def sb3(returns, every=1000, algo="a2c", framework="sb3", seed=0, threshold=None):
    params = {"framework": framework} if threshold is None else {"framework": framework, "threshold": threshold}
    return episodes(returns, every, scenario="frameworks", algo=algo, env=ENV, variant="own", seed=seed,
                    params=params)


def write(root, run_id, suite, scenario, rows, started):
    writer = results.RunWriter(root, run_id, {"scenario": scenario, "suite": {"name": suite},
                                              "start_time": started})
    writer.append([{**r, "run_id": run_id} for r in rows])
    writer.finish(True)


def table(tmp_path, *runs):
    for i, (suite, scenario, rows) in enumerate(runs):
        write(tmp_path, f"2030010{i}T000000Z-{suite}", suite, scenario, rows, f"2030-01-0{i + 1}T00:00:00")
    res = load.load_runs(load.find_runs(tmp_path))
    assert not res.problems
    return res


def test_both_curves_on_one_axis_of_env_steps(tmp_path):
    res = table(tmp_path,
                ("training-pong", "training", paac([-21] * 5, every=500)),
                ("training-pong", "training", paac([-21, -19, -17] + [-15] * 18)),          # newer: replaces the first
                ("training-pong-zoo", "training", paac([-20, -20])),
                ("training-quick", "training", paac([10, 20], env="CartPole-v1")),        # another env: left out
                ("frameworks-a2c-pong", "frameworks", sb3([-21, -20, -19], every=800, threshold=-10)),
                ("frameworks-atari", "frameworks", sb3([-21, -21], algo="dqn")),          # DQN: left out
                ("frameworks-a2c-pong", "frameworks", sb3([-21], framework="tianshou")))  # not SB3: left out
    plot = pong_reference.build(res.table, res.metas)
    data = plot.data
    assert set(zip(data["side"], data["suite"])) == {("PAAC (ours)", "training-pong"),
                                                     ("PAAC (ours)", "training-pong-zoo"),
                                                     ("Stable-Baselines3 A2C", "frameworks-a2c-pong")}
    mine = data[data["suite"] == "training-pong"].sort_values("env_steps")
    assert len(mine) == 21 and mine["env_steps"].iloc[0] == 1000          # the newer run's 21 episodes
    # the mean of the last 20 returns: fewer at the start, a full window at the end
    assert mine["mean_return"].iloc[:3].tolist() == pytest.approx([-21, -20, -19])
    assert mine["episodes"].iloc[-1] == 20
    assert mine["mean_return"].iloc[-1] == pytest.approx((-19 - 17 + 18 * -15) / 20)  # the first left the window
    ref = data[data["side"] == "Stable-Baselines3 A2C"].sort_values("env_steps")
    assert ref["env_steps"].tolist() == [800, 1600, 2400] and ref["mean_return"].iloc[-1] == pytest.approx(-20)
    ax = plot.figure.axes[0]
    assert len(ax.lines) == 4 and "environment steps" in ax.get_xlabel()      # 3 curves and the threshold
    assert list(ax.lines[-1].get_ydata()) == [-10, -10]


@pytest.mark.parametrize("missing", ["PAAC (ours)", "Stable-Baselines3 A2C"])
def test_a_missing_side_is_named_in_the_caption_and_no_side_is_no_rows(tmp_path, missing):
    runs = {"PAAC (ours)": ("training-pong", "training", paac([-21, -20])),
            "Stable-Baselines3 A2C": ("frameworks-a2c-pong", "frameworks", sb3([-21, -20]))}
    del runs[missing]
    res = table(tmp_path, *runs.values())
    plot = pong_reference.build(res.table, res.metas)
    assert f"Not drawn, no stored run: {missing} (" in plot.caption and set(plot.data["side"]) == set(runs)
    empty = load.load_runs([]).table
    with pytest.raises(NoRows, match="no rows for PAAC .* nor Stable-Baselines3 A2C"):
        pong_reference.build(empty, {})


def test_curves_of_several_seeds_stay_apart():
    rows = pd.DataFrame([{**r, "side": "s", "suite": "x", "run_id": "r", "status": "ok"}
                         for seed in (0, 1) for r in sb3([-21 + seed] * 3, seed=seed)])
    data = pong_reference.curves(rows)
    assert data.groupby("seed")["mean_return"].last().tolist() == [-21, -20]


def test_the_replay_figure_leaves_the_a2c_reference_out(tmp_path):
    """The frameworks figure compares buffers: SB3's A2C runs (no buffer) are not its rows."""
    from replaybench.analysis.plots import frameworks as figure
    from replaybench.bench import driver, suites
    from replaybench.bench.scenarios.frameworks import RunResult, result_rows

    runs = []
    for name, replay in (("frameworks-a2c-quick", False), ("frameworks-quick", True)):
        cell = driver.plan(suites.load(name)).cells[0]
        rows = result_rows(RunResult(2.0, 800, {}, [(100, 0.1, 20.0)]), cell.columns, 475, 1, None, replay_buffer=replay)
        runs.append((name, "frameworks", [{**r, "scenario": "frameworks", "schema_version": results.SCHEMA_VERSION,
                                            "git_sha": "0" * 40, "dirty": False, "machine": "test"} for r in rows]))
    res = table(tmp_path, *runs)
    assert set(res.table["algo"]) == {"a2c", "dqn"}
    assert set(figure.framework_rows(res.table)["algo"]) == {"dqn"}


def test_the_report_gives_steps_and_wall_time_to_the_threshold_and_to_the_best(tmp_path):
    """Issue 39: per run, the first full-window mean >= -10 and the best mean, with env steps and
    wall time (0.1 s per episode here), and the whole run's env steps/s."""
    ours = [-21] * 20 + [-5] * 20 + [0] * 30 + [-3] * 5   # the mean of 20 reaches -9.8 at episode 34
    res = table(tmp_path, ("training-pong", "training", paac(ours)),
                ("frameworks-a2c-pong", "frameworks", sb3([-21] * 25, threshold=-10)))
    plot = pong_reference.build(res.table, res.metas)
    line = plot.data[plot.data["side"] == "PAAC (ours)"]
    m = pong_reference.milestones(line)
    assert m["threshold_steps"] == 34_000 and m["threshold_wall_s"] == pytest.approx(3.4)
    assert m["best"] == 0.0 and m["best_steps"] == 60_000 and m["best_wall_s"] == pytest.approx(6.0)
    assert m["episodes"] == 75 and m["steps_per_s"] == pytest.approx(75_000 / 7.5)
    never = pong_reference.milestones(plot.data[plot.data["side"] != "PAAC (ours)"])
    assert never["threshold_steps"] is None and never["best"] == -21.0
    text = "\n".join(pong_reference.report_section(plot.data, res, {}))
    assert "| PAAC (ours) | training-pong |" in text and "| 0.03M | 0 min |" in text and "not reached" in text
