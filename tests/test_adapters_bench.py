"""The frameworks scenario (bench/scenarios/frameworks.py): suites expand into checked cells,
rows follow the results contract, and (slow) the quick suite runs through the driver."""

import json

import pytest

from replaybench.bench import driver, results, suites
from replaybench.bench.scenarios import Selection, SelectionError
from replaybench.bench.scenarios.frameworks import RunResult, result_rows, threshold_crossing


@pytest.mark.parametrize("name", ["frameworks-quick", "frameworks-sb3-tianshou", "frameworks-tianshou",
                                  "frameworks-torchrl", "frameworks-atari"])
def test_suites_expand_per_framework_and_seed_in_their_order(name):
    """"own-first": the own buffer, then the others; "abba": the others, the own buffer twice,
    the others mirrored (each buffer's two runs symmetric about the seed's middle)."""
    suite = suites.load(name)
    cells = driver.plan(suite).cells
    passes = {"own-first": 1, "abba": 2}[suite.get("order", "own-first")]
    size = len(suite["buffers"]) * passes
    assert len(cells) == len(suite["frameworks"]) * len(suite["seeds"]) * size
    for i in range(0, len(cells), size):
        group = cells[i: i + size]
        order = [(c.spec[3], c.columns["variant"]) for c in group]
        if passes == 1:
            assert order == [(0, b) for b in sorted(suite["buffers"], key=lambda b: b != "own")]
        else:
            assert [b for _, b in order] == [b for _, b in order][::-1] and order[len(order) // 2 - 1][1] == "own"
            assert [p for p, _ in order] == [0] * (size // 2) + [1] * (size // 2)
        assert len({(c.spec[0], c.spec[2]) for c in group}) == 1      # one framework and seed per group


def test_abba_order_gives_each_seed_one_speedup_from_both_runs_of_each_buffer(monkeypatch):
    """With order "abba" the speedup is the own buffer's mean wall time per step over ours,
    on our second run's rows only (ours, own, own, ours: a linear drift of the host cancels);
    each run keeps its own summary, tagged with its pass. A bad order is refused."""
    from replaybench.bench.scenarios import RunState, frameworks

    suite = {**suites.load("frameworks-quick"), "frameworks": ["sb3"], "buffers": ["own", "kary-aligned"],
             "order": "abba"}
    cells = driver.plan(suite).cells
    assert [(c.columns["variant"], c.spec[3]) for c in cells] == [("kary-aligned", 0), ("own", 0), ("own", 1),
                                                                   ("kary-aligned", 1)]
    # the host slows by 1 ms per env step each run; ours costs 2 ms less than own per step
    walls = iter([10.0, 13.0, 14.0, 13.0])       # per env step, ms: ours 10, own 13, own 14, ours 13

    def runner(env, buffer, seed, steps, h, **_):
        if steps != suite["steps"]:                # the untimed warm-up
            return RunResult(0.1, steps, {}, [])
        return RunResult(next(walls) * steps / 1e3, steps, {"replay_sample": 0.1}, [(10, 0.1, 20.0)])

    monkeypatch.setitem(frameworks.RUNNERS["dqn"], "sb3", runner)
    state = RunState(raw_dir=None, meta={}, progress=False, bar=None, cells=len(cells))
    rows = [frameworks.SCENARIO.measure(c, state) for c in cells]
    speedups = [[r for r in mine if r["metric"] == "speedup_vs_own"] for mine in rows]
    assert [len(s) for s in speedups] == [0, 0, 0, 1]
    assert speedups[3][0]["value"] == pytest.approx((13 + 14) / (10 + 13)) and speedups[3][0]["repeat"] == 1
    assert [[r["repeat"] for r in mine if r["metric"] == "wall_per_step_s"] for mine in rows] == [[0], [0], [1], [1]]
    with pytest.raises(SelectionError, match="'order' must be one of"):
        driver.plan({**suite, "order": "random"})


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
    assert summary["replay_per_step_s"]["value"] == pytest.approx(0.5 / 1000)
    assert summary["speedup_vs_own"]["value"] == pytest.approx(2.0)
    assert summary["time_to_threshold_s"]["value"] == 2.0 and summary["steps_to_threshold"]["value"] == 40
    assert summary["final_return"]["value"] == pytest.approx((470 + 500 + 20) / 3)
    profile = {r["metric"]: r["value"] for r in rows if r["op"] == "profile"}
    assert profile == pytest.approx({"replay_add": 0.2, "replay_sample": 0.3, "replay_update": 0.0,
                                     "replay_read": 0.0, "other": 1.5})
    assert summary["buffer_share"]["value"] == pytest.approx(0.25)  # no reads: every call is a replay call
    reads = result_rows(RunResult(2.0, 1000, {"replay_sample": 0.3, "replay_read": 0.1}, episodes), cell.columns,
                        475, 3, None)
    got = {r["metric"]: r["value"] for r in reads if r["op"] in ("summary", "profile")}
    assert got["replay_share"] == pytest.approx(0.15) and got["buffer_share"] == pytest.approx(0.2)
    assert got["buffer_per_step_s"] == pytest.approx(0.4 / 1000) and got["other"] == pytest.approx(1.6)
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
             "paper": suites.load("frameworks-sb3-tianshou")["paper"]}
    run_dir = driver.run(suite, out=tmp_path, run_id="fw", progress=False, echo=lambda *_: None)
    frame, meta = load_run(run_dir)
    plot = figure.build(frame, {"fw": meta})
    data = plot.data.set_index(["framework", "variant", "metric"])
    assert data.loc[("sb3", "kary-aligned", "speedup_vs_own"), "median"] == pytest.approx(2.0)
    assert data.loc[("torchrl", "own", "replay_share"), "median"] == pytest.approx(0.5)
    # window 5: the 7th episode (70 steps) is the first whose last five all returned 500
    assert data.loc[("sb3", "own", "time_to_threshold_s"), "median"] == pytest.approx(0.004 * 70)

    class Res:
        metas = {"fw": meta}  # the suite's paper range, copied into meta.json by the driver

    text = "\n".join(figure.report_section(plot.data, Res(), {"frameworks": plot.data}))
    assert "## Inside other frameworks" in text and "PAL: 1.1-2.1x" in text
    assert "| sb3 | CartPole-v1 | `kary-aligned` | 1 | 2 | 50% | 1000.0 | 2.00 | 0.14 (1/1 runs) | 70 (1/1 runs) | 500 |" \
        in text
    # replay per env step 1 ms against 2 ms, own share 50%: at most 2x, 1.33x from replay alone, 2x measured
    assert ("| sb3 | CartPole-v1 | `kary-aligned` | 0.50 (reported (own is uniform)) | 50.0% | 0.50 | 2.00 | 1.33 | "
            "2.00 | met |") in text
    assert "| torchrl | CartPole-v1 | `kary-aligned` | 0.50 (<= 0.5 met) | 50.0% | 0.50 | 2.00 | 1.33 | 2.00 | met |" in text


def test_each_framework_runs_with_its_own_published_settings():
    """frameworks.json: per framework the settings its users run (issue 29 item 3), 5 seeds, and
    the source of each setting recorded beside it; SB3 and Tianshou in one suite that runs
    alone, TorchRL's long runs in the other, ``frameworks`` both in turn."""
    assert suites.load("frameworks")["suites"] == ["frameworks-sb3-tianshou", "frameworks-torchrl"]
    parts = [suites.load(name) for name in suites.load("frameworks")["suites"]]
    assert [p["frameworks"] for p in parts] == [["sb3", "tianshou"], ["torchrl"]]
    assert parts[0]["expected_minutes"] <= 35 < parts[1]["expected_minutes"]  # the first half runs within a session
    cells = [c for p in parts for c in driver.plan(p).cells]
    suite = {"per_framework": {fw: v for p in parts for fw, v in p["per_framework"].items()}}
    assert len(cells) == (2 * 2 + 1) * 5 * 2  # sb3 and tianshou: two runs per seed and buffer ("abba")
    params = {c.spec[0]: json.loads(json.dumps(c.columns["params"])) for c in cells}
    sb3, tianshou, torchrl = (params[fw] for fw in ("sb3", "tianshou", "torchrl"))
    assert sb3["steps"] == 50_000 and sb3["hyper"]["train_freq"] == 256 and sb3["hyper"]["gradient_steps"] == 128
    assert sb3["hyper"]["hidden"] == [256, 256] and sb3["hyper"]["lr"] == 0.0023
    assert tianshou["hyper"]["n_envs"] == 10 and tianshou["hyper"]["n_step"] == 3 and tianshou["hyper"]["double_q"]
    assert tianshou["hyper"]["eps_hold"] == 10_000 and tianshou["steps"] == 100_000
    assert torchrl["steps"] == 500_000 and torchrl["hyper"]["gradient_steps"] == 100
    assert {c.columns["capacity"] for c in cells if c.spec[0] == "torchrl"} == {10_000}
    assert all("line" in suite["per_framework"][fw]["source"] for fw in ("sb3", "tianshou", "torchrl"))


def test_settings_a_loop_cannot_honour_are_refused_by_name():
    suite = suites.load("frameworks-quick")
    for change, message in [
            ({"per_framework": {"sb3": {"hyper": {"n_step": 3}}}}, r"sb3's DQN loop takes only hyper\['n_step'\] = 1"),
            ({"per_framework": {"torchrl": {"hyper": {"n_envs": 4}}}}, r"torchrl's DQN loop takes only hyper\['n_envs'\]"),
            ({"per_framework": {"tianshou": {"hyper": {"n_envs": 3}}}}, "must be a multiple of n_envs 3"),
            ({"per_framework": {"tianshou": {"hyper": {"double_q": 1}}}}, r"hyper\['double_q'\] must be true or false"),
            ({"per_framework": {"keras": {}}}, "'per_framework' must map frameworks of the suite"),
            ({"per_framework": {"sb3": {"step": 5}}}, r"per_framework\['sb3'\] has unknown key\(s\) \['step'\]"),
            ({"per_framework": {"sb3": {"steps": 0}}}, "'steps' must be a positive integer, got 0 for sb3"),
            ({"algo": "ppo"}, "'algo' must be one of"),
            ({"algo": "a2c"}, r"algo 'a2c' runs in \['sb3'\] only")]:
        with pytest.raises(SelectionError, match=message):
            driver.plan({**suite, **change})
    a2c = suites.load("frameworks-a2c-quick")
    for change, message in [({"buffers": ["own", "kary-aligned"]}, "algo 'a2c' has no replay buffer"),
                            ({"hyper": {"batch_size": 3}}, r"unknown 'hyper' key\(s\) \['batch_size'\] for algo 'a2c'"),
                            ({"hyper": {"optimizer": "adam"}}, r"hyper\['optimizer'\] must be one of"),
                            ({"hyper": {"n_steps": 0}}, r"hyper\['n_steps'\] must be an integer >= 1")]:
        with pytest.raises(SelectionError, match=message):
            driver.plan({**a2c, **change})


def test_epsilon_holds_then_falls_linearly():
    from replaybench.bench.scenarios.frameworks import HYPER, epsilon

    # Tianshou's CartPole test: 0.1 up to 10k env steps, then linearly to 0.01 at 50k
    h = {**HYPER, "eps_start": 0.1, "eps_end": 0.01, "eps_hold": 10_000, "eps_fraction": 0.4}
    assert [epsilon(h, s, 100_000) for s in (0, 10_000, 30_000, 50_000, 90_000)] == \
        pytest.approx([0.1, 0.1, 0.055, 0.01, 0.01])
    assert epsilon({**h, "eps_hold": 0}, 20_000, 100_000) == pytest.approx(0.055)


def test_a2c_rows_have_no_replay_columns_and_say_why_the_threshold_is_missing():
    cell = driver.plan(suites.load("frameworks-a2c-quick")).cells[0]
    assert cell.columns["algo"] == "a2c" and cell.columns["variant"] == "own" and cell.columns["capacity"] is None
    episodes = [(100 * i, 0.1 * i, -21.0) for i in range(1, 4)]
    rows = result_rows(RunResult(2.0, 400, {}, episodes), cell.columns, threshold=-10, window=2, own_wall=None,
                       replay_buffer=False)
    summary = {r["metric"]: r for r in rows if r["op"] == "summary"}
    assert set(summary) == {"wall_per_step_s", "time_to_threshold_s", "steps_to_threshold", "final_return"}
    assert summary["time_to_threshold_s"]["status"] == "skipped"
    assert summary["time_to_threshold_s"]["error"] == ("threshold -10 (mean return of 2 episodes) not reached in "
                                                       "400 env steps (3 episodes)")
    assert not [r for r in rows if r["op"] == "profile"] and len([r for r in rows if r["op"] == "episode"]) == 3


def test_sb3_atari_env_is_made_as_our_pong_runs_make_it():
    """ALE/ ids get every frame emulated (AtariWrapper skips 4), no sticky actions and v5's
    episode limit, as impl.rl.common.envs.make_env; 4 frames of 84x84 stacked."""
    pytest.importorskip("ale_py")
    pytest.importorskip("stable_baselines3")
    from replaybench.bench.scenarios.frameworks import make_sb3_env
    from replaybench.impl.rl.common.atari import AtariOptions

    env = make_sb3_env("ALE/Pong-v5", 0, 2, atari=True, frame_stack=4)
    try:
        assert env.num_envs == 2 and env.observation_space.shape == (84, 84, 4)
        ale = env.venv.envs[0].unwrapped
        assert ale._frameskip == 1 and ale.ale.getFloat("repeat_action_probability") == 0.0
        assert ale.ale.getInt("max_num_frames_per_episode") == AtariOptions().max_frames
    finally:
        env.close()


@pytest.mark.slow
def test_quick_a2c_suite_runs_through_the_driver(tmp_path):
    run_dir = driver.run(suites.load("frameworks-a2c-quick"), out=tmp_path, run_id="a2c", progress=False,
                         echo=lambda *_: None)
    rows = results.read_rows(run_dir)
    summary = {r["metric"]: r for r in rows if r["op"] == "summary"}
    assert summary["wall_per_step_s"]["status"] == "ok" and summary["final_return"]["status"] == "ok"
    assert summary["time_to_threshold_s"]["status"] == "skipped"
    episodes = [r for r in rows if r["op"] == "episode"]
    assert episodes and all(r["algo"] == "a2c" and 0 < r["env_steps"] <= 800 for r in episodes)


def test_the_run_table_says_for_every_row_whether_the_threshold_was_reached():
    from replaybench.bench.scenarios.frameworks import format_table

    cells = driver.plan({**suites.load("frameworks-quick"), "seeds": [0, 1]}).cells
    rows = []
    for cell in cells:
        fast = cell.columns["seed"] == 0 and cell.columns["variant"] == "own"     # one seed of the own buffer learns
        episodes = [(10 * i, 0.5 * i, 500.0 if fast else 20.0) for i in range(1, 8)]
        rows += result_rows(RunResult(2.0, 1000, {}, episodes), {**cell.columns, "status": "ok"}, 475, 5, None)
    text = format_table(rows)
    lines = {tuple(line.split()[:2]): line for line in text.splitlines()[2:]}
    assert "2 (1/2)" in lines[("sb3", "own")] and "not reached (0/2)" in lines[("sb3", "kary-aligned")]


def test_the_replay_bound_says_which_limit_holds():
    """bench.derive.replay_bound: the own buffer's replay share caps the speedup at 1 / (1 - s);
    with replay ratio r the prediction is 1 / (1 - s + s r); the bound is the first that holds."""
    from replaybench.bench.derive import replay_bound

    b = replay_bound(0.2, 0.5, 1.12)                 # 1 / 0.9 = 1.11 predicted, 1.25 at most
    assert b["ceiling"] == pytest.approx(1.25) and b["predicted"] == pytest.approx(1 / 0.9)
    assert b["bound"] == "met" and b["loop_ratio"] == pytest.approx(1.12 * 0.9)
    assert b["needed_ratio"] == pytest.approx(1 - (1 - 1 / 1.05) / 0.2)
    assert replay_bound(0.04, 0.0, 1.01)["bound"] == "share"     # 1 / 0.96 = 1.042 < 1.05 whatever the buffer
    assert replay_bound(0.2, 0.9, 1.0)["bound"] == "replay"      # predicted 1.02
    assert replay_bound(0.2, 0.5, 1.0)["bound"] == "loop"        # predicted 1.11, measured 1.0
    assert replay_bound(0.2, 0.5, None)["bound"] is None and replay_bound(0.2, 0.9, None)["bound"] == "replay"
    for kwargs, name in (({"share_own": 1.0}, "share_own"), ({"replay_ratio": -1.0}, "replay_ratio"),
                         ({"target": 0.9}, "target"), ({"share_own": float("nan")}, "share_own")):
        args = {"share_own": 0.2, "replay_ratio": 0.5, "speedup": 1.0, **kwargs}
        with pytest.raises(ValueError, match=name):
            replay_bound(**args)


def test_the_summary_sets_replay_per_step_and_the_bound_beside_the_targets():
    """The terminal summary of a frameworks run: replay time per env step ours/own against its
    target (reported only for SB3's uniform own buffer), the speedup and the bound, and steps to
    threshold for every row."""
    from replaybench.bench.scenarios.frameworks import format_table

    cells = {c.spec[:2]: c for c in driver.plan(suites.load("frameworks-quick")).cells}
    episodes = [(10 * i, 0.1 * i, 500.0) for i in range(1, 6)]
    rows = []
    for fw in ("sb3", "tianshou"):
        own = result_rows(RunResult(4.0, 1000, {"replay_sample": 1.0}, episodes), cells[(fw, "own")].columns, 475, 5, None)
        ours = result_rows(RunResult(3.8, 1000, {"replay_sample": 0.8}, []), cells[(fw, "kary-aligned")].columns,
                           475, 5, 0.004)
        rows += own + ours
    text = format_table(rows, suites.load("frameworks-sb3-tianshou")["targets"]["frameworks"])
    lines = {tuple(line.split()[:2]): line for line in text.splitlines()}
    # r = 0.8, s = 0.25: at most 1.33x, 1.05x from replay alone; measured 4 / 3.8 = 1.05x
    assert "0.80 (<= 0.5)" in lines[("tianshou", "kary-aligned")] and "0.80 (reported)" in lines[("sb3", "kary-aligned")]
    assert "met (max 1.33x, buffer alone 1.05x)" in lines[("tianshou", "kary-aligned")]
    assert "not reached (0/1)" in lines[("tianshou", "kary-aligned")] and "50 (1/1)" in lines[("tianshou", "own")]


def test_the_targets_table_reads_older_runs_replay_time_from_share_and_wall_time():
    """Runs stored before ``replay_per_step_s`` existed: replay time per env step is their
    replay share times their wall time per step."""
    import pandas as pd

    from replaybench.analysis.plots import frameworks as figure

    rows = [{"framework": "tianshou", "env": "CartPole-v1", "variant": v, "metric": m, "median": x, "min": x,
             "max": x, "n_reached": 1, "n_seeds": 1}
            for v, wall, share, speed in (("own", 0.002, 0.2, None), ("kary-aligned", 0.0019, 0.1, 1.05))
            for m, x in (("wall_per_step_s", wall), ("replay_share", share), ("speedup_vs_own", speed))
            if x is not None]

    class Res:
        metas = {}

    text = "\n".join(figure.report_section(pd.DataFrame(rows), Res(), {}))
    # ours 0.19 ms x 10% against 0.4 ms: 0.475; own share 20%: at most 1.25x, 1.12x predicted, 1.05 measured
    assert ("| tianshou | CartPole-v1 | `kary-aligned` | 0.47 (<= 0.5 met) | 20.0% (replay only) | 0.47 | 1.25 | 1.12 "
            "| 1.05 | met |") in text
    assert "(the runs recorded none: issue 29's)" in text


def test_the_bound_counts_every_call_into_the_buffer():
    """Tianshou's n-step returns read the buffer outside add, sample and update: the bound takes
    the own buffer's share from every call (buffer_share) and the ratio of those calls, so a
    speedup from faster reads does not beat it (a run measured 1.11x against a 1.10x bound
    from the three calls alone); runs without the new metrics keep the replay figures."""
    from replaybench.bench.derive import replay_versus_own

    own = {"replay_per_step_s": 4e-5, "replay_share": 0.09, "buffer_per_step_s": 6e-5, "buffer_share": 0.13}
    ours = {"replay_per_step_s": 2e-5, "buffer_per_step_s": 2.5e-5, "speedup_vs_own": 1.11}
    v = replay_versus_own("tianshou", own, ours)
    assert v["replay_ratio"] == pytest.approx(0.5) and v["calls"] == "every call"
    assert v["share_own"] == 0.13 and v["buffer_ratio"] == pytest.approx(2.5 / 6)
    assert v["ceiling"] == pytest.approx(1 / 0.87) and v["ceiling"] > v["speedup"]
    old = replay_versus_own("tianshou", {k: own[k] for k in ("replay_per_step_s", "replay_share")},
                            {k: ours[k] for k in ("replay_per_step_s", "speedup_vs_own")})
    assert old["calls"] == "add, sample, update" and old["share_own"] == 0.09 and old["buffer_ratio"] == 0.5


def test_timers_count_the_outermost_call_and_reach_special_methods(monkeypatch):
    """Timers.wrap_class times ``obj[i]`` (looked up on the type) and methods, once per outermost
    call: a timed method that calls another timed one is counted in its own section only."""
    import types

    from replaybench.bench.scenarios import frameworks

    now = [0.0]
    monkeypatch.setattr(frameworks, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    class Buffer:
        def __init__(self):
            self.items = [1, 2, 3]

        def __getitem__(self, i):
            now[0] += 1.0
            return self.items[i]

        def sample(self):
            now[0] += 10.0
            return self[0] + self[1]

    buf, timers = Buffer(), frameworks.Timers()
    timers.wrap_class(buf, {"__getitem__": "replay_read", "sample": "replay_sample"})
    assert buf.sample() == 3 and buf[2] == 3 and isinstance(buf, Buffer) and buf.items == [1, 2, 3]
    assert timers.seconds == {"replay_sample": 12.0, "replay_read": 1.0}  # the reads inside sample: there only
    assert timers.call("replay_add", lambda: 5) == 5 and timers.seconds["replay_add"] == 0.0


def test_the_sb3_runner_leaves_no_log_folder_behind(tmp_path, monkeypatch):
    """SB3's learn makes an ``SB3-<time>`` folder under the temporary directory unless it is given
    a logger; the frameworks runner gives it one (one empty folder per run once piled up in /tmp)."""
    import tempfile

    from replaybench.bench.scenarios import frameworks

    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    got = frameworks.run_sb3_a2c("CartPole-v1", "own", 0, 20, {**frameworks.A2C_HYPER, "n_steps": 5})
    assert got.steps >= 20 and [p.name for p in tmp_path.iterdir() if p.name.startswith("SB3-")] == []
