"""Compaction: a run's rows.csv turned into rows.parquet, checked before the CSV goes
(:mod:`bench.rowstore` says where rows live and why; ``replaybench compact RUN...``).

:func:`compact` reads the CSV through the results contract (so a run the readers refuse is not
converted), writes the parquet file under a temporary name, reads it back, and renames it into
place only when it holds exactly the CSV's rows (the same columns in the same order, the same
cells with the same types, NaN and empty cells apart); then it removes the CSV. A run that fails
any step is left as it was.
"""

from __future__ import annotations

import os
from pathlib import Path

from replaybench.bench import contract, rowstore

__all__ = ["CompactError", "compact"]


class CompactError(ValueError):
    """A run :func:`compact` refuses to convert; the message names the folder and the reason.
    The run is left as it was."""


def compact(run_dir, *, missing_ok: bool = False) -> Path:
    """Convert the rows.csv of ``run_dir`` into rows.parquet and remove the CSV, after checking
    that the parquet file reads back as exactly the CSV's rows; return the path of the file that
    holds the rows now.

    A run already compacted is left alone. With ``missing_ok``, where pyarrow is not installed
    the CSV stays and its path is returned. Cost: the run's rows in memory twice, one write and
    one read of the parquet file.

    Raises
    ------
    bench.contract.RunError
        when rows.csv is missing or breaks the results contract (it is not converted);
    CompactError
        when the rows read back differ from the CSV's (the run keeps its CSV, no parquet file);
    ImportError
        without pyarrow (unless ``missing_ok``);
    OSError
        when the parquet file cannot be written (nothing is left of it).
    """
    run_dir = Path(run_dir)
    csv_path, parquet_path = run_dir / rowstore.CSV_NAME, run_dir / rowstore.PARQUET_NAME
    if parquet_path.exists():
        if csv_path.exists():  # a compaction cut off after its rename: both hold the same rows
            csv_path.unlink()
        return parquet_path
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        if missing_ok:
            return csv_path
        raise
    header, rows = contract.read_csv_rows(csv_path)
    staged = run_dir / f".{rowstore.PARQUET_NAME}.check"
    try:
        rowstore.write_parquet(staged, header, rows, contract.column_kind)
        read_header, columns = rowstore.read_parquet(staged)
        if read_header != header:
            raise CompactError(f"{run_dir}: the parquet file's columns {read_header} differ from the CSV's "
                               f"{header}; the run keeps its rows.csv")
        back = [dict(zip(read_header, values)) for values in zip(*columns.values())]
        difference = rowstore.same_rows(rows, back)
        if difference:
            raise CompactError(f"{run_dir}: the rows read back from parquet differ from rows.csv ({difference}); "
                               f"the run keeps its rows.csv")
        os.replace(staged, parquet_path)
    except BaseException:
        try:
            staged.unlink()
        except FileNotFoundError:
            pass
        raise
    csv_path.unlink()
    return parquet_path
