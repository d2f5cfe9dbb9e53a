"""The scenario driver: a toy scenario end to end, Ctrl-C, and bad input refused before any work.

The toy scenario is tests/toy/toy_sort.py with its suite tests/toy/toy_sort.json: one module
and one JSON, found through the suite's ``"scenario"`` with no list edited. Refusals are
checked through ``replaybench run`` (exit status 2, a message naming the option and the value,
no run folder created).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replaybench.bench import arguments, driver, results, suites
from replaybench.bench.scenarios import Selection, SelectionError, micro

from _examples import load_example
from test_bench import interrupt_run

ROOT = Path(__file__).resolve().parent.parent
TOY = Path(__file__).resolve().parent / "toy"
REPLAYBENCH = str(Path(sys.executable).with_name("replaybench"))


def replaybench(*args, timeout=120):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TOY), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([REPLAYBENCH, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def toy_suite(tmp_path, **changes) -> Path:
    suite = {**json.loads((TOY / "toy_sort.json").read_text()), **changes}
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(suite))
    return path


def quiet(*_):
    pass


# ------------------------------------------------------------------------------------------ the toy
def test_toy_scenario_runs_end_to_end(tmp_path):
    """`replaybench run --suite toy_sort.json`: ok, failed and skipped rows, meta, table, and a
    run the analysis loader accepts."""
    from replaybench.analysis.load import load_run

    out = tmp_path / "results"
    proc = replaybench("run", "--suite", str(TOY / "toy_sort.json"), "--out", str(out), "--run-id", "toy",
                       "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = out / "toy"
    rows = results.read_rows(run_dir)
    assert {r["scenario"] for r in rows} == {"toy_sort"} and {r["run_id"] for r in rows} == {"toy"}
    by = {}
    for r in rows:
        by.setdefault((r["variant"], r["capacity"]), []).append(r)
    assert [r["status"] for r in by[("sorted", 1000)]] == ["ok"] * 3
    assert all(r["value"] > 0 and r["items_per_call"] == 1000 for r in by[("sorted", 1000)])
    assert [r["status"] for r in by[("sorted", 100000)]] == ["skipped"]
    assert "above max_size 10000" in by[("sorted", 100000)][0]["error"]
    assert [r["status"] for r in by[("broken", 1000)]] == ["failed"]
    assert "RuntimeError: injected failure" in by[("broken", 1000)][0]["error"]
    assert by[("broken", 1000)][0]["value"] is None and by[("broken", 1000)][0]["op"] == "sort"
    meta = results.read_meta(run_dir)
    assert meta["complete"] is True and meta["interrupted"] is False and meta["scenario"] == "toy_sort"
    assert meta["items_total"] == meta["items_done"] == 6
    assert meta["items_by_status"]["ok"] == 2 and meta["items_by_status"]["failed"] == 2
    assert meta["items_by_status"]["skipped"] == 2
    assert meta["suite"]["name"] == "toy-sort" and "--run-id" in meta["command"]
    assert "injected failure" in proc.stdout and str(run_dir) in proc.stdout  # the table, then the folder
    frame, _ = load_run(run_dir)
    assert len(frame) == len(rows)


def test_scenario_example_runs_from_the_command_line_and_from_main(tmp_path):
    """examples/sleep_scenario.py with examples/sleep.json (docs/extending.md), run by the
    command the docs give and by its main()."""
    examples = ROOT / "examples"
    env = {**os.environ, "PYTHONPATH": str(examples)}
    proc = subprocess.run([REPLAYBENCH, "run", "--suite", str(examples / "sleep.json"), "--out", str(tmp_path / "r"),
                           "--run-id", "s", "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = results.read_rows(tmp_path / "r" / "s")
    assert len(rows) == 6 and {r["status"] for r in rows} == {"ok"} and {r["scenario"] for r in rows} == {"sleep"}
    for r in rows:
        assert r["value"] >= json.loads(r["params"])["asked_s"]
    assert results.read_meta(tmp_path / "r" / "s")["complete"] is True
    rows = load_example("sleep_scenario").main(out=str(tmp_path / "m"))
    assert len(rows) == 6 and (tmp_path / "m" / "sleep" / "meta.json").exists()


def test_the_suites_paper_and_targets_are_copied_into_meta(tmp_path, monkeypatch):
    """What the analysis compares with travels with the run: meta.json gets the suite's
    ``paper`` and ``targets`` ({} when it has none)."""
    monkeypatch.syspath_prepend(str(TOY))
    suite = {**json.loads((TOY / "toy_sort.json").read_text()), "variants": ["sorted"], "sizes": [100], "repeats": 1}
    goals = {"paper": {"sorting": {"ratio": 1.5}}, "targets": {"sorting": {"at_least": 2.0}}}
    meta = results.read_meta(driver.run({**suite, **goals}, out=tmp_path, run_id="with", progress=False, echo=quiet))
    assert {k: meta[k] for k in goals} == goals
    meta = results.read_meta(driver.run(suite, out=tmp_path, run_id="without", progress=False, echo=quiet))
    assert meta["paper"] == {} and meta["targets"] == {}


@pytest.mark.parametrize("kind,value", [("targets", [1.3]), ("paper", {"lf_over_ray": 1.2})])
def test_paper_and_targets_must_be_objects_of_topics(tmp_path, kind, value):
    path = toy_suite(tmp_path, **{kind: value})
    with pytest.raises(ValueError, match=f"'{kind}' must be an object of topics"):
        suites.load(str(path))
    shipped = [suites.load(name) for name in suites.available()]
    assert any(s.get("targets") for s in shipped) and any(s.get("paper") for s in shipped)


def test_toy_run_interrupted_keeps_finished_cells(tmp_path):
    suite = toy_suite(tmp_path, pause_s=0.3, variants=["sorted"], sizes=[10, 20, 30, 40, 50, 60, 70, 80],
                      max_size=100)
    env = {**os.environ, "PYTHONPATH": str(TOY)}
    cmd = [REPLAYBENCH, "run", "--suite", str(suite), "--out", str(tmp_path / "r"), "--no-progress"]
    def two_cells_finished(rows):  # a cell writes 3 rows; one seen half written is dropped on interrupt
        caps = [r["capacity"] for r in rows]
        return sum(caps.count(c) == 3 for c in set(caps)) >= 2

    code, output = interrupt_run(cmd, tmp_path / "r", two_cells_finished, env=env)
    assert code == 130, output
    (run_dir,) = (tmp_path / "r").iterdir()
    meta = results.read_meta(run_dir)
    assert meta["complete"] is False and meta["interrupted"] is True
    rows = results.read_rows(run_dir)
    done = {r["capacity"] for r in rows}
    assert 2 <= len(done) == meta["items_done"] < meta["items_total"] == 8
    assert all(len([r for r in rows if r["capacity"] == c]) == 3 for c in done)  # no cell kept half
    assert {r["status"] for r in rows} == {"ok"}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed one, on purpose
def test_a_ctrl_c_a_finalizer_swallowed_ends_the_run_after_its_cell(tmp_path):
    """CI once lost a run's Ctrl-C: the KeyboardInterrupt was raised inside a weakref callback,
    where Python prints it and goes on, and the run finished with exit status 0. The driver's
    latch keeps it: the run ends after that cell, marked interrupted, with what was written."""
    import signal
    import time
    import weakref

    from replaybench.bench.scenarios import Cell, Scenario

    class SwallowsCtrlC(Scenario):
        name = "swallows_ctrl_c"

        def measure(self, cell, run):
            if cell.spec == 1:
                class Owner:
                    pass

                def on_collect(ref):
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.01)  # the KeyboardInterrupt is raised in here, and dropped

                owner = Owner()
                ref = weakref.ref(owner, on_collect)
                del owner
                assert ref() is None  # the callback ran, and the cell goes on
            return [cell.row("ok", value=1.0)]

    scenario = SwallowsCtrlC()
    cells = [Cell(f"cell {i}", {"variant": "v", "capacity": i, "op": "x"}, i) for i in range(4)]
    p = driver.Plan({"name": "swallow"}, scenario, cells, Selection())
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as `replaybench run` has it
    try:
        with pytest.raises(KeyboardInterrupt):
            driver.execute(p, out=tmp_path, run_id="r", progress=False, echo=quiet)
    finally:
        signal.signal(signal.SIGINT, previous)
    meta = results.read_meta(tmp_path / "r")
    assert meta["complete"] is False and meta["interrupted"] is True
    assert meta["items_done"] == 2 and meta["items_total"] == 4
    assert [r["capacity"] for r in results.read_rows(tmp_path / "r")] == [0, 1]


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_an_interrupt_as_the_folder_is_made_leaves_a_readable_marked_run(tmp_path, monkeypatch, signame):
    """Issue 41 item 16 (and item 7's SIGTERM): a Ctrl-C just after meta.json appeared left no
    rows.csv (or an empty one) and no ``interrupted`` key, and `summary` exited 1; a SIGTERM
    ended the process before anything was marked. Either signal now lands once the folder is
    whole, and the run is marked interrupted and readable."""
    import signal
    import time

    from replaybench.bench.scenarios import Cell, Scenario

    class Ok(Scenario):
        name = "ok"

        def measure(self, cell, run):
            return [cell.row("ok", value=1.0)]

    write_meta = results.RunWriter.write_meta

    def then_signal(self):  # the signal lands right after the first meta.json is on disk
        write_meta(self)
        if not (self.dir / "rows.csv").exists():
            os.kill(os.getpid(), getattr(signal, signame))
            time.sleep(0.05)

    monkeypatch.setattr(results.RunWriter, "write_meta", then_signal)
    p = driver.Plan({"name": "early"}, Ok(), [Cell("c", {"variant": "v", "capacity": 1, "op": "x"}, 0)], Selection())
    defaults = {s: signal.signal(s, h) for s, h in ((signal.SIGINT, signal.default_int_handler),
                                                    (signal.SIGTERM, signal.SIG_DFL))}  # as the CLI has them
    try:
        with pytest.raises(KeyboardInterrupt):
            driver.execute(p, out=tmp_path, run_id="r", progress=False, echo=quiet)
    finally:
        for s, h in defaults.items():
            signal.signal(s, h)
    monkeypatch.undo()
    meta = results.read_meta(tmp_path / "r")
    assert meta["complete"] is False and meta["interrupted"] is True and meta["items_done"] == 0
    assert results.read_rows(tmp_path / "r") == []  # rows.csv is there, with its header
    assert "r" in driver.summarize_run(tmp_path / "r")  # what `replaybench summary` prints, no error


def test_scenario_that_does_not_take_an_option_refuses_it(tmp_path):
    proc = replaybench("run", "--suite", str(TOY / "toy_sort.json"), "--ops", "sort", "--out", str(tmp_path))
    assert proc.returncode == 2 and "does not take --ops" in proc.stderr
    proc = replaybench("run", "--suite", str(toy_suite(tmp_path, scenario="no_such_scenario")), "--out",
                       str(tmp_path / "r"))
    assert proc.returncode == 2 and "unknown scenario 'no_such_scenario'" in proc.stderr
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------------------------------ issue 11.4
@pytest.mark.parametrize("bad", ["../escaped", "/tmp/absolute", "nested/id", ".hidden", "..", "a b", ""])
def test_run_id_is_one_safe_path_component(tmp_path, bad):
    out = tmp_path / "results"
    out.mkdir()
    proc = replaybench("run", "--suite", "micro-quick", "--variants", "binary", "--ops", "sample", "--out", str(out),
                       "--run-id", bad, "--no-progress")
    assert proc.returncode == 2, proc.stdout
    assert "--run-id" in proc.stderr and repr(bad) in proc.stderr
    assert not any(out.iterdir()) and not any(tmp_path.parent.glob("escaped"))
    with pytest.raises(ValueError, match="--run-id"):  # the driver refuses it too, before creating anything
        driver.run(suites.load("micro-quick"), Selection(variants=["binary"], ops=["sample"]), out=out, run_id=bad,
                   progress=False, echo=quiet)
    assert not any(out.iterdir())


def test_an_existing_run_id_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "results"
    (out / "taken").mkdir(parents=True)
    (out / "taken" / "rows.csv").write_text("kept\n")
    proc = replaybench("run", "--suite", "micro-quick", "--variants", "binary", "--ops", "sample", "--out", str(out),
                       "--run-id", "taken", "--no-progress")
    assert proc.returncode == 2 and "--run-id 'taken'" in proc.stderr and "exists already" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert [f.name for f in (out / "taken").iterdir()] == ["rows.csv"]
    assert (out / "taken" / "rows.csv").read_text() == "kept\n"


@pytest.mark.parametrize("command", [["train", "--sequential"], ["gossip"], ["run", "--suite", "quick"]])
@pytest.mark.parametrize("below", [False, True])
def test_out_that_is_a_file_is_refused_naming_it(tmp_path, capsys, monkeypatch, command, below):
    """``--out FILE`` or ``--out FILE/sub``: exit 2 naming --out and the file, before any work
    (issue 28 item 8); the driver refuses it too."""
    import subprocess as sp

    from replaybench.cli import main

    def no_work(*a, **k):
        raise AssertionError("work started")

    monkeypatch.setattr(driver, "execute", no_work)
    monkeypatch.setattr(sp, "Popen", no_work)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    out = blocker / "sub" if below else blocker
    with pytest.raises(SystemExit) as info:
        main([*command, "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "argument --out: " in err, err
    assert repr(str(out)) in err and f"{blocker} is a file" in err, err
    assert blocker.read_text() == "not a folder\n" and sorted(tmp_path.iterdir()) == [blocker]


def test_driver_refuses_an_out_that_is_a_file(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out in (blocker, blocker / "sub"):
        with pytest.raises(ValueError, match=f"--out .*{blocker.name}.* is a file"):
            driver.run(suites.load("micro-quick"), Selection(variants=["binary"], ops=["sample"]), out=out,
                       progress=False, echo=quiet)
    assert sorted(tmp_path.iterdir()) == [blocker]


def test_safe_run_ids_are_accepted():
    for good in ("20261122T010203Z-quick", "r1", "a.b_c-9", "-x"):
        assert arguments.check_run_id(good) == good


# ------------------------------------------------------------------------------------------ issue 11.5
def test_grid_value_of_the_wrong_type_is_refused_before_any_cell(tmp_path):
    proc = replaybench("run", "--suite", "micro-quick", "--variants", "kary", "--ops", "sample", "--capacities", "2**10",
                       "--param", "K=abc", "--out", str(tmp_path), "--no-progress")
    assert proc.returncode == 2, proc.stdout
    assert "--param" in proc.stderr and "K='abc'" in proc.stderr and "kary" in proc.stderr
    assert not any(tmp_path.iterdir())
    suite = {**suites.load("micro-quick"), "name": "bad-grid", "params": {"K": [4, "abc"]}}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(suite))
    proc = replaybench("run", "--suite", str(path), "--variants", "kary", "--out", str(tmp_path / "r"))
    assert proc.returncode == 2 and "suite 'bad-grid' params" in proc.stderr and "K='abc'" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_grid_values_are_typed_as_the_variants_declare():
    infos = micro.resolve_variants(suites.load("micro-quick"), ["binary", "kary"])
    grid = micro.typed_grid({"eps": [1, 0.5], "K": [4], "batch": [32]}, {}, infos)
    assert grid == {"eps": [1.0, 0.5], "K": [4], "batch": [32]} and isinstance(grid["eps"][0], float)
    for bad, words in (({"stratified": ["yes"]}, "bool"), ({"K": [4.5]}, "int"), ({"K": [True]}, "int"),
                       ({"dtype": [32]}, "str"), ({"batch": [0]}, "batch"), ({"transitions": ["pixels"]}, "pixels"),
                       ({"no_such": [1]}, "no variant of this run takes"), ({"eps": [float("nan")]}, "finite")):
        with pytest.raises(SelectionError, match=words):
            micro.typed_grid(bad, {}, infos)


# ------------------------------------------------------------------------------------------ issue 11.9
@pytest.mark.parametrize("flag,value", [("--capacities", "2**100"), ("--capacities", "0"),
                                        ("--capacities", "2**999999999"), ("--processes", "-1"),
                                        ("--processes", "0"), ("--values", "0"), ("--loops", "-1"),
                                        ("--warmups", "-2"), ("--min-time", "0"), ("--min-time", "nan")])
def test_impossible_settings_are_refused_naming_the_argument(tmp_path, flag, value):
    proc = replaybench("run", "--suite", "micro-quick", "--variants", "binary", "--ops", "sample", flag, value,
                       "--out", str(tmp_path), "--no-progress", timeout=60)
    assert proc.returncode == 2, proc.stdout
    assert flag in proc.stderr and repr(value) in proc.stderr
    assert not any(tmp_path.iterdir())


def test_capacity_beyond_this_machines_memory_is_refused():
    with pytest.raises(SelectionError, match="--capacities"):
        driver.plan(suites.load("micro-quick"), Selection(variants=["binary"], capacities=[2**60]))


def test_impossible_suite_settings_are_refused(tmp_path):
    suite = {**suites.load("micro-quick"), "name": "bad-settings"}
    suite["pyperf"] = {**suite["pyperf"], "processes": -1}
    with pytest.raises(SelectionError, match="pyperf.processes"):
        driver.plan(suite)


def test_cache_suite_honours_capacities_variants_and_ops():
    cells = driver.plan(suites.load("cache"), Selection(variants=["binary", "kary-aligned"], capacities=[4096],
                                                         ops=["sample"])).cells
    assert {c.columns["capacity"] for c in cells} == {4096}
    assert {c.columns["variant"] for c in cells} == {"binary", "kary-aligned"}
    assert {c.spec["ops"] == ["sample"] for c in cells} == {True}
    methods = {c.columns["method"] for c in cells}
    assert methods == set(suites.load("cache")["methods"])
    for c in cells:  # each cell's suite is narrowed to its own method, variant and capacity
        (cfg,) = c.spec["methods"].values()
        assert cfg["capacities"] == [4096] and cfg["variants"] == [c.columns["variant"]]


@pytest.mark.parametrize("suite,flag", [("concurrency-quick", "--capacities"), ("concurrency-quick", "--ops"),
                                        ("training-quick", "--capacities"), ("cache", "--param"),
                                        ("cache", "--processes")])
def test_sub_suites_that_do_not_honour_an_option_say_so(tmp_path, suite, flag):
    value = {"--capacities": "2**10", "--ops": "sample", "--param": "K=4", "--processes": "1"}[flag]
    proc = replaybench("run", "--suite", suite, flag, value, "--out", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and f"does not take {flag}" in proc.stderr, proc.stderr
    assert not any(tmp_path.iterdir())


def test_composite_suite_notes_which_sub_suites_ignore_an_option(monkeypatch):
    said, ran = [], []
    monkeypatch.setattr(driver, "execute", lambda plan, **kw: ran.append(plan) or Path("nowhere"))
    driver.run_suites(suites.load("default"), Selection(capacities=[1024], settings={"processes": 1}),
                      echo=said.append)
    assert [p.suite["name"] for p in ran] == suites.load("default")["suites"]
    cache_suite = next(name for name in suites.load("default")["suites"] if suites.load(name)["scenario"] == "cache")
    assert any(f"'{cache_suite}'" in line and "--processes" in line for line in said), said
    assert all(c.columns["capacity"] in (None, 1024) for p in ran for c in p.cells)  # every sub-suite honours it
    with pytest.raises(SelectionError, match="no suite of 'default' takes --param"):
        driver.run_suites({"name": "default", "suites": ["cache"]}, Selection(params={"K": [4]}))


# ------------------------------------------------------------------------------------------ policies
def test_concurrency_suite_measures_every_registered_policy(monkeypatch):
    from replaybench.bench.scenarios.concurrency import policy_names
    from replaybench.impl import concurrent

    assert suites.load("concurrency")["policies"] == "all"

    def policies(suite):
        return list(dict.fromkeys(c.columns["policy"] for c in driver.plan(suites.load(suite)).cells))

    assert policies("concurrency") == policy_names() and len(policy_names()) >= 5
    # a policy registered in impl.concurrent is measured with no edit in bench/
    registered = concurrent.names()
    monkeypatch.setattr(concurrent, "names", lambda: [*registered, "toy-policy"])
    assert policies("concurrency")[-1] == "toy-policy"
    assert "toy-policy" not in policies("concurrency-quick")  # a suite may still list its own


# ------------------------------------------------------------------------------------------ arguments
def test_argument_parsers():
    import argparse

    assert arguments.capacity("65536") == arguments.capacity("2**16") == arguments.capacity("2^16") == 65536
    assert arguments.capacity("2**62") == arguments.MAX_CAPACITY
    for bad in ("0", "-4", "2**63", "abc", "2**-1", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            arguments.capacity(bad)
    assert arguments.csv(arguments.capacity)("2**10, 4096,") == [1024, 4096]
    assert arguments.grid_param("K=2,4") == ("K", [2, 4])
    assert arguments.grid_param("dtype=float32") == ("dtype", ["float32"])
    for parse, bad in ((arguments.positive_int, "0"), (arguments.non_negative_int, "-1"),
                       (arguments.positive_float, "inf"), (arguments.grid_param, "K="), (arguments.grid_value, "nan")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)


def test_one_random_batch():
    import numpy as np

    from conftest import CARTPOLE_FIELDS, make_batch
    from replaybench.bench import derive, workloads

    a = make_batch(8, np.random.default_rng(1))
    b = workloads.random_batch(CARTPOLE_FIELDS, 8, np.random.default_rng(1), int_high=100)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert derive.row_bytes(CARTPOLE_FIELDS) == 16 + 8 + 4 + 16 + 1


# ------------------------------------------------------------------------------------- suite names
def test_every_suite_is_named_by_its_scenario_and_a_quick_one_is_quick():
    """``<scenario>-<what>[-quick]`` (or the scenario alone), an ``expected_minutes`` on each,
    and a ``-quick`` suite expected under a minute (the tests run them)."""
    from replaybench.bench import suites

    for name in suites.available():
        suite = suites.load(name)
        assert suite["name"] == name
        minutes = suite.get("expected_minutes")
        assert isinstance(minutes, (int, float)) and minutes > 0, f"{name}: expected_minutes {minutes!r}"
        if "suites" in suite:  # composite: its parts' scenarios
            continue
        scenario = suite["scenario"].rsplit(".", 1)[-1]
        assert name == scenario or name.startswith(f"{scenario}-"), f"suite {name!r} runs scenario {scenario!r}"
        if name.endswith("-quick"):
            assert minutes <= 1, f"{name} is a -quick suite expected to take {minutes} minutes"


def test_a_suite_with_a_bad_expected_minutes_is_refused(tmp_path):
    from replaybench.bench import suites

    path = tmp_path / "s.json"
    path.write_text('{"name": "s", "scenario": "micro", "expected_minutes": "soon"}')
    with pytest.raises(ValueError, match="expected_minutes.*'soon'"):
        suites.load(str(path))


# ------------------------------------------------------------------------- replaybench summary
def _micro_run(tmp_path, **meta) -> Path:
    """A micro run of two variants at one capacity, written by the harness's RunWriter."""
    writer = results.RunWriter(tmp_path, "r1", {"scenario": "micro", **meta})
    base = {"schema_version": results.SCHEMA_VERSION, "run_id": "r1", "scenario": "micro", "op": "sample",
            "capacity": 1024, "metric": "seconds_per_call", "unit": "s", "items_per_call": 256, "status": "ok"}
    writer.append([{**base, "variant": "binary", "value": 1e-4, "repeat": i} for i in range(3)])
    writer.append([{**base, "variant": "kary-aligned", "value": 5e-5, "repeat": 0}])
    writer.finish(True)
    return writer.dir


def test_summary_of_a_micro_run_is_its_table_under_the_run_lines(tmp_path, capsys):
    """`replaybench summary` of a micro run: the run line, pyperf's settings, the op tables."""
    import argparse

    from replaybench.bench import summary
    from replaybench.bench.__main__ import cmd_summary

    settings = {"processes": 2, "values": 5, "warmups": 1, "loops": None, "min_time": 0.05}
    run_dir = _micro_run(tmp_path, pyperf_settings=settings)
    text = driver.summarize_run(run_dir)
    lines = text.splitlines()
    assert lines[0].startswith("Run ") and ": complete; git " in lines[0]
    assert lines[1] == "pyperf: 2 processes x 5 values (+1 warm-up), loops calibrated, min_time 0.05 s"
    assert "sample: M/s (transitions), median over values" in text and " kary-aligned " in text
    assert text == summary.format_run(run_dir)  # the micro table, as before
    assert cmd_summary(argparse.Namespace(run_dir=run_dir)) == 0
    assert capsys.readouterr().out == text + "\n"


def test_summary_of_a_run_pyperf_did_not_time_has_no_pyperf_line(tmp_path):
    text = driver.summarize_run(_micro_run(tmp_path))
    assert text.splitlines()[0].startswith("Run ") and "pyperf" not in text
    assert "sample: M/s" in text


def test_summary_of_a_run_whose_table_cannot_read_it_falls_back_to_the_generic_table(tmp_path, monkeypatch):
    """A run stored with columns its scenario's table no longer reads (the table raises
    KeyError), and a run of a scenario not known here: the generic table, under a line saying why."""
    from replaybench.bench.scenarios import micro

    def old_columns(self, rows, meta):
        raise KeyError("backend")

    monkeypatch.setattr(type(micro.SCENARIO), "summarize", old_columns)
    text = driver.summarize_run(_micro_run(tmp_path / "a"))
    lines = text.splitlines()
    assert lines[0].startswith("Run ")
    assert lines[1] == "the micro table cannot read these rows (KeyError: 'backend'); the generic table instead:"
    assert lines[2].split()[:4] == ["variant", "capacity", "op", "metric"]
    assert any(line.split()[:4] == ["binary", "1024", "sample", "seconds_per_call"] for line in lines)

    writer = results.RunWriter(tmp_path / "b", "gone", {"scenario": "retired_scenario"})
    writer.append([{"schema_version": results.SCHEMA_VERSION, "run_id": "gone", "scenario": "retired_scenario",
                    "op": "x", "metric": "m", "unit": "s", "value": 1.0, "status": "ok"}])
    writer.finish(True)
    text = driver.summarize_run(writer.dir)
    assert "unknown scenario 'retired_scenario'" in text and "the generic table instead:" in text
    assert any(line.split()[2:4] == ["x", "m"] for line in text.splitlines())
