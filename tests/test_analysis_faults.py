"""Analysis that survives bad runs (issue 28, items 9-13): one damaged or duplicated run is left
out with a warning naming its folder and what is wrong, and the other runs are still read, drawn
and reported.

Each damage is made by hand on a copy of a small stored run (results/reference-cache) beside an
intact one (results/reference-lf), then read through the real entry points: the loader
(analysis.load.load_runs), ``replaybench plots`` and ``replaybench report`` (restricted to the
``lf`` figure, which only the intact run feeds) and ``replaybench summary``.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from replaybench.analysis import load
from replaybench.analysis.__main__ import main as analysis_main
from replaybench.bench import contract, results
from replaybench.bench.derive import LF_WORKLOADS as WORKLOADS
from replaybench.bench.load_speed import expand_to_csv
from replaybench.cli import main as replaybench_main

REPO = Path(__file__).resolve().parent.parent
GOOD = REPO / "results" / "reference-lf"  # drawn by the lf figure
DAMAGED = REPO / "results" / "reference-cache"  # copied, then damaged


def _edit_meta(run: Path, edit) -> None:
    meta = json.loads((run / "meta.json").read_text())
    edit(meta)
    (run / "meta.json").write_text(json.dumps(meta))


def _edit_rows(run: Path, edit) -> None:
    with open(run / "rows.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    edit(rows)
    with open(run / "rows.csv", "w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)


def _set(rows, column, line, text):
    """Field ``column`` of file line ``line`` (1 = the header) to ``text``."""
    rows[line - 1][rows[0].index(column)] = text


def _non_utf8(run: Path) -> None:
    lines = (run / "rows.csv").read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b",cache,", b",c\xe9che,", 1)  # latin-1 e-acute: not UTF-8
    (run / "rows.csv").write_bytes(b"\n".join(lines))


def _second_value_column(rows) -> None:
    """A second ``value`` column, last, holding another number: the one a dict of the row would keep."""
    rows[0].append("value")
    for row in rows[1:]:
        row.append("1e9")


DAMAGE = {
    # item 9: meta.json fields of the wrong type
    "meta suite": (lambda r: _edit_meta(r, lambda m: m.update(suite="cache")), "meta.json: field 'suite' holds"),
    "meta run_id": (lambda r: _edit_meta(r, lambda m: m.update(run_id=7)), "meta.json: field 'run_id' holds 7"),
    "meta caches": (lambda r: _edit_meta(r, lambda m: m["machine"].update(caches="32K")),
                    "meta.json: field 'machine.caches' holds \"32K\" (a string)"),
    "meta cpus": (lambda r: _edit_meta(r, lambda m: m["machine"].update(usable_cpus=True)),
                  "meta.json: field 'machine.usable_cpus' holds true (a boolean), where the results contract "
                  "wants an integer"),
    "meta grid": (lambda r: _edit_meta(r, lambda m: m.update(selection={"params": ["K"]})),
                  "meta.json: field 'selection.params' holds [\"K\"] (a list)"),
    "meta gil share": (lambda r: _edit_meta(r, lambda m: m.update(gil_share=[{"variant": "binary", "gil_share": "0.5"}])),
                       "meta.json: field 'gil_share[0].gil_share' holds \"0.5\""),
    # item 10: a byte that is not UTF-8
    "non-utf8": (_non_utf8, "rows.csv, line 3: byte b'\\xe9' (byte "),
    # item 11: an integer no reader's table can hold
    "big int": (lambda r: _edit_rows(r, lambda rows: _set(rows, "capacity", 2, str(10**30))),
                "rows.csv, line 2: column 'capacity': '1000000000000000000000000000000' is outside the 64-bit"),
    # item 12: a column named twice
    "header twice": (lambda r: _edit_rows(r, _second_value_column),
                     "rows.csv, line 1: the header names column(s) ['value'] more than once"),
}


@pytest.fixture
def two_runs(tmp_path):
    """(intact run, copy to damage), both under tmp_path/results."""
    good = shutil.copytree(GOOD, tmp_path / "results" / "good")
    # the damage is done to a rows.csv (a run still open, or one left uncompacted): the stored
    # run's rows, written back as the harness writes them
    bad = expand_to_csv(DAMAGED, tmp_path / "results").rename(tmp_path / "results" / "bad")
    return good, bad


def _drawn(tmp_path, name: str) -> Path:
    """The one figure file ``name`` under the figure folder (each host draws into a folder of its own)."""
    (found,) = sorted((tmp_path / "figs").glob(f"*/{name}"))
    return found


def _run_cli(command, runs, tmp_path, *extra):
    if command == "plots":
        out = ["--out", str(tmp_path / "figs")]
    else:
        out = ["--figures", str(tmp_path / "figs"), "--out", str(tmp_path / "REPORT.md")]
    return analysis_main([command, "--runs", *map(str, runs), "--only", "lf", *out, *extra])


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_run_is_left_out_by_name_and_the_others_load(two_runs, damage):
    good, bad = two_runs
    make, message = DAMAGE[damage]
    make(bad)
    res = load.load_runs([bad, good])
    assert len(res.problems) == 1, res.problems
    assert str(res.problems[0]).startswith(str(bad / "")) and message in str(res.problems[0])
    assert list(res.metas) == ["reference-lf"] and set(res.table["run_id"]) == {"reference-lf"}
    assert len(res.table) == len(contract.read_rows(GOOD))


# each damage through one command (both read runs through load_runs; the loader test above covers every damage)
@pytest.mark.parametrize("command, damage", [("plots", "meta suite"), ("report", "non-utf8"), ("report", "big int"),
                                             ("plots", "header twice")])
def test_plots_and_report_draw_the_other_runs_beside_a_damaged_one(two_runs, tmp_path, capsys, command, damage):
    good, bad = two_runs
    make, message = DAMAGE[damage]
    make(bad)
    status = _run_cli(command, [bad, good], tmp_path)
    out = capsys.readouterr()
    assert status == 0, out.err
    warnings = [line for line in out.err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: run left out: {bad}/")
    assert message in warnings[0] and "Traceback" not in out.err
    assert _drawn(tmp_path, "lf.png").stat().st_size > 0
    if command == "report":
        text = (tmp_path / "REPORT.md").read_text()
        assert "`reference-lf`" in text and "Left out (could not be read, or would merge" in text and message in text
    if damage == "meta suite":  # --strict: the same, but the damaged run makes the exit status 1
        assert _run_cli(command, [bad, good], tmp_path, "--strict") == 1


@pytest.mark.parametrize("damage", ["meta caches", "non-utf8", "big int", "header twice"])
def test_summary_names_the_damage_without_a_traceback(two_runs, capsys, damage):
    _, bad = two_runs
    make, message = DAMAGE[damage]
    make(bad)
    assert replaybench_main(["summary", str(bad)]) == 1
    out = capsys.readouterr()
    assert out.err.startswith(f"error: {bad}/") and message in out.err and out.out == ""


def test_integers_are_bounded_by_64_bits_for_the_reader_and_the_writer(tmp_path):
    low, high = contract.INT_RANGE
    assert contract.parse_cell("capacity", str(high)) == high and contract.parse_cell("seed", str(low)) == low
    for text in (str(high + 1), str(low - 1), "9" * 5000):  # 5000 digits: past Python's own int() limit too
        with pytest.raises(ValueError, match=r"^column 'capacity': (cannot parse )?'-?\d+'.*(outside the 64-bit integer range|\(5000 characters\) as a number)"):
            contract.parse_cell("capacity", text)
    writer = results.RunWriter(tmp_path, "r", {"scenario": "micro"})
    with pytest.raises(ValueError, match="capacity.*outside the 64-bit integer range"):
        writer.append([{"scenario": "micro", "variant": "binary", "op": "sample", "metric": "seconds_per_call",
                        "value": 1e-5, "status": "ok", "capacity": 2**64}])
    assert contract.read_rows(writer.dir) == []  # nothing of the refused batch was written


def test_meta_written_by_the_harness_and_every_stored_meta_pass_the_type_check(tmp_path):
    writer = results.RunWriter(tmp_path, "r", {"scenario": "micro", "machine": results.machine_info()})
    writer.finish(True)
    assert contract.read_meta(writer.dir)["complete"] is True
    for meta in sorted((REPO / "results").glob("*/meta.json")):
        contract.read_meta(meta.parent)  # raises, naming the field, if a stored run breaks META_TYPES


# ---------------------------------------------------------------------------------------------
# item 13: runs that would merge


def test_the_same_folder_by_another_path_is_loaded_once(two_runs, tmp_path, capsys):
    good, _ = two_runs
    link = tmp_path / "link"
    link.symlink_to(good, target_is_directory=True)
    dotted = good.parent / ".." / "results" / "good"
    res = load.load_runs([good, link, dotted])
    assert list(res.metas) == ["reference-lf"] and len(res.table) == len(contract.read_rows(GOOD))
    assert [str(p) for p in res.problems] == [
        f"{path}: the same folder as {good} (both are {good.resolve()}); left out so that its rows count once"
        for path in (link, dotted)]
    assert _run_cli("plots", [good, link], tmp_path, "--strict") == 1  # drawn, but a run was left out
    assert f"warning: run left out: {link}: the same folder as {good}" in capsys.readouterr().err
    assert _drawn(tmp_path, "lf.png").stat().st_size > 0


@pytest.mark.parametrize("where", ["meta", "rows"])
def test_two_runs_sharing_a_run_id_are_not_merged(two_runs, tmp_path, capsys, where):
    good, _ = two_runs
    twin = shutil.copytree(good, tmp_path / "results" / "twin")
    # "meta": a copy renamed in its folder only (meta.json and rows still say reference-lf);
    # "rows": meta.json renamed too, but the rows still carry the first run's id
    if where == "rows":
        _edit_meta(twin, lambda m: m.update(run_id="twin"))
    expected = "reference-lf"
    res = load.load_runs([good, twin])
    assert list(res.metas) == ["reference-lf"] and len(res.table) == len(contract.read_rows(GOOD))
    assert [str(p) for p in res.problems] == [
        f"{twin}: run_id {expected!r} is also the run id of {good}, loaded before it; "
        f"left out so that two runs are not merged into one"]
    if where == "meta":  # the same through the command line
        assert _run_cli("report", [good, twin], tmp_path) == 0
        assert f"warning: run left out: {twin}: run_id {expected!r}" in capsys.readouterr().err
        # every stem's count of values is the intact run's own: the twin's rows were not pooled in
        good_csv = expand_to_csv(GOOD, tmp_path / "as-csv") / "rows.csv"
        counts = Counter(_lf_cell(r, r.get("backend") or r["variant"])  # runs before the backend column: variant
                         for r in csv.DictReader(open(good_csv, newline=""))
                         if r["status"] == "ok" and r["metric"] == WORKLOADS[r["op"]][1])  # the metric drawn
        drawn = list(csv.DictReader(open(_drawn(tmp_path, "lf.csv"), newline="")))
        assert drawn and all(int(r["n"]) == counts[_lf_cell(r, r["backend"])] for r in drawn)


def _lf_cell(row, backend) -> tuple:
    """What an lf stem is (the figure's CSV writes batch as a float, rows.csv as an integer)."""
    batch = str(int(float(row["batch"]))) if row["batch"] else ""
    return row["op"], row["env"], row["policy"], row["actors"], batch, backend
