"""The results contract (bench/contract.py): one schema, one checked reader, one set of derived
metrics, used by the writer, the terminal summary and the analysis alike.

Rows that break the contract are written here as raw CSV (the writer refuses them), then read
through every reader: the contract's read_rows, analysis' load_runs and ``replaybench summary``.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from replaybench.analysis import compare, load, stats
from replaybench.bench import contract, derive, results, summary

ROOT = Path(__file__).resolve().parent.parent

TIMING = {"schema_version": 1, "run_id": "r", "scenario": "micro", "variant": "binary", "op": "sample",
          "capacity": 1024, "batch": 256, "transitions": "cartpole", "metric": "seconds_per_call", "unit": "s",
          "items_per_call": 256, "status": "ok"}
MISSES = {"schema_version": 1, "run_id": "r", "scenario": "cache", "variant": "binary", "op": "sample",
          "capacity": 4096, "batch": 256, "metric": "misses_per_op", "unit": "misses", "items_per_call": 256,
          "level": "LL", "method": "cachegrind", "stream": "tree", "status": "ok"}
RETURN = {"schema_version": 1, "run_id": "r", "scenario": "training", "variant": "binary", "op": "episode",
          "metric": "return", "unit": "return", "algo": "td3", "env": "Pendulum-v1", "seed": 0, "status": "ok"}


def raw_run(root: Path, rows: list[dict], name="r") -> Path:
    """A run folder whose rows.csv is written with the csv module only, bypassing the writer's checks."""
    run = root / name
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"run_id": name, "schema_version": 1, "scenario": "micro"}))
    with open(run / "rows.csv", "w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(contract.COLUMNS)
        for row in rows:
            writer.writerow([contract.format_cell(row.get(c)) if not isinstance(row.get(c), str) else row[c]
                             for c in contract.COLUMNS])
    return run


# ---------------------------------------------------------------------------------------------
# schema


def test_cell_columns_are_the_columns_that_name_what_was_measured():
    assert contract.CELL_COLUMNS == [c for c in contract.COLUMNS
                                     if c not in contract.RUN_COLUMNS + contract.MEASUREMENT_COLUMNS]
    assert {"variant", "op", "capacity", "params", "K", "level", "method", "seed"} <= set(contract.CELL_COLUMNS)
    assert not {"value", "repeat", "run_id", "status", "env_steps", "wall_s"} & set(contract.CELL_COLUMNS)
    typed = contract.INT_COLUMNS | contract.FLOAT_COLUMNS | contract.BOOL_COLUMNS
    assert typed <= set(contract.COLUMNS)
    assert contract.BELOW_RESOLUTION in contract.STATUSES and contract.MEASURED in contract.STATUSES


@pytest.mark.parametrize("column, value", [("value", 1.2345678901234567e-07), ("capacity", 2**40), ("dirty", True),
                                           ("dirty", False), ("params", {"K": 16, "dtype": "float32"}),
                                           ("variant", "kary-aligned"), ("K", None)])
def test_format_and_parse_round_trip(column, value):
    back = contract.parse_cell(column, contract.format_cell(value))
    assert back == (json.dumps(value, sort_keys=True) if isinstance(value, dict) else value)


def test_a_number_column_holding_text_is_named():
    with pytest.raises(ValueError, match="column 'K': cannot parse 'abc' as a number"):
        contract.parse_cell("K", "abc")


def test_cell_key_ignores_the_measurement_and_the_order_of_params():
    a = {**TIMING, "params": '{"K": 16, "dtype": "float32"}', "value": 1e-5, "repeat": 0, "run_id": "a"}
    b = {**TIMING, "params": {"dtype": "float32", "K": 16}, "value": 2e-5, "repeat": 3, "run_id": "b"}
    assert contract.cell_key(a) == contract.cell_key(b)
    assert contract.cell_key(a) != contract.cell_key({**a, "capacity": 2048})


def test_throughput_and_cost_of_a_timing():
    assert contract.items_per_s(256, 1e-4) == pytest.approx(2.56e6)
    assert contract.ns_per_item(256, 1e-4) == pytest.approx(390.625)
    assert contract.op_unit("sample") == (1e6, "M transitions/s") and contract.item_name("mixed") == "iteration"


def test_reference_ratios_within_run_op_capacity_and_workload():
    cells = [{**TIMING, "variant": "binary", "dtype": "float32", "median": 100.0},
             {**TIMING, "variant": "binary", "dtype": "float64", "median": 50.0},
             {**TIMING, "variant": "kary", "dtype": "float64", "median": 100.0},
             {**TIMING, "variant": "kary", "dtype": "float16", "median": 100.0},  # no binary at float16: the first
             {**TIMING, "variant": "peer:slow", "median": 25.0},
             {**TIMING, "variant": "peer:fast", "median": 40.0},
             {**TIMING, "variant": "kary", "batch": 32, "median": 10.0},  # another workload: nothing to compare
             {**TIMING, "variant": "kary", "run_id": "other", "median": 10.0}]  # another run: likewise
    got = contract.reference_ratios(cells)
    assert [g["x_binary"] for g in got] == [1.0, 1.0, 2.0, 1.0, 0.25, 0.4, None, None]
    assert [g["best_peer"] for g in got] == ["peer:fast"] * 6 + [None, None]
    assert got[2]["x_best_peer"] == pytest.approx(2.5) and got[6]["x_best_peer"] is None
    mixed = [{**TIMING, "op": "mixed", "params": {"mixed_adds": n}, "variant": v, "median": m}
             for n, v, m in ((1, "binary", 10.0), (4, "binary", 5.0), (4, "kary", 10.0))]
    assert [g["x_binary"] for g in contract.reference_ratios(mixed)] == [1.0, 1.0, 2.0]


# ---------------------------------------------------------------------------------------------
# the checked reader (issue 11.6): values that cannot be measurements


@pytest.mark.parametrize("row, message", [
    ({**TIMING, "value": "nan"}, "value nan of metric 'seconds_per_call' is not finite"),
    ({**TIMING, "value": "inf"}, "value inf of metric 'seconds_per_call' is not finite"),
    ({**MISSES, "value": "-inf"}, "value -inf of metric 'misses_per_op' is not finite"),
    ({**MISSES, "value": -0.5}, "value -0.5 is negative, which metric 'misses_per_op' cannot be"),
    ({**TIMING, "value": -1e-5}, "value -1e-05 is negative"),
    ({**TIMING, "value": 0.0}, "a call cannot take no time"),
    ({**RETURN, "value": "nan"}, "value nan of metric 'return' is not finite"),
    ({**MISSES, "status": "below-resolution", "value": -2.0}, "negative, which a resolution bound cannot be"),
    ({**MISSES, "status": "below-resolution", "value": None}, "status below-resolution but no value"),
    ({**MISSES, "value": None}, "status ok but no value"),
])
def test_a_value_that_cannot_be_a_measurement_is_refused_with_file_and_line(tmp_path, row, message):
    good = {**TIMING, "value": 1e-5}
    run = raw_run(tmp_path, [good, good, row, good])
    with pytest.raises(contract.RunError) as err:
        contract.read_rows(run)
    assert str(err.value).startswith(f"{run / 'rows.csv'}, line 4: ") and message in str(err.value)
    # analysis leaves the run out with that message, and loads the others
    other = raw_run(tmp_path, [good], name="other")
    res = load.load_runs([run, other])
    assert [str(p) for p in res.problems] == [str(err.value)] and list(res.metas) == ["other"]


def test_signed_metrics_keep_their_negative_values(tmp_path):
    """An episode's return is negative in many environments (Pendulum), and so is a greedy
    evaluation's mean return: measurements, not errors."""
    assert contract.SIGNED_METRICS == {"return", "eval_return"}
    run = raw_run(tmp_path, [{**RETURN, "value": -1234.5, "env_steps": 200, "repeat": 0},
                             {**MISSES, "value": 0.0}])
    rows = contract.read_rows(run)
    assert [r["value"] for r in rows] == [-1234.5, 0.0]


def test_the_stored_reference_runs_hold_no_value_the_contract_refuses():
    """The committed runs keep loading (every check above passes on them)."""
    runs = sorted((ROOT / "results").glob("reference-*"))
    assert runs
    for run in runs:
        contract.read_meta(run)
        rows = contract.read_rows(run)
        assert all(math.isfinite(r["value"]) for r in rows if r["status"] == "ok")


def test_the_writer_refuses_what_the_readers_refuse_and_writes_nothing(tmp_path):
    writer = results.RunWriter(tmp_path, "w", {"scenario": "cache"})
    writer.append([{**MISSES, "value": 3.0}])
    before = (tmp_path / "w" / "rows.csv").read_text()
    for bad in ({**MISSES, "value": float("nan")}, {**MISSES, "value": -0.5}, {**MISSES, "K": "abc"},
                {**MISSES, "status": "below-resolution"}):
        with pytest.raises(ValueError, match="breaks the results contract"):
            writer.append([{**MISSES, "value": 1.0}, bad])
    assert (tmp_path / "w" / "rows.csv").read_text() == before and writer.n_rows == 1
    writer.append([{**MISSES, "status": "below-resolution", "value": 0.25, "error": "spread of 3 differentials"}])
    writer.finish(True)
    assert [r["status"] for r in contract.read_rows(tmp_path / "w")] == ["ok", "below-resolution"]


# ---------------------------------------------------------------------------------------------
# below-resolution rows: read, listed with their bound, never used as a measurement


def below_resolution_run(root: Path) -> Path:
    writer = results.RunWriter(root, "c", {"scenario": "cache"})
    writer.append([{**MISSES, "run_id": "c", "variant": "binary", "value": 40.0},
                   {**MISSES, "run_id": "c", "variant": "kary-aligned", "status": "below-resolution", "value": 0.5,
                    "error": "within the spread of repeated differentials"},
                   {**TIMING, "run_id": "c", "value": 1e-4, "repeat": 0},
                   {**TIMING, "run_id": "c", "value": 2e-4, "repeat": 1},
                   {**TIMING, "run_id": "c", "status": "below-resolution", "value": 1e-9, "repeat": 2}])
    writer.finish(True)
    return writer.dir


def test_below_resolution_rows_are_listed_with_their_bound_and_left_out_of_medians(tmp_path):
    run = below_resolution_run(tmp_path)
    rows = contract.read_rows(run)
    cells = derive.summarize_cells(rows)
    (cell,) = cells.values()
    assert cell["n"] == 2 and cell["median"] == pytest.approx((256 / 1e-4 + 256 / 2e-4) / 2)
    text = summary.format_run(run)
    line = next(ln for ln in text.splitlines() if ln.startswith("kary-aligned"))
    assert "below-resolution" in line and "< 0.5 misses (resolution)" in line
    res = load.load_runs([run])
    assert not res.problems
    assert len(stats.timings(res.table)) == 2
    table = compare.cells(res.table)
    assert set(table["variant"]) == {"binary"}  # the below-resolution cache cell is no measurement
    assert sorted(table["n"]) == [1, 2]


# ---------------------------------------------------------------------------------------------
# replaybench summary on a broken run (issue 11.8)


def test_summary_command_on_a_broken_run_names_file_and_line_without_a_traceback(tmp_path):
    run = raw_run(tmp_path, [{**TIMING, "value": 1e-5}, {**TIMING, "value": "abc"}])
    proc = subprocess.run([sys.executable, "-m", "replaybench.bench", "summary", str(run)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert f"error: {run / 'rows.csv'}, line 3: column 'value': cannot parse 'abc' as a number" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    missing = subprocess.run([sys.executable, "-m", "replaybench.bench", "summary", str(tmp_path / "nope")],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "rows.csv: missing" in missing.stderr and "Traceback" not in missing.stderr
