"""The training-bounds suite (issue 26's training targets as data) and the report's table of
bounds and in-run/alone replay ratios, on hand-made rows."""

import pytest

from replaybench.analysis import load, references
from replaybench.analysis.plots import training_scaling
from replaybench.bench import results, suites
from replaybench.bench.scenarios import training


def test_the_suite_runs_the_issue_grid_with_its_targets():
    suite = suites.load("training-bounds")
    cells = training.cells_for(training.suite_configs(suite))  # every configuration checked
    cfgs = [c.spec for c in cells]
    assert len(cfgs) == 2 * 2 * 3 * 3  # ratios x E x seeds x (baseline, 1 and 2 actors + 1 learner)
    assert {(c.actors, c.learners) for c in cfgs if not c.sequential} == {(1, 1), (2, 1)}
    assert {c.overrides["updates_per_step"] for c in cfgs} == {1 / 16, 1 / 64}
    assert {c.envs_per_actor for c in cfgs} == {1, 16}
    assert {(c.buffer, c.policy, c.engine) for c in cfgs if not c.sequential} == {("kary-aligned", "lazy-writing",
                                                                                   "process")}
    goals = suite["targets"]
    assert goals["training_bounds"]["bound_fraction_at_least"] == 0.9
    assert goals["training_bounds"]["learner_replay_inrun_over_alone_at_most"] == 1.5
    assert (goals["batched_inference"]["envs_per_actor"], goals["batched_inference"]["updates_per_step"],
            goals["batched_inference"]["at_least"]) == (16, 1 / 64, 2.5)


def _rows(fractions, ratios):
    rows = []
    for seed, (fraction, ratio) in enumerate(zip(fractions, ratios)):
        common = dict(schema_version=results.SCHEMA_VERSION, git_sha="0" * 40, dirty=False, machine="t",
                      scenario="training", variant="kary-aligned", structure="kary-aligned", K=16,
                      policy="lazy-writing", algo="dqn", env="CartPole-v1", engine="process", actors=2, learners=1,
                      seed=seed, op="summary", repeat=0, status="ok")
        params = {"updates_per_step": 0.0625, "envs_per_actor": 1}
        rows += [{**common, "metric": "bound_fraction", "unit": "x", "value": fraction,
                  "params": {**params, "bound": "learner", "bound_role": "learner"}},
                 {**common, "metric": "learner_replay_inrun_over_alone", "unit": "x", "value": ratio,
                  "params": params}]
    return rows


def _section(tmp_path, name, suite, rows, meta=None):
    writer = results.RunWriter(tmp_path / name, f"20300101T000000Z-{name}",
                               {"scenario": "training", "suite": {"name": suite}, **(meta or {})})
    writer.append([{**r, "run_id": writer.run_id} for r in rows])
    writer.finish(True)
    res = load.load_runs(load.find_runs(tmp_path / name))
    return "\n".join(training_scaling.bounds_section(res))


def test_the_report_states_each_configurations_bound_and_replay_ratio_against_the_targets(tmp_path):
    goals = {"targets": {"training_bounds": {"bound_fraction_at_least": 0.9,
                                             "learner_replay_inrun_over_alone_at_most": 1.5}}}
    text = _section(tmp_path, "met", "training-x", _rows([0.95, 0.97, 0.92], [1.2, 1.4, 1.1]), goals)
    line = next(x for x in text.splitlines() if "2 A, 1 L" in x)
    assert "learner (3/3 seeds)" in line
    assert "0.95 (0.92-0.97) vs >= 0.9 | **yes**" in line and "1.2 (1.1-1.4) vs <= 1.5 | **yes**" in line
    text = _section(tmp_path, "mixed", "training-x", _rows([0.85, 0.95, 0.99], [2.0, 3.0, 5.0]), goals)
    line = next(x for x in text.splitlines() if "2 A, 1 L" in x)
    assert "| within spread |" in line and line.endswith("| no |")
    # a run whose suite records no targets is shown without a verdict; the shipped suite's apply by name
    text = _section(tmp_path, "none", "training-renamed", _rows([0.95], [1.2]))
    assert references.NOT_RECORDED in text and "**yes**" not in text and "vs >=" not in text
    text = _section(tmp_path, "shipped", "training-bounds", _rows([0.95], [1.2]))
    assert "vs >= 0.9 | **yes**" in text and "vs <= 1.5 | **yes**" in text


def test_no_bound_rows_no_table(tmp_path):
    rows = [r for r in _rows([0.9], [1.0]) if r["metric"] == "bound_fraction"]
    assert _section(tmp_path, "some", "training-x", rows)  # one metric is enough
    assert training_scaling.bounds_section(load.Results(table=load.load_runs(load.find_runs(tmp_path / "some"))
                                                        .table.iloc[0:0], metas={}, problems=[])) == []
