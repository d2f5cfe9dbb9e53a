"""Compact runs (issue 38): rows.csv while a run is open, rows.parquet once it ends
(bench.rowstore, bench.compaction), read alike by the results contract and the analysis."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

pq = pytest.importorskip("pyarrow.parquet")

from replaybench.analysis import load  # noqa: E402
from replaybench.bench import compaction, contract, results, rowstore  # noqa: E402
from replaybench.bench.__main__ import cmd_compact  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"

BASE = {"schema_version": 1, "scenario": "training", "variant": "kary-aligned", "policy": "none", "op": "episode",
        "metric": "return", "unit": "reward", "status": "ok", "params": json.dumps({"hyper": {"lr": 0.001}})}
EDGE_ROWS = [
    {**BASE, "value": -21.0, "repeat": 0, "env_steps": 2**63 - 1, "seed": -2**63, "wall_s": 1e-300, "dirty": True},
    {**BASE, "value": 0.1 + 0.2, "repeat": 1, "env_steps": 0, "wall_s": float("nan"), "dirty": False},  # NaN kept apart
    {**BASE, "status": "failed", "value": None, "error": "boom, with a comma and \"quotes\"\nand a newline"},
    {**BASE, "status": "skipped", "value": None, "error": "", "env": "ALE/Pong-v5", "machine": "ünïcode"},
]


def csv_run(root: Path, run_id: str = "run", rows=EDGE_ROWS, complete: bool = True) -> Path:
    """A run left in rows.csv (written by the harness, not compacted)."""
    writer = results.RunWriter(root, run_id, {"scenario": "training"}, compact=False)
    writer.append([{**r, "run_id": run_id} for r in rows])
    writer.finish(complete)
    return writer.dir


def test_round_trip_keeps_every_cell_and_its_type(tmp_path):
    run = csv_run(tmp_path)
    before = contract.read_rows(run)
    frame_before, _ = load.load_run(run)
    assert compaction.compact(run) == run / "rows.parquet"
    assert not (run / "rows.csv").exists() and not list(run.glob(".rows.parquet.*"))
    after = contract.read_rows(run)
    assert rowstore.same_rows(before, after) is None
    assert [type(r["env_steps"]) for r in after] == [int, int, type(None), type(None)]
    assert after[0]["env_steps"] == 2**63 - 1 and after[0]["seed"] == -2**63 and after[0]["dirty"] is True
    assert math.isnan(after[1]["wall_s"]) and after[2]["wall_s"] is None  # NaN is not an empty cell
    assert after[1]["value"] == 0.1 + 0.2 and after[3]["machine"] == "ünïcode"
    assert after[2]["error"] == EDGE_ROWS[2]["error"] and after[3]["error"] is None  # "" was an empty cell
    frame_after, _ = load.load_run(run)
    pd.testing.assert_frame_equal(frame_before, frame_after)


@pytest.mark.parametrize("bad, message", [
    ({"status": "fine"}, "unknown status 'fine'"),
    ({"schema_version": 99}, "schema_version 99 is newer"),
    ({"value": None}, "status ok but no value"),
    ({"value": float("inf")}, "is not finite"),
    ({"value": -1.0, "metric": "seconds_per_call"}, "is negative"),
    ({"value": 0.0, "metric": "seconds_per_call", "unit": "s"}, "a call cannot take no time"),
])
def test_the_frame_reader_refuses_what_the_row_reader_refuses(tmp_path, bad, message):
    """read_frame checks whole columns and hands only doubtful rows to check_row: each refusal
    of check_row is still raised, naming the same row, and a signed metric's negative value (a
    doubtful row that passes) is kept."""
    rows = [{**BASE, "value": float(i + 1), "repeat": i} for i in range(5)]
    rows[0]["value"] = -21.0  # a return: signed, so a doubtful row that passes
    rows[3] = {**rows[3], **bad}
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text("{}")
    header = list(dict.fromkeys(c for r in rows for c in r))
    rowstore.write_parquet(run / "rows.parquet", header, rows, contract.column_kind)
    with pytest.raises(contract.RunError, match="row 4: .*" + message) as by_frame:
        contract.read_frame(run)
    with pytest.raises(contract.RunError) as by_rows:
        contract.read_rows(run)
    assert str(by_frame.value) == str(by_rows.value)
    rows[3] = {**BASE, "value": 4.0, "repeat": 3}
    rowstore.write_parquet(run / "rows.parquet", header, rows, contract.column_kind)
    frame = contract.read_frame(run)
    assert frame["value"].tolist() == [-21.0, 2.0, 3.0, 4.0, 5.0]
    pd.testing.assert_frame_equal(frame, pd.DataFrame.from_records(contract.read_rows(run)))


def test_same_rows_tells_types_nan_and_none_apart():
    assert rowstore.same_rows([{"a": 1}], [{"a": 1.0}]) == "row 1, column 'a': 1 against 1.0"
    assert rowstore.same_rows([{"a": True}], [{"a": 1}]) is not None
    assert rowstore.same_rows([{"a": None}], [{"a": float("nan")}]) is not None
    assert rowstore.same_rows([{"a": float("nan")}], [{"a": float("nan")}]) is None
    assert rowstore.same_rows([{"a": 1}], []) == "1 rows against 0"


def test_unknown_columns_stay_text(tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    (run / "meta.json").write_text("{}")
    (run / "rows.csv").write_text("scenario,variant,op,metric,value,status,extra\nmicro,binary,sample,m,1.5,ok,42\n")
    compaction.compact(run)
    assert contract.read_rows(run) == [{"scenario": "micro", "variant": "binary", "op": "sample", "metric": "m",
                                        "value": 1.5, "status": "ok", "extra": "42"}]


def test_the_params_column_is_dictionary_encoded(tmp_path):
    """A run's constant params JSON is stored once per row group, not once per row (item 3)."""
    rows = [{**BASE, "value": float(i), "repeat": i} for i in range(2000)]
    run = csv_run(tmp_path, rows=rows)
    csv_bytes = (run / "rows.csv").stat().st_size
    compaction.compact(run)
    meta = pq.ParquetFile(run / "rows.parquet").metadata
    column = next(meta.row_group(0).column(i) for i in range(meta.num_columns)
                  if meta.row_group(0).column(i).path_in_schema == "params")
    assert any("DICTIONARY" in e for e in column.encodings), column.encodings
    assert (run / "rows.parquet").stat().st_size < csv_bytes / 10


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(p.read_bytes().replace(b"kary-aligned", b"kary-\xffaligned", 1)), "is not UTF-8"),
    (lambda p: p.write_text(p.read_text().replace("variant,structure", "variant,variant", 1)), "more than once"),
])
def test_compact_refuses_a_run_the_readers_refuse_and_leaves_it(tmp_path, damage, message):
    run = csv_run(tmp_path)
    damage(run / "rows.csv")
    before = (run / "rows.csv").read_bytes()
    with pytest.raises(contract.RunError, match=message):
        compaction.compact(run)
    assert (run / "rows.csv").read_bytes() == before and not (run / "rows.parquet").exists()
    assert sorted(p.name for p in run.iterdir()) == ["meta.json", "pyperf", "rows.csv"]


def test_compact_refuses_a_run_whose_rows_read_back_differ(tmp_path, monkeypatch):
    run = csv_run(tmp_path)
    before = (run / "rows.csv").read_bytes()
    real = rowstore.read_parquet

    def lossy(path):  # a writer or reader that loses a digit
        header, columns = real(path)
        columns["value"][1] = round(columns["value"][1], 3)
        return header, columns

    monkeypatch.setattr(rowstore, "read_parquet", lossy)
    with pytest.raises(compaction.CompactError, match=r"row 2, column 'value': 0.30000000000000004 against 0.3"):
        compaction.compact(run)
    assert (run / "rows.csv").read_bytes() == before
    assert sorted(p.name for p in run.iterdir()) == ["meta.json", "pyperf", "rows.csv"]


def test_a_run_is_compacted_when_it_ends_complete_or_interrupted(tmp_path):
    for run_id, complete in (("done", True), ("cut", False)):
        writer = results.RunWriter(tmp_path, run_id, {"scenario": "training"})
        writer.append([{**r, "run_id": run_id} for r in EDGE_ROWS[:2]])
        assert (writer.dir / "rows.csv").exists()  # rows reach the disk as the run goes
        writer.finish(complete, **({} if complete else {"interrupted": True}))
        assert sorted(p.name for p in writer.dir.iterdir()) == ["meta.json", "pyperf", "rows.parquet"]
        assert len(contract.read_rows(writer.dir)) == 2
    frame, meta = load.load_run(tmp_path / "cut")
    assert meta["complete"] is False and meta["interrupted"] is True and len(frame) == 2


def test_a_run_cut_off_before_it_ends_is_read_from_its_csv(tmp_path):
    writer = results.RunWriter(tmp_path, "crashed", {"scenario": "training"})
    writer.append([{**EDGE_ROWS[0], "run_id": "crashed"}])  # then the process dies: no finish
    assert [p.name for p in load.find_runs(tmp_path)] == ["crashed"]
    frame, meta = load.load_run(writer.dir)
    assert meta["complete"] is False and len(frame) == 1


def test_a_full_disk_at_compaction_keeps_the_csv(tmp_path, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rowstore, "write_parquet", full)
    writer = results.RunWriter(tmp_path, "full", {"scenario": "training"})
    writer.append([{**r, "run_id": "full"} for r in EDGE_ROWS])
    writer.finish(True)
    assert "keeps its rows.csv" in capsys.readouterr().err
    assert sorted(p.name for p in writer.dir.iterdir()) == ["meta.json", "pyperf", "rows.csv"]
    assert len(contract.read_rows(writer.dir)) == len(EDGE_ROWS)


def test_a_folder_left_with_both_files_reads_parquet_and_compact_tidies_it(tmp_path):
    run = csv_run(tmp_path)
    copy = (run / "rows.csv").read_bytes()
    compaction.compact(run)
    (run / "rows.csv").write_bytes(copy)  # as if cut off between the rename and the unlink
    assert rowstore.rows_file(run).name == "rows.parquet"
    compaction.compact(run)
    assert not (run / "rows.csv").exists() and len(contract.read_rows(run)) == len(EDGE_ROWS)


def test_a_broken_parquet_file_is_refused_by_name(tmp_path):
    run = csv_run(tmp_path)
    compaction.compact(run)
    path = run / "rows.parquet"
    header, columns = rowstore.read_parquet(path)
    columns["status"][1] = "great"
    rowstore.write_parquet(path, header, [dict(zip(header, v)) for v in zip(*columns.values())], contract.column_kind)
    with pytest.raises(contract.RunError, match=r"rows.parquet: row 2: unknown status 'great'"):
        contract.read_rows(run)
    rowstore.write_parquet(path, header, [], lambda c: "text")  # every column as text
    with pytest.raises(contract.RunError, match=r"column 'schema_version' is stored as string, where the results "
                                                r"contract wants int64"):
        contract.read_rows(run)
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(contract.RunError, match="rows.parquet: not a readable parquet file"):
        contract.read_rows(run)


def test_compact_command_refuses_a_folder_without_rows_before_converting_any(tmp_path, capsys):
    run = csv_run(tmp_path)

    class Args:
        run_dirs = [str(run), str(tmp_path / "nothing")]

    assert cmd_compact(Args) == 2
    assert f"run_dirs: {str(tmp_path / 'nothing')!r} is not a run folder" in capsys.readouterr().err
    assert (run / "rows.csv").exists()
    Args.run_dirs = [str(run)]
    assert cmd_compact(Args) == 0
    assert "rows.parquet" in capsys.readouterr().out and not (run / "rows.csv").exists()


def test_loading_a_compacted_copy_of_stored_runs_gives_the_same_table(tmp_path):
    """The stored reference runs, as they are (compacted), against a CSV written back from them:
    the analysis table is the same (the figures and REPORT.md are pure functions of it)."""
    runs = [RESULTS / "h100-concurrency", RESULTS / "h100-paac-8cores"]
    expanded = []
    for run in runs:
        copy = tmp_path / run.name
        shutil.copytree(run, copy)
        rows = contract.read_rows(copy)
        header = list(rows[0])
        text = ",".join(header) + "\n" + "".join(
            ",".join(_csv_field(contract.format_cell(r[c])) for c in header) + "\n" for r in rows)
        (copy / "rows.csv").write_text(text)
        (copy / "rows.parquet").unlink(missing_ok=True)
        expanded.append(copy)
    a, b = load.load_runs(runs), load.load_runs(expanded)
    assert not a.problems and not b.problems
    pd.testing.assert_frame_equal(a.table, b.table)


def _csv_field(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if any(ch in text for ch in ',"\n') else text


def test_results_stay_small_and_compacted():
    """results/ in the repository must not grow back: the 16-core machine takes a working tree of
    at most 64 MiB, results included (issue 38: 25 MiB is the target, this test fails past 40).
    Every stored run keeps its rows as parquet: a run written with ``compact=False`` or copied in
    from elsewhere is converted with ``replaybench compact`` before it is committed."""
    size = sum(p.stat().st_size for p in RESULTS.rglob("*") if p.is_file())
    assert size <= 40 * 2**20, f"results/ holds {size / 2**20:.1f} MiB, over 40 MiB"
    left = sorted(str(p.parent.relative_to(RESULTS)) for p in RESULTS.rglob(rowstore.CSV_NAME))
    assert not left, f"runs not compacted (run `replaybench compact` on them): {left}"
