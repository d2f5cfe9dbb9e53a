"""The frameworks scenario (bench/scenarios/frameworks.py): suites expand into checked cells,
rows follow the results contract, and (slow) the quick suite runs through the driver."""

import json

import pytest

from replaybench.bench import driver, results, suites
from replaybench.bench.scenarios import Selection, SelectionError
from replaybench.bench.scenarios.frameworks import RunResult, result_rows, threshold_crossing


@pytest.mark.parametrize("name", ["frameworks-quick", "frameworks", "frameworks-atari"])
def test_suites_expand_own_buffer_first_per_framework_and_seed(name):
    suite = suites.load(name)
    cells = driver.plan(suite).cells
    assert len(cells) == len(suite["frameworks"]) * len(suite["seeds"]) * len(suite["buffers"])
    for i in range(0, len(cells), len(suite["buffers"])):
        group = cells[i: i + len(suite["buffers"])]
        assert group[0].columns["variant"] == "own"
        assert len({(c.spec[0], c.spec[2]) for c in group}) == 1      # one framework and seed per group


def test_variants_selection_and_bad_suites_are_refused_before_any_run():
    suite = suites.load("frameworks-quick")
    cells = driver.plan(suite, Selection(variants=["kary-aligned"])).cells
    assert {c.columns["variant"] for c in cells} == {"kary-aligned"}
    with pytest.raises(SelectionError, match=r"--variants: \['binary'\] not among"):
        driver.plan(suite, Selection(variants=["binary"]))
    for change, message in [({"frameworks": ["keras"]}, "'frameworks' must be"),
                            ({"buffers": ["nope"]}, "buffer 'nope' is neither"),
                            ({"hyper": {"batch": 3}}, "unknown 'hyper' key"),
                            ({"hyper": {"train_freq": 0}}, r"hyper\['train_freq'\] must be an integer >= 1"),
                            ({"steps": -1}, "'steps' must be"),
                            ({"atari": True}, "'atari' must be")]:
        with pytest.raises(SelectionError, match=message):
            driver.plan({**suite, **change})


def test_rows_follow_the_contract_and_compare_with_the_own_buffer():
    cell = driver.plan(suites.load("frameworks-quick")).cells[1]
    episodes = [(10 * i, 0.5 * i, float(r)) for i, r in enumerate([10, 500, 480, 490, 470, 500, 20], 1)]
    result = RunResult(wall_s=2.0, steps=1000, replay={"replay_add": 0.2, "replay_sample": 0.3}, episodes=episodes)
    assert threshold_crossing(episodes, 475, 3) == (40, 2.0)
    rows = result_rows(result, cell.columns, threshold=475, window=3, own_wall=0.004)
    summary = {r["metric"]: r for r in rows if r["op"] == "summary"}
    assert summary["wall_per_step_s"]["value"] == pytest.approx(0.002)
    assert summary["replay_share"]["value"] == pytest.approx(0.25)
    assert summary["speedup_vs_own"]["value"] == pytest.approx(2.0)
    assert summary["time_to_threshold_s"]["value"] == 2.0 and summary["steps_to_threshold"]["value"] == 40
    assert summary["final_return"]["value"] == pytest.approx((470 + 500 + 20) / 3)
    profile = {r["metric"]: r["value"] for r in rows if r["op"] == "profile"}
    assert profile == pytest.approx({"replay_add": 0.2, "replay_sample": 0.3, "replay_update": 0.0, "other": 1.5})
    assert len([r for r in rows if r["op"] == "episode"]) == 7
    never = result_rows(RunResult(2.0, 1000, {}, episodes[:1]), cell.columns, 475, 3, None)
    assert {r["metric"]: r["status"] for r in never if r["op"] == "summary"}["time_to_threshold_s"] == "skipped"
    assert "speedup_vs_own" not in {r["metric"] for r in never}


@pytest.mark.slow
def test_quick_suite_runs_every_framework_through_the_driver(tmp_path):
    from replaybench.analysis.load import load_run

    run_dir = driver.run(suites.load("frameworks-quick"), out=tmp_path, run_id="fw", progress=False,
                         echo=lambda *_: None)
    rows = results.read_rows(run_dir)
    summary = [r for r in rows if r["op"] == "summary" and r["metric"] == "wall_per_step_s"]
    assert len(summary) == 6 and all(r["status"] == "ok" for r in summary), summary
    frameworks = {json.loads(r["params"])["framework"] if isinstance(r["params"], str) else r["params"]["framework"]
                  for r in summary}
    assert frameworks == {"sb3", "tianshou", "torchrl"}
    assert all(0 < r["value"] < 1 for r in rows if r["metric"] == "replay_share")
    frame, _ = load_run(run_dir)
    assert len(frame) == len(rows)


def test_a_run_through_the_driver_makes_the_figure_and_the_report_section(tmp_path, monkeypatch):
    """The lifecycle with stand-in training loops (the real ones are the slow test above): rows
    on disk, the loader, the figure's data and the report's table."""
    from replaybench.analysis import report
    from replaybench.analysis.load import load_run
    from replaybench.analysis.plots import frameworks as figure
    from replaybench.bench.scenarios import frameworks

    def stand_in(env_id, buffer, seed, steps, h, **_):
        cost = 0.004 if buffer == "own" else 0.002           # ours twice as fast per step
        episodes = [(10 * i, cost * 10 * i, 500.0 if i > 2 else 20.0) for i in range(1, 8)]
        return RunResult(cost * steps, steps, {"replay_sample": 0.5 * cost * steps}, episodes)

    monkeypatch.setattr(frameworks, "RUNNERS", {"dqn": {fw: stand_in for fw in frameworks.FRAMEWORKS}})
    # PAL's range travels with the suite into meta.json (the quick suite has none of its own)
    suite = {**suites.load("frameworks-quick"), "frameworks": ["sb3", "torchrl"],
             "paper": suites.load("frameworks")["paper"]}
    run_dir = driver.run(suite, out=tmp_path, run_id="fw", progress=False, echo=lambda *_: None)
    frame, meta = load_run(run_dir)
    plot = figure.build(frame, {"fw": meta})
    data = plot.data.set_index(["framework", "variant", "metric"])
    assert data.loc[("sb3", "kary-aligned", "speedup_vs_own"), "median"] == pytest.approx(2.0)
    assert data.loc[("torchrl", "own", "replay_share"), "median"] == pytest.approx(0.5)
    # window 5: the 7th episode (70 steps) is the first whose last five all returned 500
    assert data.loc[("sb3", "own", "time_to_threshold_s"), "median"] == pytest.approx(0.004 * 70)

    class Outcome:
        data = {"frameworks": plot.data}

    class Res:
        metas = {"fw": meta}

    text = "\n".join(report._frameworks(Outcome(), Res()))
    assert "## Inside other frameworks" in text and "PAL: 1.1-2.1x" in text
    assert "| sb3 | CartPole-v1 | `kary-aligned` | 1 | 2 | 50% | 2.00 | 0.14 (1/1 seeds) | 500 |" in text
