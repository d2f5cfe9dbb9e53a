"""Where a run's rows live on disk: ``rows.csv`` while the run is open, ``rows.parquet`` once closed.

An open run appends its rows to rows.csv batch by batch (:class:`bench.results.RunWriter`: each
batch flushed and fsync'ed, so a crash or a full disk loses at most the batch being written).
When the run ends (complete or not) the writer compacts it: :func:`bench.compaction.compact` writes the same rows
as ``rows.parquet`` (Apache Parquet, zstd, every text column dictionary-encoded, so a run's
constant params JSON is stored once per row group, not once per row), reads the file back,
checks that it holds exactly the rows of the CSV, and only then removes the CSV.

The stored form is typed by the results contract (:mod:`bench.contract`): its integer columns
as int64, its float columns as float64 (NaN kept apart from an empty cell), ``dirty`` as bool,
every other column, known or not, as UTF-8 text; an empty cell is null. Reading a parquet file
gives the very dicts :func:`bench.contract.read_rows` gives for the CSV it was made from. A
column the contract does not know, in a file a newer writer made, is read with the type it is
stored as.

A folder holding both files is most often one whose compaction was cut off after the parquet
file was put in place (it is written to a temporary name, checked, then renamed), but it may
hold a damaged or partial parquet file beside the only good copy of the rows. Readers take the
parquet file; compaction trusts it no more than one it has just written: it removes the CSV
only once the parquet file reads back as exactly the CSV's rows, and keeps both otherwise.

This module knows files and types only; what the columns mean and how rows are checked is the
results contract's (:mod:`bench.contract`, which reads through this module). pyarrow is needed
to write and read parquet; where it is missing (a bare machine running a suite) the run keeps
its CSV and ``replaybench compact`` converts it later.
"""

from __future__ import annotations

import math
from pathlib import Path

from replaybench.bench import atomic_file

__all__ = ["CSV_NAME", "PARQUET_NAME", "KINDS", "rows_file", "has_rows", "arrow_type", "write_parquet", "read_parquet",
           "read_parquet_table", "table_frame", "same_rows"]

CSV_NAME = "rows.csv"
PARQUET_NAME = "rows.parquet"

#: Rows per parquet row group: dictionary pages and statistics are per group, so a large group
#: stores a run's repeated text once for many rows; 64K rows keep a reader's peak memory small.
ROW_GROUP_ROWS = 65_536


def rows_file(run_dir) -> Path:
    """The file that holds the rows of ``run_dir``: rows.parquet when there is one, else rows.csv
    (which may not exist: the caller reports a missing file)."""
    run_dir = Path(run_dir)
    parquet = run_dir / PARQUET_NAME
    return parquet if parquet.exists() else run_dir / CSV_NAME


def has_rows(run_dir) -> bool:
    """Whether ``run_dir`` holds a rows file of either kind."""
    run_dir = Path(run_dir)
    return (run_dir / PARQUET_NAME).exists() or (run_dir / CSV_NAME).exists()


#: The stored type of each kind of column (the kinds are the results contract's:
#: :func:`bench.contract.column_kind`).
KINDS = ("int", "float", "bool", "text")


def arrow_type(kind: str):
    """The arrow type a column of ``kind`` (one of :data:`KINDS`) is stored as."""
    import pyarrow as pa

    return {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "text": pa.string()}[kind]


def write_parquet(path, header: list[str], rows: list[dict], kind) -> None:
    """Write ``rows`` (typed dicts as :func:`bench.contract.read_rows` gives them; a key missing
    from a row is an empty cell) with the columns of ``header``, in that order, each stored as
    ``kind(column)`` (one of :data:`KINDS`), to ``path``:
    zstd, dictionary-encoded, via a temporary file in the same folder and os.replace, so that
    ``path`` is never half written. Cost: O(rows x columns) in memory and time.

    Raises TypeError or ValueError (from pyarrow) when a value does not fit its column's type,
    OSError when the file cannot be written (nothing is left behind then)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    fields = [pa.field(c, arrow_type(kind(c))) for c in header]
    arrays = [pa.array([row.get(f.name) for row in rows], type=f.type, from_pandas=False) for f in fields]
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    with atomic_file.replacing(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", use_dictionary=True, row_group_size=ROW_GROUP_ROWS)


def read_parquet(path) -> tuple[list[str], dict[str, list]]:
    """``(header, columns)`` of a rows.parquet file: the column names in file order and each
    column's values as a Python list (int, float, bool, str or None). Checks nothing beyond what
    pyarrow checks; :func:`bench.contract.read_rows` checks the rest. Cost: one read of the file,
    O(rows x columns) Python objects."""
    table = read_parquet_table(path)
    header = list(table.column_names)
    return header, {name: table.column(i).to_pylist() for i, name in enumerate(header)}


def read_parquet_table(path):
    """The rows.parquet file at ``path`` as a pyarrow Table (pyarrow's errors propagate)."""
    import pyarrow.parquet as pq

    return pq.read_table(path)


def table_frame(table):
    """A pandas DataFrame of ``table`` equal, column by column and cell by cell, to
    ``pd.DataFrame.from_records`` of the same rows as Python dicts (what a run read from rows.csv
    gives): an integer column with a null becomes float64 with NaN as there, a column that is
    null throughout holds None (object), a boolean column with a null holds True/False/None
    (object). Cost: one pass per column in pyarrow and numpy, without a Python object per cell
    except for text and nullable booleans (about 4x faster than building the dicts)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    n = table.num_rows
    columns = {}
    for name, column in zip(table.column_names, table.columns):
        if n and column.null_count == n:
            columns[name] = np.full(n, None, dtype=object)
        elif column.null_count and pa.types.is_boolean(column.type):
            columns[name] = np.array(column.to_pylist(), dtype=object)
        else:
            columns[name] = column.to_numpy(zero_copy_only=False)
    return pd.DataFrame(columns, index=pd.RangeIndex(n))


def _same(a, b) -> bool:
    """Cell equality that a round trip must keep: the same type (an int is not a float, a bool
    is not an int), NaN equal to NaN, None only to None."""
    if a is None or b is None:
        return a is None and b is None
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def same_rows(a: list[dict], b: list[dict]) -> str | None:
    """None when the two row lists hold the same cells (by :func:`_same`), else the first
    difference, described. Cost: O(rows x columns)."""
    if len(a) != len(b):
        return f"{len(a)} rows against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x.keys() != y.keys():
            return f"row {i + 1}: columns {sorted(x.keys() ^ y.keys())} are in one and not the other"
        for column in x:
            if not _same(x[column], y[column]):
                return f"row {i + 1}, column {column!r}: {x[column]!r} against {y[column]!r}"
    return None
