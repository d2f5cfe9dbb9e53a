"""Suites, runs and the CLI under malformed input (issue 41, items 13-15, 17): bad suite
values and unknown keys are refused by name before anything runs, a run folder is made
atomically, and an empty run is compared with a message."""

import json

import pytest

from replaybench.bench import driver, suites
from replaybench.bench.scenarios import SelectionError, load, names


def _shipped() -> dict[str, dict]:
    """One shipped suite per scenario (the first by name)."""
    out = {}
    for name in suites.available():
        suite = suites.load(name)
        if "scenario" in suite:
            out.setdefault(suite["scenario"], suite)
    return out


# ----------------------------------------------------------------------------- item 13
def test_a_suite_path_that_is_a_directory_is_refused_by_name(tmp_path):
    """``--suite x.json`` naming a directory raised IsADirectoryError; broken JSON a traceback."""
    folder = tmp_path / "x.json"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"x.json' is a directory .*not a JSON file"):
        suites.load(str(folder))
    broken = tmp_path / "broken.json"
    broken.write_text('{"name": "broken",')
    with pytest.raises(ValueError, match=r"broken.json' is not valid JSON: "):
        suites.load(str(broken))


@pytest.mark.parametrize("layouts", ["2,1", [2, 1], [[2]], [[1, -1]], [[1, True]], []])
def test_malformed_training_layouts_are_refused_by_name(layouts):
    """``"layouts": "2,1"`` raised IndexError from inside the expansion."""
    suite = {**suites.load("training-quick"), "layouts": layouts}
    with pytest.raises(SelectionError, match=r"'layouts' must be a non-empty list of \[actors, learners\] pairs"):
        driver.plan(suite)


@pytest.mark.parametrize("order", [["abba"], {"abba": 1}, "abab"])
def test_malformed_frameworks_order_is_refused_by_name(order):
    """``"order": ["abba"]`` raised ``TypeError: unhashable type``."""
    suite = {**suites.load("frameworks-quick"), "order": order}
    with pytest.raises(SelectionError, match=r"'order' must be one of \['own-first', 'abba'\], got "):
        driver.plan(suite)


# ----------------------------------------------------------------------------- item 14
def test_every_scenario_declares_its_suite_keys_and_takes_its_shipped_suites():
    """Every scenario of bench/scenarios declares the keys it reads, and every shipped suite
    uses only those (the check refuses nothing that runs today)."""
    for name in names():
        assert load(name).suite_keys is not None, f"scenario {name} declares no suite_keys"
    for name in suites.available():
        suite = suites.load(name)
        if "scenario" in suite:
            load(suite["scenario"]).check_keys(suite)


@pytest.mark.parametrize("scenario", sorted(_shipped()))
def test_every_scenario_refuses_an_unknown_suite_key_naming_the_nearest(scenario):
    """A misspelt key (a typo such as "backend" for "backends") was ignored and the default
    grid run; only the lf scenario refused. Refused before any cell is expanded."""
    suite = _shipped()[scenario]
    key = sorted(set(suite) - suites.COMMON_KEYS)[0]
    typo = key[:-1] if len(key) > 4 else key + "x"
    bad = {k: v for k, v in suite.items() if k != key} | {typo: suite[key]}
    with pytest.raises(SelectionError, match=rf"unknown key '{typo}'; did you mean '{key}'\?"):
        driver.plan(bad)
    with pytest.raises(SelectionError, match=r"unknown key 'zzz_qqq'; known: "):
        driver.plan({**suite, "zzz_qqq": 1})


def test_training_backend_typo_names_backends():
    suite = {**suites.load("training-quick"), "backend": ["ray"]}
    with pytest.raises(SelectionError, match=r"suite 'training-quick' \(scenario training\): unknown key 'backend'; "
                                             r"did you mean 'backends'\?"):
        driver.plan(suite)


# ----------------------------------------------------------------------------- item 15
def _toy_plan(monkeypatch):
    from pathlib import Path

    toy = Path(__file__).resolve().parent / "toy"
    monkeypatch.syspath_prepend(str(toy))
    suite = {**json.loads((toy / "toy_sort.json").read_text()), "variants": ["sorted"], "sizes": [10]}
    return driver.plan(suite)


def test_a_run_id_naming_a_dangling_symlink_is_refused(tmp_path, monkeypatch):
    """``exists()`` is False for a dangling symlink, and the mkdir then raised FileExistsError."""
    out = tmp_path / "results"
    out.mkdir()
    (out / "dangle").symlink_to(tmp_path / "nowhere")
    with pytest.raises(SelectionError, match=r"--run-id 'dangle': .*dangle is a symbolic link; choose another id"):
        driver.execute(_toy_plan(monkeypatch), out=out, run_id="dangle", machine="m", progress=False,
                       echo=lambda *_: None)
    assert not (tmp_path / "nowhere").exists() and [p.name for p in out.iterdir()] == ["dangle"]


def test_the_second_of_two_runs_started_with_one_id_is_refused(tmp_path, monkeypatch):
    """Two runs started together with the same id both passed the check, and the second's
    mkdir raised FileExistsError (a traceback in 1 of 3 tries). Here the other run makes the
    folder just after this run's check (while this one gathers its meta)."""
    out = tmp_path / "results"
    out.mkdir()
    p = _toy_plan(monkeypatch)
    real_meta = driver._meta

    def other_run_first(*args, **kw):
        (out / "same").mkdir()
        (out / "same" / "rows.csv").write_text("the other run's\n")
        return real_meta(*args, **kw)

    monkeypatch.setattr(driver, "_meta", other_run_first)
    with pytest.raises(SelectionError, match=r"--run-id 'same': .*same exists already \(another run may have just "
                                             r"made it\)"):
        driver.execute(p, out=out, run_id="same", machine="m", progress=False, echo=lambda *_: None)
    assert [f.name for f in (out / "same").iterdir()] == ["rows.csv"]  # the other run's folder, untouched


# ----------------------------------------------------------------------------- item 17
def test_compare_of_a_run_without_rows_says_so(tmp_path):
    """A run with a header and no rows (interrupted before its first cell) made ``compare``
    fail with a pandas ValueError traceback."""
    from replaybench.analysis import compare
    from replaybench.bench import results

    writer = results.RunWriter(tmp_path, "empty", {"scenario": "micro", "suite": {"name": "x"},
                                                   "machine": results.machine_info()})
    writer.finish(False, interrupted=True)
    text = compare.compare_runs(tmp_path / "empty", tmp_path / "empty")
    assert "a = empty has no rows" in text and "b = empty has no rows" in text


# ----------------------------------------------------------------------------- issue 55, item 10
def _cli(*args, timeout=120):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    return subprocess.run([sys.executable, "-m", "replaybench.bench", *args], cwd=root, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("entry,key", [({"variant": "kary-aligned", "polic": "sharded"}, "polic"),
                                       ({"variant": "kary-aligned", "param": {"K": 16}}, "param"),
                                       ({"variant": "kary-aligned", "zzz": 1}, "zzz")])
def test_an_unknown_key_of_a_training_buffer_entry_is_refused_before_anything_runs(tmp_path, entry, key):
    """``{"variant": "kary-aligned", "polic": "sharded"}`` ran lazy-writing under the suite's
    name: the entry's keys were never checked, only the suite's and a part's."""
    suite = {**suites.load("training-quick"), "name": "bad-entry", "buffers": [entry]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(suite))
    out = tmp_path / "r"
    proc = _cli("run", "--suite", str(path), "--out", str(out), "--no-progress")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"unknown key {key!r}" in proc.stderr and "'params', 'policy', 'variant'" in proc.stderr, proc.stderr
    assert "suite 'bad-entry'" in proc.stderr
    assert not out.exists()


def test_a_training_buffer_entry_in_a_part_or_of_the_wrong_shape_is_refused():
    base = suites.load("training-quick")
    part = {**base, "parts": [{"buffers": [{"variant": "kary-aligned", "policy": "sharded", "parms": {}}]}]}
    with pytest.raises(SelectionError, match=r"unknown key 'parms'; did you mean 'params'\?"):
        driver.plan(part)
    for entries, words in (([{"policy": "sharded"}], "lacks 'variant'"), (["kary-aligned"], "must be an object"),
                           ("kary-aligned", "must be a non-empty list")):
        with pytest.raises(SelectionError, match=words):
            driver.plan({**base, "buffers": entries})
