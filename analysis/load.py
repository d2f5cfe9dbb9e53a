"""Load stored runs into one table, checking each rows.csv before trusting it.

A *run* is a folder ``results/<run-id>/`` holding ``rows.csv`` and ``meta.json`` as
:mod:`bench.results` writes them. :func:`load_runs` reads any number of runs into a
:class:`Results`: one pandas DataFrame (``table``) with every column of
:data:`bench.results.COLUMNS` (a run written before a column existed gets ``None`` there;
columns this reader does not know are dropped; a ``suite`` column names the suite that made
the run), and each run's meta.json (``metas``, keyed by
run id) for the machine, caches and suite behind the numbers.

Checks, each failing with a :class:`RunError` that names the file and, for rows.csv, the line:

- rows.csv and meta.json exist and meta.json is JSON;
- line 1 is a header holding at least :data:`REQUIRED`;
- every later line has as many fields as the header (a truncated or broken line does not);
- numbers parse, by :mod:`bench.results`' own column types;
- ``schema_version`` (rows and meta) is not newer than :data:`bench.results.SCHEMA_VERSION`:
  newer files may change what a column means, so they are refused with a message saying so;
- ``status`` is one of :data:`bench.results.STATUSES`, and an ``ok`` row has a value.

One broken run does not stop the others: :func:`load_runs` records it in
``Results.problems`` and goes on. Rows are then read with :func:`bench.results.read_rows`, so
values have exactly the types the harness gives them.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from replaybench.bench import results

__all__ = ["REQUIRED", "RunError", "Results", "find_runs", "check_rows", "load_run", "load_runs",
           "cache_sizes", "latest_per_cell", "CELL_COLUMNS"]

#: Columns without which a rows.csv cannot be used.
REQUIRED = ("scenario", "variant", "op", "metric", "value", "status")

#: Columns naming what was measured (not the measurement): rows equal in all of them belong to
#: one cell, whose repeats differ only in ``repeat``, ``value`` and, for curves, ``env_steps`` /
#: ``wall_s``.
CELL_COLUMNS = ["scenario", "variant", "structure", "policy", "K", "dtype", "params", "capacity", "batch",
                "threads", "transitions", "op", "metric", "unit", "items_per_call", "level", "method", "stream",
                "cache_config", "actors", "learners", "mode", "algo", "env", "seed"]

#: The harness's own column types (bench.results parses rows with them).
_INT_COLUMNS = results._INT_COLUMNS
_FLOAT_COLUMNS = results._FLOAT_COLUMNS


class RunError(ValueError):
    """A run folder that cannot be used; ``str()`` names the file (and line) and the reason."""

    def __init__(self, path, message: str, line: int | None = None):
        self.path = Path(path)
        self.line = line
        where = f"{self.path}, line {line}" if line is not None else str(self.path)
        super().__init__(f"{where}: {message}")


@dataclass
class Results:
    """Rows of many runs in one table, with each run's meta.json and the runs that failed to load.

    ``table``: one row per stored row, columns :data:`bench.results.COLUMNS` (``run_id`` tells
    the runs apart); ``metas``: ``{run_id: meta dict}``; ``dirs``: ``{run_id: folder}``;
    ``problems``: one :class:`RunError` per run that could not be used.
    """

    table: pd.DataFrame
    metas: dict = field(default_factory=dict)
    dirs: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)


def find_runs(root="results") -> list[Path]:
    """Run folders under ``root`` (sub-folders holding rows.csv or meta.json), oldest first.

    Run ids start with a UTC timestamp, so sorting by name sorts by start time.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and ((p / "rows.csv").exists() or (p / "meta.json").exists()))


def _check_cell(path: Path, line: int, column: str, text: str) -> None:
    try:
        results._convert(column, text)  # the harness's own parser for that column
    except (TypeError, ValueError):
        raise RunError(path, f"column {column!r}: cannot parse {text!r} as a number", line) from None


def check_rows(path) -> int:
    """Check a rows.csv (see the module docstring); returns the number of data rows.

    Raises
    ------
    RunError
        naming ``path`` and the first bad line.
    """
    path = Path(path)
    if not path.exists():
        raise RunError(path, "missing (a run folder holds rows.csv and meta.json)")
    known_statuses = set(results.STATUSES)
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            if not header:
                raise RunError(path, "empty file, no header", 1)
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise RunError(path, f"not a rows.csv header: missing column(s) {missing} "
                                     f"(the first line must name the columns)", 1)
            index = {name: i for i, name in enumerate(header)}
            checked = [c for c in header if c in _INT_COLUMNS or c in _FLOAT_COLUMNS]
            n = 0
            for fields in reader:
                line = reader.line_num
                if not fields:
                    continue  # a blank line carries no row
                if len(fields) != len(header):
                    raise RunError(path, f"{len(fields)} fields where the header has {len(header)} "
                                         f"(truncated or broken row)", line)
                for column in checked:
                    _check_cell(path, line, column, fields[index[column]])
                version = fields[index["schema_version"]] if "schema_version" in index else ""
                if version and int(version) > results.SCHEMA_VERSION:
                    raise RunError(path, f"schema_version {version} is newer than this analysis knows "
                                         f"({results.SCHEMA_VERSION}); update replaybench to read it", line)
                status = fields[index["status"]]
                if status not in known_statuses:
                    raise RunError(path, f"unknown status {status!r} (known: {', '.join(results.STATUSES)})", line)
                if status == "ok" and fields[index["value"]] == "":
                    raise RunError(path, "status ok but no value", line)
                n += 1
        except csv.Error as err:  # e.g. a quoted field cut off by a truncated write
            raise RunError(path, f"CSV error: {err}", reader.line_num) from None
    return n


def _read_meta(run_dir: Path) -> dict:
    path = run_dir / "meta.json"
    if not path.exists():
        raise RunError(path, "missing (a run folder holds rows.csv and meta.json)")
    try:
        meta = results.read_meta(run_dir)
    except json.JSONDecodeError as err:
        raise RunError(path, f"not valid JSON: {err.msg}", err.lineno) from None
    if not isinstance(meta, dict):
        raise RunError(path, "not a JSON object")
    version = meta.get("schema_version")
    if isinstance(version, int) and version > results.SCHEMA_VERSION:
        raise RunError(path, f"schema_version {version} is newer than this analysis knows "
                             f"({results.SCHEMA_VERSION}); update replaybench to read it")
    return meta


def load_run(run_dir) -> tuple[pd.DataFrame, dict]:
    """One checked run: (its rows as a DataFrame with every known column, its meta dict).

    ``run_id`` is filled from the folder name where a row lacks one; a ``suite`` column holds
    the name of the suite that made the run (from meta.json).
    """
    run_dir = Path(run_dir)
    meta = _read_meta(run_dir)
    check_rows(run_dir / "rows.csv")
    rows = results.read_rows(run_dir)
    frame = pd.DataFrame.from_records(rows, columns=list(results.COLUMNS)) if rows else \
        pd.DataFrame(columns=list(results.COLUMNS))
    frame["run_id"] = frame["run_id"].fillna(meta.get("run_id") or run_dir.name)
    frame["suite"] = (meta.get("suite") or {}).get("name") or meta.get("scenario")
    frame["started"] = meta.get("start_time") or ""  # orders runs whatever their ids (reference-...)
    return frame.astype(object), meta


def _typed(table: pd.DataFrame) -> pd.DataFrame:
    """Integer columns as nullable Int64, numbers as float, the rest as object (None for empty)."""
    for column in table.columns:
        if column in _INT_COLUMNS:
            table[column] = pd.array(table[column].tolist(), dtype="Int64")
        elif column in _FLOAT_COLUMNS:
            table[column] = pd.to_numeric(table[column], errors="coerce").astype(float)
        else:
            table[column] = table[column].astype(object).where(table[column].notna(), None)
    return table


def load_runs(run_dirs) -> Results:
    """Every run in ``run_dirs`` that passes the checks, in one :class:`Results`.

    A run that fails is left out and its :class:`RunError` appended to ``problems``; the
    caller decides how loudly to say so.
    """
    frames, metas, dirs, problems = [], {}, {}, []
    for run_dir in run_dirs:
        try:
            frame, meta = load_run(run_dir)
        except RunError as err:
            problems.append(err)
            continue
        run_id = meta.get("run_id") or Path(run_dir).name
        frames.append(frame)
        metas[run_id] = meta
        dirs[run_id] = Path(run_dir)
    table = (pd.concat(frames, ignore_index=True) if frames
             else pd.DataFrame(columns=[*results.COLUMNS, "suite", "started"]))
    return Results(_typed(table), metas, dirs, problems)


def _bytes(size) -> int | None:
    """``"48K"`` / ``"2048K"`` / ``"4M"`` / ``49152`` (sysfs style) as bytes."""
    if size is None:
        return None
    text = str(size).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    try:
        return int(float(text.rstrip("KMG")) * scale)
    except ValueError:
        return None


def cache_sizes(meta: dict) -> dict[str, int]:
    """``{"L1d": bytes, "L2": bytes, "L3": bytes}`` from meta.json's ``machine.caches`` (CPU 0's
    caches from sysfs); levels the meta does not record are absent."""
    out = {}
    for cache in (meta.get("machine") or {}).get("caches") or []:
        level, kind = str(cache.get("level")), cache.get("type")
        if kind == "Instruction":
            continue
        name = "L1d" if level == "1" else f"L{level}"
        size = _bytes(cache.get("size"))
        if size:
            out[name] = size
    return out


def latest_per_cell(table: pd.DataFrame, columns=("suite", *CELL_COLUMNS)) -> pd.DataFrame:
    """Rows of the newest run for each cell (rows equal in ``columns``).

    When several runs measured the same thing (the same variant, op, capacity, parameters ...),
    mixing their values would mix code versions and machine states, so only the latest run's
    rows are kept (newest by meta.json's start time, then by run id). By default cells of
    different suites are kept apart (a K sweep's K=16 cell is not a micro run's); pass
    ``CELL_COLUMNS`` to let the latest run of any suite win.
    """
    if table.empty:
        return table
    keys = table[list(columns)].astype(str).agg("\x1f".join, axis=1)
    started = table["started"] if "started" in table else ""
    order = started.astype(str) + "\x1f" + table["run_id"].astype(str) if "started" in table else \
        table["run_id"].astype(str)
    newest = order.groupby(keys, sort=False).transform("max")
    return table[order == newest]
