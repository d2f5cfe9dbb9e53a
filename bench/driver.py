"""The one run lifecycle: expand a suite into cells, measure them, write the run, print the table.

Every scenario (:mod:`bench.scenarios`) runs through :func:`run`:

1. The suite is expanded into cells (:meth:`Scenario.cells`) and the command line's run id
   and options are checked. Any error is raised here, as :class:`SelectionError`, before the
   run folder exists.
2. ``<out>/<run_id>/`` is created by :class:`bench.results.RunWriter`, whole (a Ctrl-C there
   lands once meta.json and rows.csv's header are written); meta.json holds the
   suite, the selection, git state, machine and library facts, the scenario's own entries and
   the suite's ``paper`` and ``targets`` ({} when it has none), with ``complete: false``.
3. Cells are measured one at a time under a tqdm bar (shown when there is more than one
   cell). A cell with a ``skip`` reason becomes one row of its ``skip_status`` without being
   run; a cell whose :meth:`Scenario.measure` raises becomes one ``failed`` row with the error,
   and the run goes on. Each cell's rows are appended to rows.csv (flushed and fsync'ed) as
   soon as it ends, and meta.json is rewritten, so a crash or Ctrl-C keeps every finished cell;
   a long cell may hand over rows as it goes (``RunState.write``: a training run's episodes),
   which are kept too.
4. At the end meta.json gets ``complete``, ``interrupted``, ``end_time`` and the counts
   ``items_total``, ``items_done`` and ``items_by_status`` (one item = one cell); on Ctrl-C
   or SIGTERM (:func:`interrupt_latch`), at any point once the folder exists, ``complete`` is
   false, ``interrupted`` true, and KeyboardInterrupt is raised again after the counts are
   written: an interrupted run is always readable and marked.
   A Ctrl-C that a finalizer swallowed (:class:`InterruptLatch`) ends the run at the cell's
   next write of rows (a partial one, or its end).
   When rows.csv or meta.json cannot be written (a full disk), the run stops: what is on disk
   stays (at most the batch being written is lost), meta.json keeps ``complete: false`` (and
   gets ``write_error`` if it can still be written), and
   :class:`~bench.results.ResultsWriteError` is raised, naming the file.
5. The run's lines and the scenario's table (:func:`format_summary`) of the rows read back
   from rows.csv are printed, then the folder. ``replaybench summary <run>`` prints the same
   for a stored run (:func:`summarize_run`).

Composite suites (``{"name": ..., "suites": [...]}``) run their sub-suites in order
(:func:`run_suites`), each into its own folder ``<run_id>-<sub-suite name>``, after every
sub-suite has been expanded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from replaybench.bench import arguments, contract, derive, results, suites, summary
from replaybench.bench.scenarios import OPTIONS, Cell, RunState, Scenario, Selection, SelectionError, load

__all__ = ["Plan", "plan", "execute", "run", "run_suites", "format_summary", "summarize_run", "InterruptLatch",
           "interrupt_latch"]


class InterruptLatch:
    """The SIGINT (and SIGTERM) handler of a run: it raises KeyboardInterrupt as Python's
    default SIGINT handler does,
    and also remembers the signal, because Python prints and drops an exception raised inside
    a finalizer (a weakref callback or ``__del__`` that the garbage collector runs when the
    signal lands): such a Ctrl-C would be lost and the run would go on to the end. Every write
    of rows ends in :meth:`check`, so a swallowed Ctrl-C still ends the run at the cell's next
    write (a partial one, or its end).

    Inside :meth:`deferred` the signal is only remembered, and raised as KeyboardInterrupt at
    the block's end. The driver wraps "append a cell's rows, count them, rewrite meta.json" in
    it, so a Ctrl-C cannot land inside the append (whose fsync would then cut rows a reader
    already saw off the file) or between the append and the count (a cell on disk but not
    counted): what is on disk is what is counted.
    """

    def __init__(self):
        self.seen = False
        self._deferring = 0

    def __call__(self, signum, frame) -> None:
        self.seen = True
        if not self._deferring:
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise KeyboardInterrupt if a SIGINT arrived since the latch was installed."""
        if self.seen:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self):
        """Hold a SIGINT that arrives inside the block; raise KeyboardInterrupt right after it."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if not self._deferring:
            self.check()


#: The signals that interrupt a run, each with the handler under which the latch takes it over:
#: Ctrl-C, and SIGTERM (``kill``, a job scheduler, ``docker stop``), which by default ends the
#: process at once, before any ``finally``: a run so ended was never marked.
_INTERRUPTS = ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL))


@contextlib.contextmanager
def interrupt_latch():
    """Install an :class:`InterruptLatch` as the handler of SIGINT and SIGTERM for the block and
    yield it; the previous handlers are put back after. Either signal ends the run the same
    way (KeyboardInterrupt: the run is marked interrupted, its processes and temporary files
    cleaned up). Off the main thread (where no handler can be set) the latch is yielded without
    being installed: it never trips, and the block runs as it would without it; a signal
    whose handler is not Python's default one (the caller's own) is left to it."""
    latch = InterruptLatch()
    if threading.current_thread() is not threading.main_thread():
        yield latch
        return
    installed = {}
    try:
        for signum, default in _INTERRUPTS:
            if signal.getsignal(signum) == default:
                installed[signum] = signal.signal(signum, latch)
        yield latch
    finally:
        for signum, previous in installed.items():
            signal.signal(signum, previous)


@dataclass(frozen=True)
class Plan:
    """A suite expanded and checked: its scenario and cells, ready to :func:`execute`.
    ``selection`` holds only the options the scenario honours."""

    suite: dict
    scenario: Scenario
    cells: list[Cell]
    selection: Selection


def plan(suite: dict, selection: Selection = Selection(), *, ignore: tuple = ()) -> Plan:
    """Expand a (non-composite) suite into cells; SelectionError if it cannot run.

    An option the scenario does not honour is refused, unless named in ``ignore`` (a
    composite suite runs it in the sub-suites that take it).
    """
    scenario = load(suite.get("scenario"))
    scenario.check_keys(suite)  # a misspelt key would otherwise be ignored and the default grid run
    refused = [OPTIONS[o] for o in selection.given() if o not in scenario.takes and o not in ignore]
    if refused:
        takes = ", ".join(OPTIONS[o] for o in OPTIONS if o in scenario.takes) or "no selection options"
        raise SelectionError(f"suite {suite['name']!r} (scenario {scenario.name}) does not take "
                             f"{', '.join(refused)}; it takes {takes}")
    narrowed = Selection(**{o: getattr(selection, o) for o in OPTIONS if o in scenario.takes})
    return Plan(suite, scenario, scenario.cells(suite, narrowed), narrowed)


def _meta(p: Plan, machine: str, command) -> dict:
    git = results.git_state()
    s = p.selection
    return {"scenario": p.scenario.name, "suite": p.suite,
            "selection": {"variants": s.variants, "capacities": s.capacities, "ops": s.ops, "params": s.params,
                          "settings": s.settings},
            "command": list(command or sys.argv), "cwd": os.getcwd(),
            "git_sha": git["sha"], "dirty": git["dirty"], "machine_label": machine,
            "machine": results.machine_info(), "libraries": results.library_versions(),
            "cache_miss_method": None,  # the cache scenario says which method measured
            **p.scenario.meta(p.suite, p.selection, p.cells),
            # what the analysis compares with, as data of the run: the suite's paper figures and targets
            **{kind: p.suite.get(kind) or {} for kind in derive.RECORDED_KINDS}}


def _run_exists(out, run_id: str) -> SelectionError:
    path = Path(out) / run_id
    what = "is a symbolic link" if path.is_symlink() else "exists already (another run may have just made it)"
    return SelectionError(f"--run-id {run_id!r}: {path} {what}; choose another id or remove it")


def execute(p: Plan, *, out="results", run_id: str | None = None, machine: str | None = None,
            progress: bool = True, command=None, echo=print) -> Path:
    """Measure a plan's cells into ``<out>/<run_id>/`` (the lifecycle in the module docstring).

    Returns the run folder. Raises ValueError for a malformed ``run_id`` or an ``out`` that
    cannot hold a folder (a file on its path: :func:`bench.arguments.check_out_dir`) and
    SelectionError for a run id whose folder exists, all before creating anything,
    KeyboardInterrupt after recording what finished when interrupted, and
    :class:`~bench.results.ResultsWriteError` when the run's files cannot be written (what
    was written stays, marked incomplete).
    """
    from tqdm import tqdm

    arguments.check_out_dir(out)
    run_id = arguments.check_run_id(run_id) if run_id is not None else results.new_run_id(p.suite["name"])
    if os.path.lexists(Path(out) / run_id):  # a run folder is written once: never mix two runs' rows
        raise _run_exists(out, run_id)
    machine = machine or results.machine_info()["hostname"]
    meta = _meta(p, machine, command)  # before the folder: a Ctrl-C up to here leaves nothing
    counts = {s: 0 for s in results.STATUSES}
    writer = bar = None

    def finish(complete: bool, **extra) -> None:
        writer.finish(complete, interrupted=not complete, items_total=len(p.cells), items_done=sum(counts.values()),
                      items_by_status=counts, **extra)

    with interrupt_latch() as latch:  # a Ctrl-C that a finalizer swallows still ends the run at the next write
        def write_partial(rows: list[dict]) -> None:
            with latch.deferred():
                writer.append([{**row, **stamp} for row in rows])

        try:
            with latch.deferred():  # the folder is made whole (meta.json, rows.csv's header) or not at all
                try:
                    # RunWriter makes the folder with one mkdir that fails if anything has the name:
                    # of two runs started together with one id, the second is refused here
                    writer = results.RunWriter(out, run_id, meta)
                except FileExistsError:
                    raise _run_exists(out, run_id) from None
            # the run's own columns, on every row whatever the scenario wrote
            stamp = {"schema_version": results.SCHEMA_VERSION, "run_id": run_id, "git_sha": writer.meta["git_sha"],
                     "dirty": writer.meta["dirty"], "machine": machine, "scenario": p.scenario.name}
            bar = tqdm(p.cells, desc=p.suite["name"], unit=p.scenario.unit,
                       disable=not progress or len(p.cells) < 2, dynamic_ncols=True)
            run = RunState(writer.raw_dir, writer.meta, progress, bar, len(p.cells), write=write_partial)
            for cell in bar:
                bar.set_postfix_str(cell.label)
                if cell.skip:
                    rows = [cell.row(cell.skip_status, cell.skip)]
                else:
                    try:
                        rows = p.scenario.measure(cell, run) or [cell.row("failed", "the scenario measured no rows")]
                    except results.ResultsWriteError:
                        raise  # the disk, not the cell: recording it would fail the same way
                    except Exception as err:  # one failing cell is recorded and the run goes on
                        rows = [cell.row("failed", f"{type(err).__name__}: {err}"[-4000:])]
                rows = [{**row, **stamp} for row in rows]
                status = rows[0]["status"]
                with latch.deferred():  # a Ctrl-C here lands after the counts match the disk
                    writer.append(rows)  # whole on disk, or not at all
                    counts[status] = counts.get(status, 0) + 1
                    writer.write_meta()
        except KeyboardInterrupt:
            if writer is None:
                raise  # the folder was not made: nothing to mark
            if bar is not None:
                bar.close()
            latch.seen = False  # a second Ctrl-C now lands after the mark, not inside its write
            with latch.deferred():
                finish(False)
            echo(f"interrupted: kept {sum(counts.values())} of {len(p.cells)} cells in {writer.dir}")
            raise
        except results.ResultsWriteError as err:
            if writer is None:
                raise
            if bar is not None:
                bar.close()
            try:
                finish(False, write_error=str(err))
            except results.ResultsWriteError:
                pass  # meta.json on disk still says complete: false
            raise
    bar.close()
    finish(True)
    rows = results.read_rows(writer.dir)
    echo("\n".join([*summary.format_header(writer.meta), p.scenario.summarize(rows, writer.meta)]))
    echo(f"\nResults: {writer.dir}")
    return writer.dir


def format_summary(rows: list[dict], meta: dict) -> str:
    """A stored run as text, as :func:`execute` printed it when it ended: its lines
    (:func:`bench.summary.format_header`: id, state, git, machine, pyperf's settings where
    pyperf timed it), then its scenario's table (:meth:`Scenario.summarize`; the scenario
    ``meta`` or the rows name). A run whose rows its scenario's table cannot read (stored with
    an older set of columns: the table raises KeyError, TypeError or ValueError), or whose
    scenario is not known here, gets the generic table (:meth:`Scenario.summarize`'s default)
    under a line saying why. Cost: the table's."""
    name = meta.get("scenario") or next((r.get("scenario") for r in rows if r.get("scenario")), None)
    head = summary.format_header(meta)
    try:
        scenario = load(name)
    except SelectionError as err:
        why = str(err)
    else:
        try:
            return "\n".join([*head, scenario.summarize(rows, meta)])
        except (KeyError, TypeError, ValueError) as err:
            why = f"the {scenario.name} table cannot read these rows ({type(err).__name__}: {err})"
    return "\n".join([*head, f"{why}; the generic table instead:", Scenario().summarize(rows, meta)])


def summarize_run(run_dir) -> str:
    """:func:`format_summary` of a stored run folder (rows.csv, and meta.json when there is one):
    what ``replaybench summary`` prints. Raises :class:`bench.contract.RunError`, naming the
    file and line, when rows.csv or meta.json breaks the results contract."""
    run_dir = Path(run_dir)
    meta = contract.read_meta(run_dir) if (run_dir / "meta.json").exists() else {}
    return format_summary(contract.read_rows(run_dir), meta)


def run(suite: dict, selection: Selection = Selection(), **kwargs) -> Path:
    """:func:`plan` then :func:`execute` a non-composite suite; keyword arguments go to execute."""
    return execute(plan(suite, selection), **kwargs)


def run_suites(suite: dict, selection: Selection = Selection(), *, run_id: str | None = None,
               echo=print, **kwargs) -> list[Path]:
    """Run a suite, or each sub-suite of a composite one, in order; returns the run folders.

    Every sub-suite is expanded before the first runs, so a bad selection is refused before
    any work. An option that no sub-suite takes is refused; one that only some take is used
    by those, and a note names the others. Keyword arguments go to :func:`execute`.
    """
    if run_id is not None:
        arguments.check_run_id(run_id)
    if "suites" not in suite:
        return [execute(plan(suite, selection), run_id=run_id, echo=echo, **kwargs)]
    try:
        subs = [suites.load(name) for name in suite["suites"]]
    except ValueError as err:  # an unknown or malformed sub-suite
        raise SelectionError(f"suite {suite['name']!r}: {err}") from None
    scenarios = [load(s.get("scenario")) for s in subs]
    given = selection.given()
    nobody = [OPTIONS[o] for o in given if not any(o in sc.takes for sc in scenarios)]
    if nobody:
        raise SelectionError(f"no suite of {suite['name']!r} takes {', '.join(nobody)}")
    plans = [plan(s, selection, ignore=tuple(given)) for s in subs]
    for p in plans:
        ignored = [OPTIONS[o] for o in given if o not in p.scenario.takes]
        if ignored:
            echo(f"note: suite {p.suite['name']!r} (scenario {p.scenario.name}) does not take "
                 f"{', '.join(ignored)}: it runs as its suite declares, the others as asked")
    out = [execute(p, run_id=f"{run_id}-{p.suite['name']}" if run_id else None, echo=echo, **kwargs) for p in plans]
    headline = summary.format_headline(out)
    if headline:
        echo("\n" + headline)
    return out
