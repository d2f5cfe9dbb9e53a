"""The results contract: what a run's rows.csv holds, how it is read and checked, and the metrics
every reader derives from it. The harness (:mod:`bench.results`, :mod:`bench.summary`) and the
analysis (:mod:`analysis`) both import this module and nothing else of each other, so a fact
about the results is stated once.

Schema. rows.csv is tidy: a header naming the columns, then one row per measured value or per
grid item that produced none. :data:`COLUMNS` are the columns this version writes; readers keep
columns they do not know as strings and fill columns a file lacks with None, and new columns
are only ever added, so runs written before a column existed still load. Values are typed by
:data:`INT_COLUMNS`, :data:`FLOAT_COLUMNS` and :data:`BOOL_COLUMNS` (everything else is text;
an empty field is None); :func:`format_cell` writes them and :func:`parse_cell` reads them back.
Integers are 64-bit signed (:data:`INT_RANGE`), the range every reader's table can hold. The
file is UTF-8 and names each column once.
:data:`SCHEMA_VERSION` rises only when a column changes meaning; a reader refuses a newer
version rather than misread it.

Statuses (:data:`STATUSES`):

- ``ok``: ``value`` is a measurement: finite, and not negative (except for the
  :data:`SIGNED_METRICS`, such as an episode's return), and a timing (:data:`TIMING_METRIC`)
  is above zero;
- ``below-resolution``: the measured value lies within the measurement's resolution (e.g. a
  cachegrind differential at its noise floor); ``value`` holds that bound, non-negative and in
  the row's unit. It is not a measurement: medians, ratios and comparisons use ``ok`` rows only;
- ``failed``, ``skipped``, ``unavailable``, ``unsupported`` (a meter this machine lacks): no
  value; ``error`` says why.

Every check is made by :func:`parse_row`, for the writer before a row is written and for the
reader (:func:`read_rows`) on every line, so the harness cannot write a run its readers refuse.
A run that has ended holds the same rows typed in rows.parquet (:mod:`bench.rowstore`); they are
read through the same checks (:func:`check_row`), and :func:`column_kind` gives each column's
stored type.

meta.json is a JSON object; the fields readers use have the types of :data:`META_TYPES`
(checked by :func:`read_meta`), so a run whose meta.json holds, say, a string where an object
belongs is refused by name instead of crashing a reader.

Cells. Rows equal in :data:`CELL_COLUMNS` measured the same thing (one *cell*); its repeats
differ only in the run and measurement columns (``repeat``, ``value``, ``env_steps``, ...).

Derived metrics (never stored): throughput ``items_per_s = items_per_call / seconds_per_call``
and cost ``ns_per_item``; ratios of medians to a reference variant (``x binary``) and to the
fastest peer library (``x best peer``), within one run, op, capacity and workload
(:func:`reference_ratios`).
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from replaybench.bench import rowstore
from replaybench.bench.rowstore import has_rows  # where a run's rows live is part of reading them

__all__ = ["SCHEMA_VERSION", "COLUMNS", "RUN_COLUMNS", "MEASUREMENT_COLUMNS", "CELL_COLUMNS", "INT_COLUMNS",
           "FLOAT_COLUMNS", "BOOL_COLUMNS", "INT_RANGE", "META_TYPES", "REQUIRED", "STATUSES", "MEASURED",
           "BELOW_RESOLUTION", "SIGNED_METRICS", "TIMING_METRIC", "PEER_PREFIX", "REFERENCES", "RunError", "format_cell", "parse_cell", "parse_row",
           "read_rows", "read_frame", "read_csv_rows", "has_rows", "check_row", "column_kind", "read_meta", "params_of",
           "training_device", "training_settings", "cell_key",
           "items_per_s", "ns_per_item", "op_unit", "item_name",
           "comparison_group", "reference_ratios", "format_table", "OpSpec", "OPS"]

SCHEMA_VERSION = 1

#: Who made the row: the same for every row of a run.
RUN_COLUMNS = ("schema_version", "run_id", "git_sha", "dirty", "machine")

#: What one measurement of a cell gave (and its place in a series: repeat, env steps, wall time).
MEASUREMENT_COLUMNS = ("value", "repeat", "loops", "status", "error", "env_steps", "wall_s")

COLUMNS = [
    *RUN_COLUMNS, "scenario",
    "variant", "structure", "policy", "K", "dtype", "params",
    "capacity", "batch", "threads", "transitions",
    "op", "metric", "value", "unit", "items_per_call", "repeat", "loops",
    "status", "error",
    # cache scenario: which cache level, measuring method, address stream and cache geometry
    "level", "method", "stream", "cache_config",
    # concurrency and training scenarios: actors (writers) and learners (samplers/updaters);
    # mode: the concurrency scenario's "threads" or "processes"; engine: the training engine
    # that ran (impl.rl.engines: "sequential", "process", "ray", "dataflow", "paac"); topology:
    # a gossip run's ("exponential/p1/k1"); training adds the algorithm, environment, seed and,
    # for return-curve points, the environment steps and wall seconds at which the value was taken
    "actors", "learners", "mode", "engine", "topology", "algo", "env", "seed", "env_steps", "wall_s",
    # lf scenario: the runtime that ran the workload (its suite's ``backends``: "ray", "dataflow",
    # "sync", ...); paac scenario: the stepping method of a stepping cell (its suite's
    # ``methods``: "paac", "per-env", "gym-sync", "envpool", ...). Neither is a buffer variant,
    # so those rows leave ``variant`` empty.
    "backend", "stepping",
]

#: Columns naming what was measured (not who measured it, nor the measurement): rows equal in
#: all of them belong to one cell.
CELL_COLUMNS = [c for c in COLUMNS if c not in RUN_COLUMNS and c not in MEASUREMENT_COLUMNS]

INT_COLUMNS = frozenset({"schema_version", "K", "capacity", "batch", "threads", "items_per_call", "repeat", "loops",
                         "actors", "learners", "seed", "env_steps"})
FLOAT_COLUMNS = frozenset({"value", "wall_s"})
BOOL_COLUMNS = frozenset({"dirty"})

#: The integers a number column may hold, bounds included: 64-bit signed, what the readers' tables
#: (pandas Int64, numpy int64) hold. A larger integer is refused when read and when written.
INT_RANGE = (-2**63, 2**63 - 1)

_NUMBER = (int, float)
#: Types of the meta.json fields the readers use, by path: ``a.b`` is key ``b`` of object ``a``,
#: ``a[]`` every element of list ``a``. Any field may be absent or null (readers treat null as
#: absent); other fields are not checked. ``int`` and numbers exclude booleans.
META_TYPES: dict[str, tuple[type, ...]] = {
    "schema_version": (int,), "run_id": (str,), "scenario": (str,), "start_time": (str,), "end_time": (str,),
    "git_sha": (str,), "dirty": (bool,), "complete": (bool,),
    "suite": (dict,), "suite.name": (str,),
    "selection": (dict,), "selection.params": (dict,),
    "libraries": (dict,), "pyperf_settings": (dict,),
    "machine": (dict,), "machine.cpu_model": (str,), "machine.usable_cpus": (int,), "machine.logical_cpus": (int,),
    "machine.cpu_quota": _NUMBER,
    "machine.mem_total_bytes": _NUMBER, "machine.caches": (list,), "machine.caches[]": (dict,),
    "gil_share": (list,), "gil_share[]": (dict,), "gil_share[].variant": (str,), "gil_share[].capacity": (int,),
    "gil_share[].gil_share": _NUMBER, "gil_share[].gil_pair": (dict,), "gil_share[].gil_pair.ratio": _NUMBER,
    "gil_share[].gil_threads": (list,), "gil_share[].gil_threads[]": (dict,),
    "gil_share[].gil_threads[].threads": (int,), "gil_share[].gil_threads[].ratio": _NUMBER,
    "shared_path": (list,), "shared_path[]": (dict,), "shared_path[].policy": (str,),
    "shared_path[].variant": (str,), "shared_path[].capacity": (int,), "shared_path[].gil_bound": _NUMBER,
    "shared_path[].step_over_local": _NUMBER, "shared_path[].step_over_local_range": (list,),
    "shared_path[].step_over_local_range[]": _NUMBER,
    "shared_path[].kernel": (dict,), "shared_path[].kernel.ratio": _NUMBER,
    "shared_path[].kernel.ratio_min": _NUMBER, "shared_path[].kernel.ratio_max": _NUMBER,
    "shared_path[].gil_pair": (dict,), "shared_path[].gil_pair.ratio": _NUMBER,
    "shared_path[].gil_pair.ratio_min": _NUMBER, "shared_path[].gil_pair.ratio_max": _NUMBER,
    "shared_path[].kernel_private": (dict,), "shared_path[].kernel_private.ratio": _NUMBER,
    "shared_path[].kernel_private.ratio_min": _NUMBER, "shared_path[].kernel_private.ratio_max": _NUMBER,
    "shared_path[].line_transfer_ns": (list,), "shared_path[].line_transfer_ns[]": _NUMBER,
    "shared_path[].kernel_scaling": (list,), "shared_path[].kernel_scaling[]": (dict,),
    "shared_path[].kernel_scaling[].threads": (int,),
    **{f"shared_path[].kernel_scaling[].{name}{key}": kind for name in ("kernel", "kernel_private")
       for key, kind in (("", (dict,)), (".ratio", _NUMBER), (".ratio_min", _NUMBER), (".ratio_max", _NUMBER))},
    "memory_limits": (dict,), "memory_limits.sizes": (list,), "memory_limits.sizes[]": (dict,),
    "memory_limits.sizes[].bytes": (int,), "memory_limits.sizes[].gather_ns": _NUMBER,
    "memory_limits.sizes[].latency_ns": _NUMBER, "memory_limits.sizes[].gather_ns_2threads": _NUMBER,
    "memory_limits.op_floors": (dict,), "memory_limits.op_floors.batch": (int,),
    "memory_limits.op_floors.row_bytes": (int,), "memory_limits.op_floors.row_stride": (int,),
    "memory_limits.op_floors.sizes": (list,),
    "memory_limits.op_floors.sizes[]": (dict,), "memory_limits.op_floors.sizes[].capacity": (int,),
    "memory_limits.op_floors.sizes[].descent_ns": _NUMBER, "memory_limits.op_floors.sizes[].rows_ns": _NUMBER,
    "memory_limits.op_floors.sizes[].sample_ns": _NUMBER, "memory_limits.op_floors.sizes[].update_ns": _NUMBER,
}

#: Columns without which a rows.csv cannot be used.
REQUIRED = ("scenario", "variant", "op", "metric", "value", "status")

MEASURED = "ok"
BELOW_RESOLUTION = "below-resolution"
STATUSES = (MEASURED, "failed", "skipped", "unavailable", "unsupported", BELOW_RESOLUTION)

#: Metrics whose values may be negative: an episode's return (and a greedy evaluation's mean return) is a sum of rewards, negative in
#: many environments. Every other metric is a count, a duration, a rate or a fraction.
SIGNED_METRICS = frozenset({"return", "eval_return"})

#: The micro scenario's metric: seconds per call, averaged over a value's loops.
TIMING_METRIC = "seconds_per_call"

PEER_PREFIX = "peer:"

#: Variants the ratio columns compare with: (column title, variant name).
REFERENCES = (("x binary", "binary"),)


@dataclass(frozen=True)
class OpSpec:
    """How one micro op (the ``op`` column of a timing row) is counted and shown: what one of its
    items is, how many a call makes (``per_batch``: the row's batch, else 1) and the scale of the
    unit its throughput is shown in. What one call does is :mod:`bench.workloads`' business."""

    name: str
    per_batch: bool
    item: str  # what an item is, for the unit column: "transitions", "iterations", ...
    scale: float  # summaries show items/s divided by this
    shown_unit: str

    def items_per_call(self, batch: int) -> int:
        return batch if self.per_batch else 1


#: The micro ops by name (the workloads that run them: :mod:`bench.workloads`).
OPS = {op.name: op for op in (
    OpSpec("empty", False, "calls", 1e6, "M calls/s"),
    OpSpec("insert_one", False, "transitions", 1e3, "K/s"),
    OpSpec("insert_batch", True, "transitions", 1e6, "M/s"),
    OpSpec("sample", True, "transitions", 1e6, "M/s"),
    OpSpec("sample_indices", True, "transitions", 1e6, "M/s"),
    OpSpec("find", True, "indices", 1e6, "M/s"),
    OpSpec("update", True, "transitions", 1e6, "M/s"),
    OpSpec("mixed", False, "iterations", 1e3, "K it/s"),
)}


class RunError(ValueError):
    """A run folder that cannot be used; ``str()`` names the file (and line) and the reason."""

    def __init__(self, path, message: str, line: int | None = None):
        self.path = Path(path)
        self.line = line
        where = f"{self.path}, line {line}" if line is not None else str(self.path)
        super().__init__(f"{where}: {message}")


# ---------------------------------------------------------------------------------------------
# values and rows


def format_cell(value) -> str:
    """A value as rows.csv holds it: None as empty, booleans as true/false, floats by ``repr``
    (exact round trip), dicts as sorted JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _short(text: str, limit: int = 40) -> str:
    """``repr`` of ``text``, cut to about ``limit`` characters (a message names a value, it does not hold it)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def column_kind(column: str) -> str:
    """How ``column`` is typed: "int", "float", "bool" or "text" (any column not in the number or
    boolean sets, known or not)."""
    if column in INT_COLUMNS:
        return "int"
    if column in FLOAT_COLUMNS:
        return "float"
    return "bool" if column in BOOL_COLUMNS else "text"


def parse_cell(column: str, text: str):
    """The typed value of one field of ``column`` (None for an empty field).

    Raises
    ------
    ValueError
        naming the column and the text, when a number column holds no number or an integer
        outside :data:`INT_RANGE`.
    """
    if text == "":
        return None
    if column in INT_COLUMNS or column in FLOAT_COLUMNS:
        try:
            number = int(text) if column in INT_COLUMNS else float(text)
        except ValueError:
            raise ValueError(f"column {column!r}: cannot parse {_short(text)} as a number") from None
        if column in INT_COLUMNS and not INT_RANGE[0] <= number <= INT_RANGE[1]:
            raise ValueError(f"column {column!r}: {_short(text)} is outside the 64-bit integer range "
                             f"[{INT_RANGE[0]}, {INT_RANGE[1]}]")
        return number
    if column in BOOL_COLUMNS:
        return text.lower() == "true"
    return text


def _check_value(row: dict) -> None:
    """The ``value`` of an ``ok`` or ``below-resolution`` row (see the module docstring)."""
    status, metric, value = row["status"], row.get("metric"), row.get("value")
    if value is None:
        raise ValueError(f"status {status} but no value")
    if not math.isfinite(value):
        raise ValueError(f"value {value!r} of metric {metric!r} is not finite, so it cannot be a measurement "
                         f"(status {status})")
    if value < 0 and (status == BELOW_RESOLUTION or metric not in SIGNED_METRICS):
        what = "a resolution bound" if status == BELOW_RESOLUTION else f"metric {metric!r}"
        raise ValueError(f"value {value!r} is negative, which {what} cannot be (status {status})")
    if status == MEASURED and metric == TIMING_METRIC and value == 0:
        raise ValueError(f"value 0 of metric {metric!r}: a call cannot take no time")


def parse_row(header: Sequence[str], fields: Sequence[str]) -> dict:
    """One rows.csv line as a typed dict, checked against the contract.

    Checks: as many fields as the header; numbers parse; ``schema_version`` is not newer than
    :data:`SCHEMA_VERSION`; ``status`` is known; an ``ok`` or ``below-resolution`` row has a
    finite value in its metric's range. Cost: O(number of columns).

    Raises
    ------
    ValueError
        with a message naming the column and value (no file or line; callers add those).
    """
    if len(fields) != len(header):
        raise ValueError(f"{len(fields)} fields where the header has {len(header)} (truncated or broken row)")
    row = {column: parse_cell(column, text) for column, text in zip(header, fields)}
    check_row(row)
    return row


def check_row(row: Mapping) -> None:
    """The checks of :func:`parse_row` after parsing, on a typed row (from any storage):
    ``schema_version`` not newer than this reader's, ``status`` known, an ``ok`` or
    ``below-resolution`` row's value in its metric's range. ValueError naming the column and
    value otherwise."""
    version = row.get("schema_version")
    if version is not None and version > SCHEMA_VERSION:
        raise ValueError(f"schema_version {version} is newer than this reader knows ({SCHEMA_VERSION}); "
                         f"update replaybench to read it")
    if row.get("status") not in STATUSES:
        raise ValueError(f"unknown status {row.get('status')!r} (known: {', '.join(STATUSES)})")
    if row["status"] in (MEASURED, BELOW_RESOLUTION):
        _check_value(row)


def _utf8_lines(fh, path: Path):
    """The lines of binary file ``fh`` decoded as UTF-8, each when it is read.

    A line that is not UTF-8 refuses the whole run rather than being read with replacement
    characters: the harness writes rows.csv as UTF-8 only, so such a byte means the file was
    damaged or written by something else, and a replaced character would silently turn a text
    cell (variant, op, params ...) into another cell, or hide damage elsewhere in the line.
    """
    for number, raw in enumerate(fh, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise RunError(path, f"byte {raw[err.start:err.start + 1]!r} (byte {err.start + 1} of the line) is not "
                                 f"UTF-8 ({err.reason}); the file is damaged or was not written by replaybench",
                           number) from None


def read_rows(run_dir) -> list[dict]:
    """The rows of a run as typed dicts, every row checked by :func:`check_row`: from
    rows.parquet when the run was compacted, else from rows.csv (:mod:`bench.rowstore`).

    Columns this version does not know are kept: as strings from rows.csv, with the type they
    are stored as from rows.parquet (a newer writer's); columns the file lacks are absent from
    its dicts. Cost: one pass over the file (rows.csv: decoding one line at a time).

    Raises
    ------
    RunError
        naming the file and, for a bad line or row, its number: a missing file; for rows.csv
        see :func:`read_csv_rows`; for rows.parquet a file pyarrow cannot read, a column named
        twice or typed against the contract, or a row :func:`check_row` refuses.
    """
    path = rowstore.rows_file(run_dir)
    if not path.exists():
        path = rowstore.rows_file(run_dir)  # compacted since the first look: rows.parquet now
    if not path.exists():
        raise RunError(path, "missing (a run folder holds rows.csv or rows.parquet, and meta.json)")
    if path.name == rowstore.PARQUET_NAME:
        return _read_parquet_rows(path)
    return read_csv_rows(path)[1]


def read_frame(run_dir):
    """The rows of a run as a pandas DataFrame of the file's columns, checked as
    :func:`read_rows` checks them and equal to ``pd.DataFrame.from_records(read_rows(run_dir))``
    (:func:`bench.rowstore.table_frame` says how the cells are typed).

    From rows.parquet the frame is built column by column and only the rows that a vectorised
    pass cannot clear (an unknown status, a newer schema, an ``ok`` or ``below-resolution`` value
    that is missing, not finite, zero or negative) go through :func:`check_row`, which decides:
    the cost is one read of the file, not a dict per row. From rows.csv it is
    :func:`read_rows`'s dicts, framed. Raises :class:`RunError` as :func:`read_rows` does.
    """
    import pandas as pd

    path = rowstore.rows_file(run_dir)
    if not path.exists() or path.name != rowstore.PARQUET_NAME:
        rows = read_rows(run_dir)
        return pd.DataFrame.from_records(rows) if rows else pd.DataFrame()
    table = _parquet_table(path)
    frame = rowstore.table_frame(table)
    for number in _rows_to_check(frame):
        row = table.slice(number - 1, 1).to_pylist()[0]
        try:
            check_row(row)
        except ValueError as err:
            raise RunError(path, f"row {number}: {err}") from None
    return frame


def _rows_to_check(frame) -> list[int]:
    """Row numbers (1-based) of ``frame`` that :func:`check_row` could refuse; every other row
    passes it, by the same tests done on whole columns."""
    import numpy as np
    import pandas as pd

    n = len(frame)
    if "status" not in frame:
        return list(range(1, n + 1))
    status = frame["status"]
    suspect = ~status.isin(STATUSES).to_numpy()
    if "schema_version" in frame:
        suspect |= (pd.to_numeric(frame["schema_version"], errors="coerce") > SCHEMA_VERSION).to_numpy()
    value = pd.to_numeric(frame["value"], errors="coerce").to_numpy(dtype=float) if "value" in frame else \
        np.full(n, np.nan)
    with np.errstate(invalid="ignore"):
        doubtful = ~np.isfinite(value) | (value <= 0)
    suspect |= status.isin((MEASURED, BELOW_RESOLUTION)).to_numpy() & doubtful
    return (np.flatnonzero(suspect) + 1).tolist()


#: The columns whose stored type the contract fixes (:func:`_parquet_table`).
_KNOWN_COLUMNS = frozenset(COLUMNS)


def _parquet_table(path: Path):
    """The pyarrow Table of a rows.parquet file whose header and column types are the
    contract's; RunError naming the file otherwise.

    Only the columns of :data:`COLUMNS` are type-checked (each must be stored as
    :func:`column_kind` says). A column this version does not know passes with whatever type
    it is stored as: a newer writer may add a column, typed as it sees fit (an int64
    ``cores_used``), and its runs must still load; nothing here reads such a column."""
    try:
        table = rowstore.read_parquet_table(path)
    except ImportError as err:
        raise RunError(path, f"reading parquet needs pyarrow ({err}); pip install pyarrow") from None
    except Exception as err:  # pyarrow's errors (ArrowInvalid, OSError ...): a damaged file
        raise RunError(path, f"not a readable parquet file: {err}") from None
    _check_header(path, list(table.column_names))
    for field in table.schema:
        if field.name not in _KNOWN_COLUMNS:
            continue
        wanted = rowstore.arrow_type(column_kind(field.name))
        if field.type != wanted:
            raise RunError(path, f"column {field.name!r} is stored as {field.type}, where the results contract "
                                 f"wants {wanted}")
    return table


def _read_parquet_rows(path: Path) -> list[dict]:
    """Rows of a rows.parquet file, checked as :func:`read_rows` says."""
    table = _parquet_table(path)
    header = list(table.column_names)
    rows = [dict(zip(header, values)) for values in zip(*(c.to_pylist() for c in table.columns))] if header else []
    for number, row in enumerate(rows, 1):
        try:
            check_row(row)
        except ValueError as err:
            raise RunError(path, f"row {number}: {err}") from None
    return rows


def _check_header(path: Path, header: list[str]) -> None:
    """RunError (line 1) when ``header`` lacks :data:`REQUIRED` or names a column twice."""
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise RunError(path, f"not a rows.csv header: missing column(s) {missing} "
                             f"(the first line must name the columns)", 1)
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:
        raise RunError(path, f"the header names column(s) {twice} more than once, so which field holds "
                             f"their values cannot be told", 1)


def read_csv_rows(path) -> tuple[list[str], list[dict]]:
    """``(header, rows)`` of a rows.csv file, every line checked by :func:`parse_row`.

    Raises
    ------
    RunError
        naming the file and, for a bad line, its number: a missing file, a byte that is not
        UTF-8 (see :func:`_utf8_lines`: the run is refused, not read with replacement), a header
        without :data:`REQUIRED` or naming a column twice (which of the two holds the values
        cannot be told), a broken line (see :func:`parse_row`) or a CSV error.
    """
    path = Path(path)
    if not path.exists():
        raise RunError(path, "missing (a run folder holds rows.csv or rows.parquet, and meta.json)")
    rows = []
    with open(path, "rb") as fh:
        reader = csv.reader(_utf8_lines(fh, path))
        try:
            header = next(reader, None)
            if not header:
                raise RunError(path, "empty file, no header", 1)
            _check_header(path, header)
            for fields in reader:
                if not fields:
                    continue  # a blank line carries no row
                try:
                    rows.append(parse_row(header, fields))
                except ValueError as err:
                    raise RunError(path, str(err), reader.line_num) from None
        except csv.Error as err:  # e.g. a quoted field cut off by a truncated write
            raise RunError(path, f"CSV error: {err}", reader.line_num) from None
    return header, rows


def _meta_type_error(meta: dict) -> str | None:
    """The first field of ``meta`` whose type breaks :data:`META_TYPES`, described; None if none.
    Cost: O(size of the checked fields)."""
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "an object",
             list: "a list"}
    for spec, types in META_TYPES.items():
        found = [("", meta)]  # (path so far, value) of every value the spec names
        for part in spec.split("."):
            key, each = part.removesuffix("[]"), part.endswith("[]")
            found = [(f"{where}.{key}".lstrip("."), obj.get(key)) for where, obj in found if isinstance(obj, dict)]
            if each:
                found = [(f"{where}[{i}]", item) for where, seq in found if isinstance(seq, list)
                         for i, item in enumerate(seq)]
        for where, value in found:
            if value is None:
                continue
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                shown = json.dumps(value)
                shown = shown if len(shown) <= 40 else shown[:40] + "..."
                return (f"field {where!r} holds {shown} ({names.get(type(value), type(value).__name__)}), where "
                        f"the results contract wants {' or '.join(names[t] for t in types)} (or null)")
    return None


def read_meta(run_dir) -> dict:
    """meta.json of a run, checked: it exists, is a JSON object, its fields have the types of
    :data:`META_TYPES` and its ``schema_version`` is not newer than :data:`SCHEMA_VERSION`.

    Raises
    ------
    RunError
        naming the file (and, for broken JSON, the line; for a wrongly typed field, the field
        and its value).
    """
    path = Path(run_dir) / "meta.json"
    if not path.exists():
        raise RunError(path, "missing (a run folder holds rows.csv and meta.json)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise RunError(path, f"not UTF-8 ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise RunError(path, f"not valid JSON: {err.msg}", err.lineno) from None
    if not isinstance(meta, dict):
        raise RunError(path, "not a JSON object")
    wrong = _meta_type_error(meta)
    if wrong:
        raise RunError(path, wrong)
    version = meta.get("schema_version")
    if version is not None and version > SCHEMA_VERSION:
        raise RunError(path, f"schema_version {version} is newer than this reader knows ({SCHEMA_VERSION}); "
                             f"update replaybench to read it")
    return meta


def params_of(params) -> dict:
    """A row's ``params`` (its JSON text, or the dict itself) as a dict; {} when empty or unreadable."""
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError:
            return {}
    return params if isinstance(params, dict) else {}


def training_device(params) -> str:
    """The device a training row's learners ran on (params ``device``; ``cpu`` for runs from
    before the setting)."""
    return str(params_of(params).get("device") or "cpu")


def training_settings(params) -> str:
    """The learner settings and algorithm overrides of a training row that its other columns do
    not show (``lag=1 prefetch cuda_graph=False``; ``-`` for none): runs that differ only in
    them are different configurations, in the summary's lines and the figures' points."""
    params = params_of(params)
    out = [f"lag={params['priority_lag']}"] if params.get("priority_lag") else []
    out += ["prefetch"] if params.get("learner_prefetch") else []
    out += [f"{k}={v}" for k, v in sorted((params.get("overrides") or {}).items()) if k != "updates_per_step"]
    return " ".join(out) or "-"


def cell_key(row: Mapping) -> tuple:
    """The values of :data:`CELL_COLUMNS` of a row (``params`` as sorted JSON): equal keys, one cell."""
    return tuple(json.dumps(params_of(row.get(c)), sort_keys=True) if c == "params" else row.get(c)
                 for c in CELL_COLUMNS)


# ---------------------------------------------------------------------------------------------
# derived metrics


def items_per_s(items_per_call, seconds_per_call):
    """Throughput of a timing: items per call over seconds per call (numbers or arrays alike)."""
    return items_per_call / seconds_per_call


def ns_per_item(items_per_call, seconds_per_call):
    """Cost of a timing: nanoseconds per item (numbers or arrays alike)."""
    return 1e9 * seconds_per_call / items_per_call


def op_unit(op: str) -> tuple[float, str]:
    """``(scale, unit)`` a micro op's throughput is shown in, e.g. ``(1e6, "M transitions/s")``
    (the scale and item of :data:`OPS`; ``(1, "items/s")`` for other ops)."""
    spec = OPS.get(op)
    if spec is None:
        return 1.0, "items/s"
    prefix = {1e6: "M ", 1e3: "K ", 1.0: ""}.get(spec.scale, f"{spec.scale:g} ")
    return spec.scale, f"{prefix}{spec.item}/s"


def item_name(op: str) -> str:
    """What one item of ``op`` is ("transition", "iteration", "call")."""
    spec = OPS.get(op)
    return spec.item.rstrip("s") if spec else "item"


def comparison_group(cell: Mapping) -> tuple:
    """What a cell's ratios compare within: run, op, capacity and workload (batch, transitions,
    threads and the ``mixed_adds`` parameter). Missing entries count as None (threads as 1)."""
    return (cell.get("run_id"), cell.get("op"), cell.get("capacity"), cell.get("batch"), cell.get("transitions"),
            cell.get("threads") or 1, params_of(cell.get("params")).get("mixed_adds"))


def reference_ratios(cells: Sequence[Mapping]) -> list[dict]:
    """Ratios of medians for each cell, in the order given.

    ``cells``: mappings holding ``variant``, ``median`` (a throughput: higher is better) and the
    :func:`comparison_group` entries, plus ``dtype`` where it varies. Returns, per cell,
    ``{"x_<reference>": ..., "best_peer": ..., "x_best_peer": ...}``, None where there is
    nothing to compare with:

    - ``x_<reference>`` for each of :data:`REFERENCES`: the cell's median over the reference
      variant's in the same group, at the same ``dtype`` when the reference was measured at it
      (else the first reference cell of the group);
    - ``best_peer``: the peer library (``peer:`` variant) with the highest median in the group;
      ``x_best_peer``: the cell's median over that peer's.

    Cost: O(cells x reference cells per group).
    """
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, cell in enumerate(cells):
        groups[comparison_group(cell)].append(i)
    out: list[dict] = [{} for _ in cells]
    for members in groups.values():
        peers = [i for i in members if str(cells[i]["variant"]).startswith(PEER_PREFIX)]
        best = max(peers, key=lambda i: cells[i]["median"], default=None)  # first of equal medians
        for i in members:
            median = cells[i]["median"]
            for _, name in REFERENCES:
                refs = [j for j in members if cells[j]["variant"] == name]
                same = [j for j in refs if cells[j].get("dtype") == cells[i].get("dtype")]
                ref = (same or refs or [None])[0]
                out[i][f"x_{name}"] = median / cells[ref]["median"] if ref is not None else None
            out[i]["best_peer"] = cells[best]["variant"] if best is not None else None
            out[i]["x_best_peer"] = median / cells[best]["median"] if best is not None else None
    return out


# ---------------------------------------------------------------------------------------------
# text


def format_table(header: list[str], body: Iterable[list], right: set[int]) -> list[str]:
    """A plain-text table as lines: columns padded to their widest cell, those in ``right``
    right-aligned, a dashed rule under the header."""
    body = [[str(c) for c in row] for row in body]
    widths = [max(len(str(row[i])) for row in [header, *body]) for i in range(len(header))]

    def fmt(row):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    return [fmt(header), fmt(["-" * w for w in widths]), *map(fmt, body)]
