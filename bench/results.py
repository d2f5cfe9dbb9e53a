"""Results of one run: ``results/<run_id>/`` with rows.csv (rows.parquet once the run has ended:
:mod:`bench.rowstore`), meta.json and the raw pyperf JSON.

rows.csv is tidy: one row per measured value (a pyperf value: seconds per call, averaged over
that value's loops), or one row per grid item that produced no value (status ``failed``,
``skipped`` or ``unavailable``, with the error). Its columns, types and statuses, and how it is
read and checked, are the results contract (:mod:`bench.contract`); this module writes runs.
Metrics such as throughput are computed when reading, never stored.

pyperf/ holds each item's pyperf JSON (``<variant>__<capacity>__<op>.json``) and, for an item
whose set-up raised, ``...error.txt`` with the traceback.

meta.json describes the run: machine (CPU model, cores, caches), library versions, git state,
command line, suite, start and end time, and ``complete`` (false until the whole grid has run,
so an interrupted run says so).

meta.json is replaced atomically (temp file in the same folder + os.replace), so a reader or
a crash never sees half of it. rows.csv is appended to: each batch of rows (a grid item's, or
what a long item hands over as it goes: a training run's episodes every progress interval) is
written, flushed and fsync'ed at once, so rows reach the disk as the run goes, a write costs
the batch and not the whole file, and a failure (a full disk, an interrupt) loses at most the
batch being written: the file is cut back to its last whole batch, so it never holds half a
row. Such a failure raises :class:`ResultsWriteError`; meta.json keeps ``complete: false``.
When the run ends, :meth:`RunWriter.finish` compacts rows.csv into rows.parquet (checked equal
before the CSV is removed), complete or interrupted alike.
Every row is checked by the contract's :func:`~bench.contract.parse_row` before it is written,
so a run on disk always passes the readers' checks.

While the run is open its writer holds an exclusive ``flock`` on rows.csv (taken when the file
is created, given up by :meth:`RunWriter.finish`): the mark of a live writer, by which
``replaybench compact`` refuses an open run (:mod:`bench.compaction`). The kernel drops it when
the writer's process dies, however it dies, so a crashed run is never left marked open (a
recorded pid and host could be stale, or name a reused pid), and no lock file of its own is
left in the folder. A process the writer forks closes its copy of the lock at once, so that a
child outliving the writer does not keep the run open.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import os
import platform
import re
import subprocess
import sys
import weakref
from datetime import datetime, timezone
from pathlib import Path

from replaybench.bench import atomic_file, compaction
from replaybench.bench.contract import COLUMNS, SCHEMA_VERSION, STATUSES, format_cell, parse_row, read_meta, read_rows
from replaybench.impl.machine import cpu_model, cpu_quota, logical_cores, usable_cores

# The schema names and the readers are the contract's (bench.contract); they are named here too
# because every scenario writes and reads its run through this module.
__all__ = ["SCHEMA_VERSION", "COLUMNS", "STATUSES", "RunWriter", "ResultsWriteError", "atomic_write_text",
           "new_run_id", "git_state",
           "machine_info", "library_versions", "read_rows", "read_meta"]

REPO_ROOT = Path(__file__).resolve().parent.parent


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same folder and os.replace."""
    atomic_file.write_text(path, text)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_id(suite: str) -> str:
    """``<UTC timestamp>-<suite>``, sortable by time."""
    return f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{suite}"


class ResultsWriteError(OSError):
    """rows.csv or meta.json of a run could not be written (a full disk, a folder gone).

    The run folder keeps every batch of rows written before, whole, and meta.json says
    ``complete: false`` (from its last successful write). ``path`` is the file; the message
    names it, the error, and how many rows are on disk.
    """

    def __init__(self, path: Path, err: OSError, rows_on_disk: int):
        super().__init__(f"could not write {path}: {err.strerror or err}; {rows_on_disk} row(s) written before "
                         "are kept and the run is marked incomplete")
        self.errno = err.errno
        self.path = path
        self.rows_on_disk = rows_on_disk


#: The rows.csv locks (open-run marks) this process holds: descriptor -> its release.
_ROWS_LOCKS: dict[int, weakref.finalize] = {}


def _release_rows_lock(fd: int) -> None:
    """Give up a run's open mark: unlock (for every copy of the descriptor) and close."""
    _ROWS_LOCKS.pop(fd, None)
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _forget_inherited_rows_locks() -> None:
    """In a forked child: close the child's copies of the parent's rows.csv locks. A flock lives
    as long as any copy of its descriptor, so a child (a worker, a reaper) that outlived a
    crashed writer would otherwise keep the run marked open; the parent's copy still holds it.
    The child's writers do not release it (their release is detached)."""
    for fd, release in list(_ROWS_LOCKS.items()):
        release.detach()
        try:
            os.close(fd)
        except OSError:
            pass
    _ROWS_LOCKS.clear()


os.register_at_fork(after_in_child=_forget_inherited_rows_locks)


class RunWriter:
    """Owns one run folder: meta.json at start, after each grid item and at the end; rows.csv
    appended to batch by batch (:meth:`append`), locked as open from its creation until
    :meth:`finish` (see the module docstring; a writer dropped without finish releases it when
    collected, as a dead process does).

    Cost of :meth:`append`: the batch's formatting and check, one write and one fsync.
    Thread-safety: none (the driver's one thread writes).
    """

    def __init__(self, out_dir, run_id: str, meta: dict, *, compact: bool = True):
        self.run_id = run_id
        self.compact = compact  # False: the rows stay in rows.csv at the end (tests of the CSV reader)
        self.dir = Path(out_dir) / run_id
        self.dir.mkdir(parents=True, exist_ok=False)
        self.raw_dir = self.dir / "pyperf"
        self.raw_dir.mkdir()
        self.meta = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "start_time": _now(), "end_time": None,
                     "complete": False, **meta}
        self.n_rows = 0
        self._rows_path = self.dir / "rows.csv"
        self._rows_bytes = 0  # length of rows.csv up to its last whole batch
        self.write_meta()
        self._open_mark = self._mark_open()  # creates rows.csv, locked, before its header is written
        header = io.StringIO()
        csv.writer(header, lineterminator="\n").writerow(COLUMNS)
        self._write_rows(header.getvalue(), 0)

    def _mark_open(self) -> weakref.finalize | None:
        """Create rows.csv (empty) and take the exclusive flock that marks the run open; the
        release that :meth:`finish` calls (None on a filesystem without flock, where the run is
        not marked). Blocks only while a compaction's probe holds the new file: that compaction
        then finds it empty and refuses it (:func:`bench.compaction.compact`)."""
        try:
            fd = os.open(self._rows_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as err:
            raise ResultsWriteError(self._rows_path, err, 0) from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                return None
            raise ResultsWriteError(self._rows_path, err, 0) from err
        except BaseException:
            os.close(fd)
            raise
        release = weakref.finalize(self, _release_rows_lock, fd)
        _ROWS_LOCKS[fd] = release
        return release

    def write_meta(self) -> None:
        """Replace meta.json atomically with :attr:`meta`; ResultsWriteError when it cannot be."""
        path = self.dir / "meta.json"
        try:
            atomic_write_text(path, json.dumps(self.meta, indent=2, sort_keys=True, default=str) + "\n")
        except OSError as err:
            raise ResultsWriteError(path, err, self.n_rows) from err

    def _write_rows(self, text: str, n: int) -> None:
        """Append ``text`` (``n`` whole rows) to rows.csv, flushed and fsync'ed; on any failure
        (or an interrupt) cut the file back to its last whole batch and raise."""
        data = text.encode()
        try:
            fd = os.open(self._rows_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as err:
            raise ResultsWriteError(self._rows_path, err, self.n_rows) from err
        try:
            try:
                view = memoryview(data)
                while view:  # os.write may write less than asked
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except BaseException as err:
                try:
                    os.ftruncate(fd, self._rows_bytes)  # frees blocks: works on a full disk
                except OSError:
                    pass
                if isinstance(err, OSError):
                    raise ResultsWriteError(self._rows_path, err, self.n_rows) from err
                raise
        finally:
            os.close(fd)
        self._rows_bytes += len(data)
        self.n_rows += n

    def append(self, rows: list[dict]) -> None:
        """Add rows (dicts keyed by column; missing columns are empty) at the end of rows.csv,
        on disk (fsync'ed) when this returns.

        Raises
        ------
        KeyError
            for a column not in :data:`COLUMNS`;
        ValueError
            for a row the results contract refuses (unknown status, a number column holding
            text, an ``ok`` value that is NaN, infinite or negative ...), naming the row and the
            value. Nothing of the batch is written then.
        ResultsWriteError
            when the file cannot be written (a full disk): nothing of the batch stays in it,
            every earlier batch does.
        """
        batch = io.StringIO()
        writer = csv.writer(batch, lineterminator="\n")
        for row in rows:
            unknown = set(row) - set(COLUMNS)
            if unknown:
                raise KeyError(f"unknown result columns {sorted(unknown)}")
            fields = [format_cell(row.get(c)) for c in COLUMNS]
            try:
                parse_row(COLUMNS, fields)  # the readers' own check, so no reader refuses what is written
            except ValueError as err:
                raise ValueError(f"result row ({row.get('variant')} {row.get('op')} {row.get('metric')}) breaks "
                                 f"the results contract: {err}") from None
            writer.writerow(fields)
        self._write_rows(batch.getvalue(), len(rows))

    def finish(self, complete: bool, **extra) -> None:
        """Write the final meta.json: ``complete``, ``end_time`` and ``extra``
        (ResultsWriteError when it cannot be written: the last one written stays); give up the
        open mark on rows.csv (even then: this writer writes nothing more); then compact the
        rows into rows.parquet (:func:`bench.compaction.compact`). A compaction that cannot
        be made (no pyarrow, a full disk) leaves rows.csv as it is, says so on stderr, and is
        not an error: the run is whole and ``replaybench compact`` converts it later."""
        self.meta.update(extra, end_time=_now(), complete=bool(complete))
        try:
            self.write_meta()
        finally:
            if self._open_mark is not None:
                self._open_mark()  # the run is closed: compaction may take it (a second call does nothing)
        if not self.compact:
            return
        try:
            compaction.compact(self.dir, missing_ok=True)
        except OSError as err:
            print(f"note: {self.dir} keeps its rows.csv (compacting it failed: {err}); "
                  f"`replaybench compact {self.dir}` converts it later", file=sys.stderr)



def _run(cmd: list[str], cwd=None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state(root: Path = REPO_ROOT) -> dict:
    """``{"sha": ..., "dirty": ...}`` of the checkout holding the code; None when not a git tree.

    ``dirty``: a change to the code, tracked or new, outside results/: the runs a run (or the
    earlier parts of a composite suite) writes there are measurements, not code.

    A copy of a checkout without its .git (the device machine's, ../shared/device/README.md)
    takes both from ``REPLAYBENCH_GIT_SHA`` and ``REPLAYBENCH_GIT_DIRTY`` ("0" or "1"), which
    whoever made the copy read from the checkout it copied; unset, both are None."""
    sha = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if sha is None:
        stated = os.environ.get("REPLAYBENCH_GIT_SHA") or None
        dirty = {"0": False, "1": True}.get(os.environ.get("REPLAYBENCH_GIT_DIRTY", ""))
        return {"sha": stated, "dirty": dirty if stated else None}
    status = _run(["git", "status", "--porcelain", "--", ".", ":(exclude)results"], cwd=root)
    return {"sha": sha.strip(), "dirty": None if status is None else bool(status.strip())}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _caches() -> list[dict]:
    """CPU 0's caches from /sys (level, type, size, line size, sharing)."""
    out = []
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        entry = {key: _read(index / name) for key, name in (
            ("level", "level"), ("type", "type"), ("size", "size"), ("line_size", "coherency_line_size"),
            ("ways", "ways_of_associativity"), ("shared_cpu_list", "shared_cpu_list"))}
        out.append(entry)
    return out


def _lscpu() -> dict:
    text = _run(["lscpu"]) or ""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def machine_info() -> dict:
    """CPU model, core counts, caches, memory and OS, from lscpu, /proc and /sys."""
    lscpu = _lscpu()
    model = lscpu.get("Model name")
    if model is None:
        model = cpu_model()
    mem = _read(Path("/proc/meminfo")) or ""
    match = re.search(r"^MemTotal:\s*(\d+) kB", mem, re.M)
    return {
        "hostname": platform.node(),
        "cpu_model": model,
        "logical_cpus": logical_cores(),
        "usable_cpus": usable_cores(),
        "cpu_quota": cpu_quota(),
        "cores_per_socket": lscpu.get("Core(s) per socket"),
        "threads_per_core": lscpu.get("Thread(s) per core"),
        "sockets": lscpu.get("Socket(s)"),
        "hypervisor": lscpu.get("Hypervisor vendor"),
        "caches": _caches(),
        "caches_lscpu": {k: v for k, v in lscpu.items() if k.endswith(" cache")},
        "mem_total_bytes": int(match.group(1)) * 1024 if match else None,
        "os": platform.platform(),
    }


def library_versions() -> dict:
    """Versions of the libraries that shape the numbers (None when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0], "python_implementation": platform.python_implementation()}
    for dist in ("numpy", "numba", "llvmlite", "pyperf", "cpprb", "tqdm", "replaybench"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out
