"""Compaction under faults (issue 55, "Faults round 4", items 1-5): a damaged rows.parquet
beside an intact rows.csv, a run still being written, a newer writer's extra columns, two
compactions of one run at once, and a full disk (bench.compaction, bench.results,
bench.contract)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

pq = pytest.importorskip("pyarrow.parquet")

from replaybench.analysis import load  # noqa: E402
from replaybench.bench import compaction, contract, results, rowstore  # noqa: E402
from replaybench.bench.__main__ import cmd_compact  # noqa: E402

BASE = {"schema_version": 1, "scenario": "training", "variant": "kary-aligned", "policy": "none", "op": "episode",
        "metric": "return", "unit": "reward", "status": "ok", "params": json.dumps({"hyper": {"lr": 0.001}})}


def episode_rows(n: int, run_id: str = "run") -> list[dict]:
    return [{**BASE, "run_id": run_id, "value": float(i) - 20.5, "repeat": i, "env_steps": 100 * i,
             "wall_s": 0.25 * i} for i in range(n)]


def csv_run(root: Path, run_id: str = "run", n: int = 116) -> Path:
    """A finished run left in rows.csv, as a machine without pyarrow leaves it."""
    writer = results.RunWriter(root, run_id, {"scenario": "training"}, compact=False)
    writer.append(episode_rows(n, run_id))
    writer.finish(True)
    return writer.dir


def listing(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir())


class Args:
    def __init__(self, *run_dirs):
        self.run_dirs = [str(d) for d in run_dirs]


# ---------------------------------------------------------------------------------------------
# item 1: a rows.parquet beside rows.csv is checked against it, never trusted


def _half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _garbage(path: Path) -> None:
    path.write_bytes(b"PAR1" + b"\0" * 100 + b"PAR1")


def _first_rows(path: Path) -> None:  # a readable file holding part of the run
    header, columns = rowstore.read_parquet(path)
    rows = [dict(zip(header, v)) for v in zip(*columns.values())][:50]
    rowstore.write_parquet(path, header, rows, contract.column_kind)


def _one_cell(path: Path) -> None:
    header, columns = rowstore.read_parquet(path)
    columns["value"][7] += 1.0
    rowstore.write_parquet(path, header, [dict(zip(header, v)) for v in zip(*columns.values())], contract.column_kind)


def _as_text(path: Path) -> None:  # the same values, typed against the contract
    header, columns = rowstore.read_parquet(path)
    rows = [{c: None if v is None else str(v) for c, v in zip(header, values)} for values in zip(*columns.values())]
    rowstore.write_parquet(path, header, rows, lambda c: "text")


def _extra_column(path: Path) -> None:
    header, columns = rowstore.read_parquet(path)
    rows = [{**dict(zip(header, v)), "cores_used": 2} for v in zip(*columns.values())]
    rowstore.write_parquet(path, [*header, "cores_used"], rows,
                           lambda c: "int" if c == "cores_used" else contract.column_kind(c))


@pytest.mark.parametrize("damage", [_half, _empty, _garbage, _first_rows, _one_cell, _as_text, _extra_column])
def test_a_damaged_or_partial_parquet_never_costs_the_csv(tmp_path, damage, capsys):
    run = csv_run(tmp_path)
    copy = (run / "rows.csv").read_bytes()
    compaction.compact(run)
    (run / "rows.csv").write_bytes(copy)  # an intact CSV beside ...
    damage(run / "rows.parquet")  # ... a parquet file that does not hold its rows
    parquet = (run / "rows.parquet").read_bytes()
    with pytest.raises(compaction.CompactError) as caught:
        compaction.compact(run)
    message = str(caught.value)
    assert str(run / "rows.csv") in message and str(run / "rows.parquet") in message, message
    assert "both are kept" in message, message
    assert (run / "rows.csv").read_bytes() == copy and (run / "rows.parquet").read_bytes() == parquet
    assert listing(run) == ["meta.json", "pyperf", "rows.csv", "rows.parquet"]
    assert len(contract.read_csv_rows(run / "rows.csv")[1]) == 116
    # the command says so, exits 1 and keeps both
    assert cmd_compact(Args(run)) == 1
    assert str(run / "rows.parquet") in capsys.readouterr().err
    assert (run / "rows.csv").read_bytes() == copy
    # once the damaged file is gone, the run compacts as any other
    (run / "rows.parquet").unlink()
    assert compaction.compact(run) == run / "rows.parquet"
    assert len(contract.read_rows(run)) == 116 and listing(run) == ["meta.json", "pyperf", "rows.parquet"]


def test_a_parquet_equal_to_the_csv_beside_it_lets_the_csv_go(tmp_path):
    """A compaction cut off between its rename and the CSV's removal: the files agree."""
    run = csv_run(tmp_path)
    copy = (run / "rows.csv").read_bytes()
    compaction.compact(run)
    (run / "rows.csv").write_bytes(copy)
    assert compaction.compact(run) == run / "rows.parquet"
    assert listing(run) == ["meta.json", "pyperf", "rows.parquet"] and len(contract.read_rows(run)) == 116


# ---------------------------------------------------------------------------------------------
# item 2: a run still being written is refused; a dead writer's run is not


def test_an_open_run_is_refused_and_left_as_it_is(tmp_path, capsys):
    writer = results.RunWriter(tmp_path, "x", {"scenario": "training"}, compact=False)
    writer.append(episode_rows(5, "x"))
    before = {p.name: p.read_bytes() for p in writer.dir.iterdir() if p.is_file()}
    with pytest.raises(compaction.CompactError, match=r"x: the run is still being written") as caught:
        compaction.compact(writer.dir)
    assert str(writer.dir) in str(caught.value)
    assert cmd_compact(Args(writer.dir)) == 1
    err = capsys.readouterr().err
    assert str(writer.dir) in err and "still being written" in err, err
    assert {p.name: p.read_bytes() for p in writer.dir.iterdir() if p.is_file()} == before
    writer.append(episode_rows(10, "x")[5:])  # the writer goes on, into the same file
    writer.finish(True)
    assert compaction.compact(writer.dir) == writer.dir / "rows.parquet"
    assert [r["repeat"] for r in contract.read_rows(writer.dir)] == list(range(10))
    assert listing(writer.dir) == ["meta.json", "pyperf", "rows.parquet"]


def test_a_writer_that_compacts_at_its_end_still_does(tmp_path):
    writer = results.RunWriter(tmp_path, "x", {"scenario": "training"})
    writer.append(episode_rows(3, "x"))
    writer.finish(False, interrupted=True)
    assert listing(writer.dir) == ["meta.json", "pyperf", "rows.parquet"]


_CHILD = textwrap.dedent("""
    import json, os, sys, time
    from replaybench.bench import results
    root, fork = sys.argv[1], sys.argv[2] == "fork"
    writer = results.RunWriter(root, "x", {"scenario": "training"}, compact=False)
    writer.append(json.loads(sys.stdin.readline()))
    if fork:  # a process the run forked, which outlives it (a worker, a reaper)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, b"x")  # running Python code: the fork's handlers have run
            time.sleep(120)
            os._exit(0)
        os.read(r, 1)
        print(pid, flush=True)
    print("ready", flush=True)
    sys.stdin.readline()  # until killed
""")


@pytest.mark.parametrize("fork", [False, True], ids=["alone", "with-a-forked-child"])
def test_a_run_held_open_by_another_process_is_refused_until_that_process_dies(tmp_path, fork):
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path), "fork" if fork else "alone"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        child.stdin.write(json.dumps(episode_rows(5, "x")) + "\n")
        child.stdin.flush()
        if fork:
            grandchild = int(child.stdout.readline())
        assert child.stdout.readline() == "ready\n"
        run = tmp_path / "x"
        before = (run / "rows.csv").read_bytes()
        with pytest.raises(compaction.CompactError, match="still being written"):
            compaction.compact(run)
        assert (run / "rows.csv").read_bytes() == before and listing(run) == ["meta.json", "pyperf", "rows.csv"]
        child.kill()  # the writer dies: no finish, meta.json says incomplete
        child.wait(timeout=30)
        assert contract.read_meta(run)["complete"] is False
        assert compaction.compact(run) == run / "rows.parquet"  # its forked child lives on, holding nothing
        assert [r["repeat"] for r in contract.read_rows(run)] == list(range(5))
    finally:
        child.kill()
        child.wait(timeout=30)
        if grandchild is not None:
            os.kill(grandchild, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# item 3: columns this version does not know load with their stored type


def test_a_newer_writers_extra_column_loads_with_its_type(tmp_path):
    run = tmp_path / "newer"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"schema_version": 1, "run_id": "newer", "scenario": "training"}))
    rows = [{**r, "cores_used": 2 + i % 3, "note": None if i % 2 else "n"} for i, r in enumerate(episode_rows(6))]
    header = [*contract.COLUMNS[:10], *(c for c in rows[0] if c not in contract.COLUMNS[:10])]
    types = {"cores_used": "int", "note": "text"}
    rowstore.write_parquet(run / "rows.parquet", header, rows, lambda c: types.get(c) or contract.column_kind(c))
    assert pq.read_schema(run / "rows.parquet").field("cores_used").type == "int64"
    read = contract.read_rows(run)
    assert [r["cores_used"] for r in read] == [2, 3, 4, 2, 3, 4] and read[0]["note"] == "n"
    frame = contract.read_frame(run)  # what the analysis reads
    assert frame["cores_used"].tolist() == [2, 3, 4, 2, 3, 4] and str(frame["cores_used"].dtype) == "int64"
    table, meta = load.load_run(run)
    assert len(table) == 6 and meta["run_id"] == "newer"
    assert not load.load_runs([run]).problems


def test_known_columns_keep_their_stored_type_check(tmp_path):
    run = tmp_path / "bad"
    run.mkdir()
    (run / "meta.json").write_text("{}")
    rows = episode_rows(2)
    rowstore.write_parquet(run / "rows.parquet", list(rows[0]), rows,
                           lambda c: "float" if c == "repeat" else contract.column_kind(c))
    with pytest.raises(contract.RunError, match=r"column 'repeat' is stored as double, where the results contract "
                                                r"wants int64"):
        contract.read_rows(run)
    with pytest.raises(contract.RunError, match=r"column 'repeat' is stored as double"):
        contract.read_frame(run)


# ---------------------------------------------------------------------------------------------
# item 4: two compactions of one run at once


def test_two_compactions_at_once_both_succeed_many_times(tmp_path):
    runs = [csv_run(tmp_path, f"r{i}", n=40) for i in range(25)]
    for run in runs:
        barrier = threading.Barrier(3)
        out: list = [None] * 3

        def go(i, run=run, barrier=barrier, out=out):
            barrier.wait()
            try:
                out[i] = compaction.compact(run)
            except BaseException as err:  # noqa: BLE001 - reported below
                out[i] = err

        threads = [threading.Thread(target=go, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert out == [run / "rows.parquet"] * 3, out
        assert listing(run) == ["meta.json", "pyperf", "rows.parquet"]
        assert len(contract.read_rows(run)) == 40


_RACER = textwrap.dedent("""
    import sys, time
    from replaybench.bench import compaction
    runs = sys.argv[2:]
    start = float(sys.argv[1])
    failures = []
    for i, run in enumerate(runs):
        while time.time() < start + 0.2 * i:  # both processes start each run at the same instant
            time.sleep(0.0005)
        try:
            compaction.compact(run)
        except Exception as err:
            failures.append(f"{run}: {type(err).__name__}: {err}")
    print("\\n".join(failures))
""")


def test_two_processes_compacting_the_same_runs_both_succeed(tmp_path):
    runs = [csv_run(tmp_path, f"p{i}", n=40) for i in range(8)]
    start = time.time() + 3.0  # past both interpreters' start-up
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, repr(start), *map(str, runs)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.strip() for o, _ in outs] == ["", ""], outs
    for run in runs:
        assert listing(run) == ["meta.json", "pyperf", "rows.parquet"] and len(contract.read_rows(run)) == 40


def test_compacting_a_compact_run_says_so(tmp_path, capsys):
    run = csv_run(tmp_path)
    compaction.compact(run)
    assert compaction.compact(run) == run / "rows.parquet"
    assert cmd_compact(Args(run)) == 0
    assert "already compact" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# item 5: a full disk names the run and the file


def _full_disk_for(*victims: Path):
    """A stand-in for rowstore.write_parquet that fails as pyarrow does on a full disk, for the
    runs in ``victims`` (every run when none is named)."""
    real = rowstore.write_parquet

    def write(path, *args, **kwargs):
        if not victims or Path(path).parent in victims:
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
        return real(path, *args, **kwargs)

    return write


def test_a_full_disk_names_the_run_and_the_file_and_keeps_the_csv(tmp_path, monkeypatch):
    run = csv_run(tmp_path)
    copy = (run / "rows.csv").read_bytes()
    monkeypatch.setattr(rowstore, "write_parquet", _full_disk_for())
    with pytest.raises(OSError) as caught:
        compaction.compact(run)
    assert caught.value.errno == errno.ENOSPC
    message = str(caught.value)
    assert str(run) in message and "rows.parquet" in message and "No space left on device" in message, message
    assert (run / "rows.csv").read_bytes() == copy
    assert listing(run) == ["meta.json", "pyperf", "rows.csv"]  # no staging file, no lock file


def test_the_compact_command_names_each_run_a_full_disk_stopped(tmp_path, monkeypatch, capsys):
    a, b, c, d = (csv_run(tmp_path, name) for name in "abcd")
    copies = {run: (run / "rows.csv").read_bytes() for run in (b, d)}
    monkeypatch.setattr(rowstore, "write_parquet", _full_disk_for(b, d))
    assert cmd_compact(Args(a, b, c, d)) == 1
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and str(b) in errors[0] and str(d) in errors[1], captured.err
    assert all("No space left on device" in line for line in errors)
    for run in (a, c):
        assert listing(run) == ["meta.json", "pyperf", "rows.parquet"] and len(contract.read_rows(run)) == 116
        assert f"{run}: rows.parquet" in captured.out
    for run in (b, d):
        assert (run / "rows.csv").read_bytes() == copies[run] and listing(run) == ["meta.json", "pyperf", "rows.csv"]
