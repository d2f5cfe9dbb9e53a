"""Bounds of training runs: every training row states its bound (bench.bound), classified on
hand-made profiles; the rows and the summary table that carry it, and a real run's profile adding
up to its wall time; the training-bounds suite (issue 26's training targets as data) and the
report's table of bounds and in-run/alone replay ratios, on hand-made rows.

The real run (:func:`quick_run`) starts three worker processes. This file sorts after
test_concurrency*.py on purpose: those tests compile the shared buffer's kernels in pytest's own
process and numba writes them to its cache, so from cold caches the workers here load them
instead of each compiling them at once (95-140 s on 2 cores when this ran first; 19 s after)."""

import pytest

from replaybench.analysis import load, references
from replaybench.analysis.plots import training_scaling
from replaybench.bench import contract, results, suites
from replaybench.bench.bound import run_bound
from replaybench.bench.scenarios import training


def _prof(env_step=0.0, inference=0.0, replay=0.0, sgd=0.0, wait=0.0, other=0.0):
    return {"env_step": env_step, "inference": inference, "replay": replay, "sgd": sgd, "wait": wait, "other": other}


def test_learner_bound_run_is_updates_per_s_times_steps_per_update():
    """2 actors and 1 learner over 10 s; the learner is busy 9.5 s for 7000 updates (737 upd/s)
    at 1/16 updates per step after 8000 steps without updates: 120K / 7000 = 17.1 steps per
    update, a 12.6K steps/s cap. The actors are busy 5 s each for 120K steps (24K steps/s): the
    learner binds, and the run (12K steps/s) reaches 95% of it."""
    profiles = {"actor": _prof(env_step=6.0, inference=3.0, replay=1.0, wait=10.0),
                "learner": _prof(sgd=8.0, replay=1.0, other=0.5, wait=0.5)}
    b = run_bound(profiles, {"actor": 2, "learner": 1}, 120_000, 7000, 10.0)
    assert b.kind == "learner" and b.role == "learner"
    assert b.steps_per_s == pytest.approx(7000 / 9.5 * (120_000 / 7000))
    assert b.caps["actor"] == pytest.approx(120_000 / 5.0)
    assert b.fraction == pytest.approx(12_000 / (120_000 / 9.5)) == pytest.approx(0.95)


def test_actor_bound_and_buffer_bound_runs():
    # the actors are the slower role, and mostly step the envs: actor-bound
    actor = run_bound({"actor": _prof(env_step=15.0, inference=4.0, replay=1.0),
                       "learner": _prof(sgd=2.0, replay=1.0, wait=7.0)}, {"actor": 2, "learner": 1},
                      10_000, 150, 10.0)
    assert (actor.kind, actor.role) == ("actor", "actor")
    assert actor.steps_per_s == pytest.approx(10_000 / 10.0) and actor.fraction == pytest.approx(1.0)
    # the learner binds, but its largest busy section is replay: buffer-bound
    buffer = run_bound({"actor": _prof(env_step=2.0, wait=8.0), "learner": _prof(sgd=3.0, replay=6.0, wait=1.0)},
                       {"actor": 1, "learner": 1}, 4000, 1000, 10.0)
    assert (buffer.kind, buffer.role) == ("buffer", "learner")
    assert buffer.steps_per_s == pytest.approx(4000 / 9.0)


def test_actors_whose_largest_section_is_replay_are_buffer_bound_and_caps_are_per_process():
    """The actors bind (2 of them, 12 s busy in all: 6 s each, against 2 learners' 8 s in all, 4 s
    each), and their largest busy section is replay (the inserts): buffer-bound, role actor. A
    role's cap divides its busy seconds by its processes."""
    b = run_bound({"actor": _prof(env_step=3.0, inference=2.0, replay=7.0, wait=8.0),
                   "learner": _prof(sgd=6.0, replay=2.0, wait=12.0)}, {"actor": 2, "learner": 2}, 60_000, 900, 10.0)
    assert (b.kind, b.role) == ("buffer", "actor")
    assert b.caps == pytest.approx({"actor": 60_000 / 6.0, "learner": 60_000 / 4.0})
    assert b.fraction == pytest.approx(6_000 / 10_000)
    # a sequential loop whose largest part is replay is buffer-bound too
    seq = run_bound({"sequential": _prof(env_step=1.0, inference=1.0, replay=3.0, sgd=2.5)}, {"sequential": 1},
                    1000, 100, 8.0)
    assert (seq.kind, seq.role) == ("buffer", "sequential")


def test_sequential_run_and_what_cannot_be_classified():
    seq = run_bound({"sequential": _prof(env_step=2.0, inference=1.0, replay=0.5, sgd=5.0, other=0.5, wait=1.0)},
                    {"sequential": 1}, 9000, 500, 10.0)
    assert seq.kind == "learner" and seq.steps_per_s == pytest.approx(9000 / 9.0)
    assert seq.fraction == pytest.approx(0.9)
    assert run_bound({"actor": _prof(wait=1.0), "learner": _prof(sgd=1.0)}, {"actor": 1, "learner": 1},
                     10, 1, 1.0) is None  # the actors never worked
    assert run_bound({"actor": _prof(env_step=1.0), "learner": _prof(wait=1.0, sgd=0.1)},
                     {"actor": 1, "learner": 1}, 10, 0, 1.0) is None  # no update yet
    with pytest.raises(ValueError, match="wall_s must be a finite number >= 0, got nan"):
        run_bound({}, {}, 1, 1, float("nan"))
    with pytest.raises(ValueError, match=r"processes has no count for role\(s\) \['learner'\]"):
        run_bound({"learner": _prof(sgd=1.0)}, {}, 1, 1, 1.0)


@pytest.fixture(scope="module")
def quick_run():
    """The training-quick suite's parallel configuration (2 actors + 1 learner, 600 steps), run
    through replaybench.impl.rl.train (its workers' kernels: the module docstring)."""
    from replaybench.impl.rl import train

    cfg = [c for c in training.suite_configs(suites.load("training-quick")) if not c.sequential][0]
    return cfg, train(cfg)


def test_profile_adds_up_to_the_run_wall_time(quick_run):
    """Each role's sections, summed and divided by its process count, equal the run's wall
    time within 25% + 0.3 s: every process profiles from its own "go" to its own end, while the
    run's wall time is the parent's from go to the last worker's report (so a process may start
    its clock a little before or after, and the parent's collection comes on top)."""
    _, result = quick_run
    for role, sections in result.profiles.items():
        per_process = sum(sections.values()) / result.processes[role]
        assert per_process == pytest.approx(result.wall_s, rel=0.25, abs=0.3), (role, per_process, result.wall_s)


def test_training_rows_and_table_state_the_bound(quick_run):
    cfg, result = quick_run
    acfg = cfg.validate()
    row = training.run_base(cfg, acfg, {"run_id": "t"})
    rows = training.result_rows(result, row)
    bound = {r["metric"]: r for r in rows if r["metric"] in ("bound_steps_per_s", "bound_fraction")}
    assert set(bound) == {"bound_steps_per_s", "bound_fraction"}
    kind = bound["bound_fraction"]["params"]["bound"]
    assert kind in ("actor", "learner", "buffer")
    expected = run_bound(result.profiles, result.processes, result.env_steps, result.updates, result.wall_s)
    assert bound["bound_steps_per_s"]["value"] == pytest.approx(expected.steps_per_s)
    # the binding role's busy share of the wall time: at most 1, up to the clocks' skew
    assert 0 < bound["bound_fraction"]["value"] <= 1.1
    table = training.format_table(rows)
    assert "bound" in table.splitlines()[0] and kind in table


def test_learner_replay_is_split_and_timed_alone_after_the_run(quick_run):
    """The learner's replay section split into sample and update (their sum is the section), its
    CPU seconds within the wall seconds, and the same calls timed alone after the run: present,
    positive, min(200, updates) of them, paced by the learner's gradient steps and waits, and
    the in-run over alone ratio their quotient."""
    _, result = quick_run
    parts, replay = result.replay_parts["learner"], result.profiles["learner"]["replay"]
    assert parts["sample"] > 0 and parts["update"] > 0
    assert parts["sample"] + parts["update"] == pytest.approx(replay)
    assert 0 < parts["cpu"] <= replay + 1e-3 and parts["lock_wait"] >= 0 and parts["redrawn_rows"] >= 0
    alone = result.replay_alone
    assert alone["calls"] == min(200, result.updates)
    assert all(alone[k] > 0 for k in ("sample", "tensor", "update", "cpu")), alone
    # paced as in the run: the learner's gradient step between each sample and its update, and
    # at most its mean wait per update before each call (sleeps may overrun by a scheduler tick)
    assert alone["learn"] > 0 and alone["pause"] >= 0
    assert alone["pause"] / alone["calls"] <= result.learner_wait_s / max(1, result.updates - 1) + 0.02
    inrun = replay / result.updates
    assert result.learner_replay_inrun_s == pytest.approx(inrun)
    assert result.learner_replay_alone_s == pytest.approx((alone["sample"] + alone["update"]) / alone["calls"])
    assert result.learner_replay_inrun_over_alone == pytest.approx(inrun / result.learner_replay_alone_s)
    assert result.learner_replay_cpu_inrun_over_alone > 0
    # beside the profile, never in it: the sections are still exactly the profiler's
    assert set(result.profiles["learner"]) == {"env_step", "inference", "replay", "sgd", "wait", "other"}


def test_training_rows_carry_the_replay_ratio_and_its_parts(quick_run, tmp_path):
    cfg, result = quick_run
    rows = training.result_rows(result, training.run_base(cfg, cfg.validate(), {}))
    summary = {r["metric"]: r for r in rows if r["op"] == "summary"}
    ratio = summary["learner_replay_inrun_over_alone"]
    assert (ratio["unit"], ratio["status"]) == ("x", "ok")
    assert ratio["value"] == pytest.approx(result.learner_replay_inrun_over_alone)
    assert summary["learner_replay_alone_s"]["unit"] == "s" and summary["learner_replay_cpu_inrun_over_alone"]
    parts = [r for r in rows if r["op"] == "replay_part"]
    assert {(r["params"]["when"], r["metric"]) for r in parts} >= {("in-run", "sample"), ("in-run", "update"),
                                                                    ("alone", "sample"), ("alone", "tensor")}
    alone = next(r for r in parts if r["params"]["when"] == "alone")
    assert alone["params"]["calls"] == result.replay_alone["calls"]
    for r in parts:
        assert r["unit"] == training.REPLAY_PART_UNITS[r["metric"]]
    # every row goes through the results contract the writer and the readers share
    from replaybench.bench import contract, results

    writer = results.RunWriter(tmp_path, "t", {"scenario": "training"})
    writer.append([{**r, "run_id": "t"} for r in rows])
    writer.finish(True)
    back = contract.read_rows(writer.dir)
    assert [r["metric"] for r in back] == [r["metric"] for r in rows]
    assert "replay/alone" in training.format_table(rows).splitlines()[0]


def test_a_run_without_the_alone_measurement_has_no_ratio_row(quick_run):
    """Engines that do not time the calls alone (ray, paac, sequential) write no ratio rows."""
    import dataclasses

    cfg, result = quick_run
    bare = dataclasses.replace(result, replay_parts={}, replay_alone={})
    assert bare.learner_replay_inrun_over_alone is None
    rows = training.result_rows(bare, training.run_base(cfg, cfg.validate(), {"run_id": "t"}))
    assert not [r for r in rows if r["metric"].startswith("learner_replay") or r["op"] == "replay_part"]


@pytest.mark.slow
def test_two_learners_time_their_replay_alone_in_turn():
    """With 2 learners each times its calls alone after the run, one after the other (a barrier
    between turns): the result sums both, and the redraw count is the buffer's, reported once."""
    import dataclasses

    from replaybench.impl.rl import train

    cfg = [c for c in training.suite_configs(suites.load("training-quick")) if not c.sequential][0]
    result = train(dataclasses.replace(cfg, learners=2))
    assert result.replay_alone["calls"] == 2 * min(200, result.updates)
    assert result.learner_replay_inrun_over_alone > 0
    parts = result.replay_parts["learner"]
    assert parts["sample"] + parts["update"] == pytest.approx(result.profiles["learner"]["replay"])


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


def test_runs_that_differ_only_in_learner_settings_get_lines_of_their_own(quick_run):
    """Two runs alike but for priority_lag, learner_prefetch or an algorithm override once shared
    one summary line, which showed the last of them only; each now has its own, naming what
    sets it apart."""
    cfg, result = quick_run
    rows = training.result_rows(result, training.run_base(cfg, cfg.validate(), {"run_id": "t"}))

    def variant(**extra):
        return [{**r, "params": {**r["params"], **extra}} for r in rows]

    table = training.format_table(rows + variant(priority_lag=1) + variant(learner_prefetch=True)
                                  + variant(overrides={"cuda_graph": False, "updates_per_step": 0.5}))
    header, _, *lines = table.splitlines()
    assert "settings" in header.split() and len(lines) == 4
    base = contract.training_settings(rows[0]["params"])  # this run's own overrides (a short test config)
    assert [f" {w} " in line for line, w in zip(lines, (base, f"lag=1 {base}", f"prefetch {base}",
                                                         "cuda_graph=False"))] == [True] * 4
