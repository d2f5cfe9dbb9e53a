"""Compaction: a run's rows.csv turned into rows.parquet, checked before the CSV goes
(:mod:`bench.rowstore` says where rows live and why; ``replaybench compact RUN...``).

:func:`compact` reads the CSV through the results contract (so a run the readers refuse is not
converted), writes the parquet file under a staging name of its own
(``.rows.parquet.<pid>.<random>.check``), reads it back, and renames it into place only when it
holds exactly the CSV's rows (the same columns in the same order, stored as the contract types
them, the same cells with the same types, NaN and empty cells apart); then it removes the CSV.
A run that fails any step is left as it was (no staging file either), and the error names the
run folder and the file: a full disk is an OSError of its errno whose message does.

A rows.parquet found beside a rows.csv is never trusted: it is read back and compared with the
CSV exactly as a fresh one is, and the CSV goes only when they agree. Where they differ, or the
parquet file cannot be read (cut off by an interrupted copy, say), both are kept and
:class:`CompactError` names both files.

Two guards against losing rows to a concurrent process:

- *an open run is refused*. Its writer (:class:`bench.results.RunWriter`) holds an exclusive
  ``flock`` on rows.csv from the moment it creates the file until :meth:`~bench.results.RunWriter.finish`;
  compact probes for it (a non-blocking shared lock) and, finding it held, refuses the run.
  The kernel drops the lock when the writer's process dies, however it dies, so a crashed or
  killed run (meta.json ``complete: false``, no live writer) is compacted as any other: the
  lock, unlike a recorded pid and host, cannot outlive its writer or name a reused pid. Compact
  keeps its shared lock on rows.csv until it is done, so no writer can begin on the file meanwhile;
- *compactions of one run are serialised* by an exclusive ``flock`` on ``.compact.lock`` in the
  run folder (removed when the compaction ends). The second of two compactions started together
  finds the run compact and returns the parquet path; each uses its own staging name, so neither
  can rename or remove the other's file.

On a filesystem without ``flock`` (``ENOLCK``, ``EOPNOTSUPP``: some network and FUSE mounts) neither
guard holds: the run is compacted without them.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
from contextlib import contextmanager
from pathlib import Path

from replaybench.bench import contract, rowstore

__all__ = ["CompactError", "LOCK_NAME", "compact"]

#: The lock file that serialises compactions of one run (present only while one runs).
LOCK_NAME = ".compact.lock"

#: flock's errors on a filesystem that does not support it: the guards are skipped there.
_NO_FLOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})


class CompactError(ValueError):
    """A run :func:`compact` refuses to convert; the message names the folder (and, where two
    rows files disagree, both files) and the reason. The run is left as it was."""


def compact(run_dir, *, missing_ok: bool = False) -> Path:
    """Convert the rows.csv of ``run_dir`` into rows.parquet and remove the CSV, after checking
    that the parquet file reads back as exactly the CSV's rows; return the path of the file that
    holds the rows now.

    A run already compacted (rows.parquet alone) is left alone and its parquet path returned,
    also when another compaction of it finished while this one waited for it. A rows.parquet
    beside a rows.csv (a compaction cut off between its rename and the CSV's removal, or a
    damaged copy) is read back and compared with the CSV; the CSV is removed only when they
    agree. With ``missing_ok``, where pyarrow is not installed the CSV stays and its path is
    returned. Cost: the run's rows in memory twice, one read of the CSV, one write and one read
    of the parquet file (only the read where a parquet file is already there).

    Raises
    ------
    bench.contract.RunError
        when rows.csv is missing (and there is no rows.parquet) or breaks the results contract
        (it is not converted);
    CompactError
        when the run is still being written (its writer is alive); when the rows read back
        differ from the CSV's (the run keeps its CSV, no parquet file); when a rows.parquet
        beside the CSV cannot be read or holds other rows (both are kept);
    ImportError
        without pyarrow (unless ``missing_ok``);
    OSError
        when a file cannot be written, read, renamed or removed (a full disk): the message
        names the run folder and the file, ``errno`` is the cause's; nothing of the staged
        parquet file is left, and the CSV is kept.
    """
    run_dir = Path(run_dir)
    csv_path, parquet_path = run_dir / rowstore.CSV_NAME, run_dir / rowstore.PARQUET_NAME
    if parquet_path.exists() and not csv_path.exists():
        return parquet_path  # compact already: nothing to lock or check
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        if missing_ok:
            return csv_path
        raise
    with _compaction_lock(run_dir), _not_being_written(run_dir, csv_path) as csv_there:
        if not csv_there:
            if parquet_path.exists():
                return parquet_path  # another compaction finished it while this one waited
            contract.read_csv_rows(csv_path)  # RunError: neither file
        with _naming_os_errors(run_dir, f"reading {csv_path.name}", "nothing was changed"):
            try:
                header, rows = contract.read_csv_rows(csv_path)
            except contract.RunError as err:
                if parquet_path.exists():
                    raise CompactError(f"{parquet_path} is beside {csv_path}, which the readers refuse ({err}); both "
                                       f"are kept") from None
                raise
        if parquet_path.exists():
            _check_left_parquet(parquet_path, csv_path, header, rows)
        else:
            _write_checked(run_dir, parquet_path, header, rows)
        with _naming_os_errors(run_dir, f"removing {csv_path.name}",
                               f"{parquet_path.name} holds the rows; compacting the run again removes the CSV"):
            try:
                csv_path.unlink()
            except FileNotFoundError:  # gone with a compaction on a filesystem without flock: the same rows
                pass
    return parquet_path


def _write_checked(run_dir: Path, parquet_path: Path, header: list[str], rows: list[dict]) -> None:
    """Write ``rows`` to a staging file of this call's own, read it back, compare, and rename it
    to ``parquet_path``; CompactError (differ) or a named OSError otherwise, the staging file
    removed."""
    staged = run_dir / f".{rowstore.PARQUET_NAME}.{os.getpid()}.{secrets.token_hex(4)}.check"
    kept = "the run keeps its rows.csv and nothing of the parquet file is left"
    try:
        with _naming_os_errors(run_dir, f"writing {staged.name} (the staged {parquet_path.name})", kept):
            rowstore.write_parquet(staged, header, rows, contract.column_kind)
        with _naming_os_errors(run_dir, f"reading back {staged.name} (the staged {parquet_path.name})", kept):
            try:
                difference = _difference(staged, header, rows)
            except OSError:
                raise
            except Exception as err:  # pyarrow's ArrowInvalid ...: what was written does not read back
                raise CompactError(f"{run_dir}: the parquet file written cannot be read back ({err}); "
                                   f"the run keeps its rows.csv") from None
        if difference:
            raise CompactError(f"{run_dir}: the rows read back from parquet differ from rows.csv ({difference}); "
                               f"the run keeps its rows.csv")
        with _naming_os_errors(run_dir, f"renaming {staged.name} to {parquet_path.name}", kept):
            os.replace(staged, parquet_path)
    except BaseException:
        try:
            staged.unlink()
        except FileNotFoundError:
            pass
        raise


def _check_left_parquet(parquet_path: Path, csv_path: Path, header: list[str], rows: list[dict]) -> None:
    """CompactError naming both files unless the rows.parquet found beside rows.csv holds
    exactly the CSV's ``rows``; neither file is touched."""
    advice = (f"both are kept (readers take {parquet_path.name}: where {csv_path.name} holds the run, remove "
              f"{parquet_path.name} and compact the run again)")
    try:
        difference = _difference(parquet_path, header, rows)
    except Exception as err:  # pyarrow's ArrowInvalid, OSError ...: a file cut off or damaged
        raise CompactError(f"{parquet_path} cannot be read ({type(err).__name__}: {err}) and {csv_path} is beside "
                           f"it; {advice}") from None
    if difference:
        raise CompactError(f"{parquet_path} and {csv_path} do not hold the same rows (rows.csv against "
                           f"rows.parquet: {difference}); {advice}")


def _difference(path: Path, header: list[str], rows: list[dict]) -> str | None:
    """None when the parquet file at ``path`` holds the columns of ``header``, in that order and
    stored as the contract types them (so the readers take it), and exactly ``rows``; else the
    first difference, described. pyarrow's errors propagate. Cost: one read of the file."""
    import pyarrow.parquet as pq

    read_header, columns = rowstore.read_parquet(path)
    if read_header != header:
        return f"the parquet file's columns {read_header} differ from the CSV's {header}"
    for field in pq.read_schema(path):
        wanted = rowstore.arrow_type(contract.column_kind(field.name))
        if field.type != wanted:
            return f"column {field.name!r} is stored as {field.type}, where the CSV's rows want {wanted}"
    return rowstore.same_rows(rows, [dict(zip(read_header, values)) for values in zip(*columns.values())])


@contextmanager
def _naming_os_errors(run_dir: Path, doing: str, outcome: str):
    """Re-raise an OSError of the block as an OSError of the same errno (and class) whose message
    names the run folder, what was being done to which file, and what was left: ``compact A B C``
    must say which run a full disk stopped, and ``errno`` still tells the cause."""
    try:
        yield
    except OSError as err:
        raise _named(run_dir, doing, outcome, err) from err


def _named(run_dir: Path, doing: str, outcome: str, err: OSError) -> OSError:
    """``err`` as :func:`_naming_os_errors` re-raises it (``OSError(errno, ...)`` is the
    errno's subclass: FileNotFoundError, PermissionError ...)."""
    message = f"{run_dir}: {doing} failed: {err.strerror or err}; {outcome}"
    return OSError(err.errno, message) if err.errno is not None else OSError(message)


def _flock(fd: int, operation: int) -> bool:
    """``fcntl.flock(fd, operation)``; False where the filesystem has no flock (:data:`_NO_FLOCK`).
    BlockingIOError (held elsewhere, with LOCK_NB) and other OSErrors propagate."""
    try:
        fcntl.flock(fd, operation)
    except BlockingIOError:
        raise
    except OSError as err:
        if err.errno in _NO_FLOCK:
            return False
        raise
    return True


@contextmanager
def _compaction_lock(run_dir: Path):
    """Hold the run's compaction lock (an exclusive flock on :data:`LOCK_NAME`, waiting for a
    compaction that holds it) for the block; the file is removed at the end.

    The file is removed while still locked, so a compaction waiting on it wakes holding a
    removed file: it checks that the path still names the file it locked, and takes the lock
    anew where not, so two compactions never both hold one."""
    path = run_dir / LOCK_NAME
    with _naming_os_errors(run_dir, f"locking {LOCK_NAME}", "nothing was changed"):
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if not _flock(fd, fcntl.LOCK_EX):
                    break  # no flock here: unserialised
                try:
                    if os.path.samestat(os.fstat(fd), os.stat(path)):
                        break
                except FileNotFoundError:
                    pass
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the compaction before removed the file this one waited on
    try:
        yield
    finally:
        try:
            os.unlink(path)  # still locked: a compaction waiting on this file retries on a new one
        except FileNotFoundError:
            pass
        os.close(fd)


@contextmanager
def _not_being_written(run_dir: Path, csv_path: Path):
    """Yield whether rows.csv exists, holding a shared flock on it for the block (a writer cannot
    begin on it meanwhile); CompactError naming the run when its writer holds it (the run is
    open: see the module docstring)."""
    try:
        fd = os.open(csv_path, os.O_RDONLY)
    except FileNotFoundError:
        yield False
        return
    except OSError as err:
        raise _named(run_dir, f"opening {csv_path.name}", "nothing was changed", err) from err
    try:
        try:
            _flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CompactError(f"{run_dir}: the run is still being written (its writer, a live process, holds "
                               f"{csv_path.name} locked); it is compacted when it ends, nothing was changed") from None
        except OSError as err:
            raise _named(run_dir, f"locking {csv_path.name}", "nothing was changed", err) from err
        yield True
    finally:
        os.close(fd)
