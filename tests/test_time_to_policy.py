"""Time to a good policy (issue 56): the greedy evaluation, censoring, update-counted schedules,
snapshots in the engines, and the learning scenario's smoke suite."""

import math

import numpy as np
import pytest

from replaybench.bench import time_to_policy as ttp
from replaybench.impl.rl.algorithms.dqn import DQNConfig
from replaybench.impl.rl.common.snapshots import Snapshot, evaluate, time_to_threshold


def _balance(obs):
    """A hand-made CartPole policy that holds the pole: push towards where it falls."""
    return (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)


def _random(obs):
    return np.random.default_rng(int(abs(obs.sum()) * 1e6) % 2**32).integers(0, 2, len(obs))


def test_evaluation_is_deterministic_and_tells_a_good_policy_from_a_random_one():
    good = evaluate(_balance, "CartPole-v1", 20)
    assert np.array_equal(good, evaluate(_balance, "CartPole-v1", 20))  # fixed seeds: the same returns
    assert good.mean() >= 475
    assert evaluate(_random, "CartPole-v1", 20).mean() < 100
    with pytest.raises(ValueError, match="episodes"):
        evaluate(_balance, "CartPole-v1", 5)


def test_time_to_threshold_is_the_first_snapshot_that_holds_it():
    snaps = [Snapshot(1.0, 100, 10, None, 20.0), Snapshot(2.0, 200, 20, None, 480.0),
             Snapshot(3.0, 300, 30, None, 300.0)]
    got = time_to_threshold(snaps, 475)
    assert (got.wall_s, got.env_steps, got.updates, got.final_holds) == (2.0, 200, 20, False)
    assert time_to_threshold(snaps[:1], 475).censored


def test_a_censored_run_is_counted_and_its_median_computed_with_it():
    outs = [ttp.Outcome(0, 10.0, 60), ttp.Outcome(1, None, 60), ttp.Outcome(2, 20.0, 60)]
    s = ttp.summarize(outs)
    assert (s.n, s.reached, s.label) == (3, 2, "2/3")
    assert s.median_s == 20.0  # the censored seed counts as the longest
    assert math.isinf(ttp.summarize(outs[:2] + [ttp.Outcome(3, None, 60)]).median_s)  # 1 of 3: not reached
    # a 1-of-3 configuration cannot look best beside a 3-of-3 one
    best = ttp.best_reference({"one": [ttp.Outcome(0, 1.0, 60), ttp.Outcome(1, None, 60), ttp.Outcome(2, None, 60)],
                               "all": [ttp.Outcome(i, 30.0, 60) for i in range(3)]})
    assert best == "all"
    ratios = ttp.per_seed_speedups([ttp.Outcome(0, 20.0, 60), ttp.Outcome(1, None, 60)],
                                   [ttp.Outcome(0, 10.0, 60), ttp.Outcome(1, 30.0, 60)])
    assert ratios == [(0, "=", 2.0), (1, ">", 2.0)]


def test_update_counted_schedules_do_not_move_with_the_ratio():
    """Epsilon and beta at a given update count are the same at any replay ratio when their
    schedules are counted in updates (and move with it when counted in env steps)."""
    a = DQNConfig(updates_per_step=0.5, learning_starts=1000, eps_decay_updates=2000, per_beta_updates=4000)
    b = DQNConfig(updates_per_step=0.125, learning_starts=1000, eps_decay_updates=2000, per_beta_updates=4000)
    for updates in (0, 500, 1000, 2000, 3000):
        steps_a, steps_b = 1000 + int(updates / 0.5), 1000 + int(updates / 0.125)
        assert a.epsilon(steps_a) == pytest.approx(b.epsilon(steps_b))
        assert a.beta(steps_a) == pytest.approx(b.beta(steps_b))
    plain_a, plain_b = DQNConfig(updates_per_step=0.5), DQNConfig(updates_per_step=0.125)
    assert plain_a.epsilon(5000) == plain_b.epsilon(5000)  # env-step schedules: unchanged presets


@pytest.mark.parametrize("actors", [0, 1])
def test_engines_take_snapshots_that_the_evaluator_loads(actors):
    """The sequential and process engines keep a snapshot every snapshot_every updates and one
    at the end, in order, each loading into a greedy policy the evaluator plays."""
    from replaybench.impl.rl import TrainConfig, train
    from replaybench.impl.rl.common.snapshots import snapshot_policy

    cfg = TrainConfig(env="CartPole-v1", steps=1600, actors=actors, learners=actors, policy="atomic-deltas",
                      snapshot_every=100, overrides={"learning_starts": 1000}, timeout_s=120)
    result = train(cfg)
    snaps = result.snapshots
    assert [s.updates for s in snaps][:-1] == list(range(100, 100 * len(snaps), 100))
    assert snaps[-1].updates == result.updates
    assert all(a.wall_s <= b.wall_s and a.env_steps <= b.env_steps for a, b in zip(snaps, snaps[1:]))
    returns = evaluate(snapshot_policy("dqn", "CartPole-v1", cfg.validate(), snaps[-1].weights), "CartPole-v1", 20)
    assert np.isfinite(returns).all() and (returns >= 8).all()


def test_learning_quick_suite_runs(tmp_path):
    """The smoke grid: every run ends ok with a time to threshold or a censored time, the
    snapshots' evaluations recorded, and a summary table per task."""
    from replaybench.bench import contract, driver, suites

    out = []
    run = driver.run(suites.load("learning-quick"), out=tmp_path, progress=False, echo=out.append)
    rows = contract.read_rows(run)
    assert {r["status"] for r in rows} == {"ok"}
    outcomes = ttp.outcomes(rows)
    assert set(k[2] for k in outcomes) == {"sequential", "1+1"}
    assert any(r["op"] == "snapshot" and r["metric"] == "eval_return" for r in rows)
    assert all(contract.params_of(r["params"])["samples_per_step"] == 32.0 for r in rows)
    assert "x best seq" in "\n".join(out)
    # the figure and the report's table draw the same run's numbers, one row per configuration
    from replaybench.analysis import load
    from replaybench.analysis.plots import time_to_policy as figure

    res = load.load_runs([run])
    plot = figure.build(res.table, res.metas)
    assert sorted(plot.data["config"]) == ["1+1", "sequential"]
    assert set(plot.data["run_id"]) == {run.name}
    section = "\n".join(figure.report_section(plot.data, res, {}))
    for r in plot.data.itertuples():
        assert f"| {r.config} | {r.layout} | {r.reached}/{r.n} |" in section
