"""Scenarios: what a suite measures, behind one small interface that the driver runs.

A scenario turns a suite (its JSON) into *cells*, measures one cell into result rows, and
turns the rows of a run into a table. Everything else about a run -- the run folder and its
writer, meta.json, the progress bar, Ctrl-C, failed and skipped rows, the final table -- is
the driver's (:mod:`bench.driver`), the same for every scenario.

Finding a scenario: a suite names it with ``"scenario"``: a module of this folder (``micro``,
``cache``, ``concurrency``, ``training``: :func:`names` lists them by scanning the folder, so a
new scenario is one module here plus one suite JSON, with no list to edit), or else the import
path of a module elsewhere (``"my_pkg.my_scenario"``, importable from ``sys.path``). Either
module defines ``SCENARIO``, an instance of a :class:`Scenario` subclass, whose ``name`` fills
the rows' ``scenario`` column.

docs/extending.md shows a complete one (examples/sleep_scenario.py), which the tests run;
tests/toy/toy_sort.py is a fuller one (failed and skipped cells, an interrupted run).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import os
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replaybench.bench.suites import COMMON_KEYS
from replaybench.registry import Registry

__all__ = ["Scenario", "Cell", "Selection", "RunState", "SelectionError", "suite_errors", "check_suite_keys",
           "OPTIONS", "names", "load", "check_memory"]


class SelectionError(ValueError):
    """A suite or a selection that cannot run (unknown variant, op or scenario; a value no
    variant can take; an option the scenario does not honour). Raised while expanding the
    suite, before anything is created or measured; the message names the option and value."""


@contextlib.contextmanager
def suite_errors(suite: dict):
    """Inside, expand ``suite``: a KeyError (a key the suite lacks), TypeError or ValueError
    (a value of the wrong kind) becomes a :class:`SelectionError` naming the suite and what
    is wrong, raised from None (the traceback of the expansion is no help to the user)."""
    try:
        yield
    except KeyError as err:
        raise SelectionError(f"suite {suite['name']!r} lacks {err.args[0]!r}") from None
    except (TypeError, ValueError) as err:
        raise SelectionError(f"suite {suite['name']!r}: {err}") from None


def check_suite_keys(suite: dict, known, where: str) -> None:
    """SelectionError naming the first key of ``suite`` not in ``known`` and the known key
    nearest to it (``difflib``: a typo such as "backend" for "backends"), else every known key;
    a suite with such a key would otherwise run its default grid, the key silently ignored."""
    for key in sorted(set(suite) - set(known), key=str):
        near = difflib.get_close_matches(str(key), sorted(known), n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(sorted(known))}"
        raise SelectionError(f"{where}: unknown key {key!r}; {hint}")


#: The run-wide options a scenario may honour, by :class:`Selection` field, with the flag that sets each.
OPTIONS = {"variants": "--variants", "capacities": "--capacities", "ops": "--ops", "params": "--param",
           "settings": "--processes/--values/--warmups/--loops/--min-time"}


@dataclass(frozen=True)
class Selection:
    """What the command line narrows or overrides; None (or empty) = the suite's own.

    ``params`` maps a grid key to its values (``--param K=2,4``); ``settings`` holds pyperf
    settings by name (``{"processes": 1}``).
    """

    variants: list[str] | None = None
    capacities: list[int] | None = None
    ops: list[str] | None = None
    params: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def given(self) -> list[str]:
        """The fields the command line set, in :data:`OPTIONS` order."""
        return [name for name in OPTIONS if getattr(self, name)]


@dataclass(frozen=True)
class Cell:
    """One unit of measurement: what the progress bar counts and Ctrl-C never splits.

    ``columns`` are the result columns every row of the cell shares (variant, structure,
    policy, capacity, op, metric, unit, ...); the driver makes the cell's ``failed`` row, or its
    ``skip_status`` row when ``skip`` gives a reason not to run it, from them. ``spec`` is the
    scenario's own description of the work, handed back to :meth:`Scenario.measure`.
    """

    label: str
    columns: dict
    spec: Any = None
    skip: str = ""
    skip_status: str = "skipped"  # or "unavailable" (a missing library), "failed" (a plug-in that did not load)

    def row(self, status: str, error: str | None = None, **values) -> dict:
        """One row of this cell: its columns, then ``values``, with ``status`` and ``error``."""
        return {**self.columns, **values, "status": status, "error": error}


@dataclass
class RunState:
    """What a scenario's :meth:`~Scenario.measure` may use of the run in progress.

    ``raw_dir``: a folder for raw files (pyperf JSON, error logs). ``meta``: meta.json's
    contents; keys a scenario sets here are written after the cell. ``progress``: whether bars
    are shown; ``bar``: the driver's tqdm bar over cells (a scenario may set its postfix).
    ``cells``: how many cells the run has. ``state``: the scenario's own notes across cells
    (a baseline measured in an earlier cell, say). ``write(rows)``: put rows of the cell being
    measured on disk now (rows.csv, appended and fsync'ed; stamped with the run's columns like
    the rows :meth:`~Scenario.measure` returns), for a long cell whose rows come as it goes (a
    training run's episodes): a failure or a full disk at the end then loses at most what came
    after the last call. Rows written so are kept whatever the cell ends with; the cell is
    counted done only when :meth:`~Scenario.measure` returns. Raises
    :class:`bench.results.ResultsWriteError` when they cannot be written.
    """

    raw_dir: Path
    meta: dict
    progress: bool
    bar: Any
    cells: int
    state: dict = field(default_factory=dict)
    write: Any = None


class Scenario:
    """The interface the driver runs. Subclasses set :attr:`name` and implement
    :meth:`cells` and :meth:`measure`; the rest has defaults.

    Contract: :meth:`cells` checks everything (suite shape, selection, every grid value) and
    raises :class:`SelectionError` before anything runs; :meth:`measure` may raise any
    Exception, which becomes the cell's ``failed`` row while the run goes on; KeyboardInterrupt
    must leave no process behind.
    """

    #: The rows' scenario column; the module's name for scenarios in this folder.
    name: str = ""
    #: :class:`Selection` fields this scenario honours; the driver refuses the others.
    takes: frozenset = frozenset({"variants"})
    #: What the progress bar counts.
    unit: str = "cell"
    #: The suite keys this scenario reads besides :data:`bench.suites.COMMON_KEYS`: the driver
    #: refuses any other key (:meth:`check_keys`). None (a scenario that declares none): no check.
    suite_keys: frozenset | None = None

    def check_keys(self, suite: dict) -> None:
        """SelectionError naming a key of ``suite`` that this scenario does not read, and the
        nearest it does (:func:`check_suite_keys`). Run by the driver before :meth:`cells`."""
        if self.suite_keys is not None:
            check_suite_keys(suite, self.suite_keys | COMMON_KEYS,
                             f"suite {suite.get('name')!r} (scenario {self.name})")

    def cells(self, suite: dict, selection: Selection) -> list[Cell]:
        """The suite's grid as cells, in the order they are measured."""
        raise NotImplementedError

    def meta(self, suite: dict, selection: Selection, cells: list[Cell]) -> dict:
        """Scenario-specific meta.json entries (how values were timed, versions, ...)."""
        return {}

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        """The rows of one cell (at least one), each with a status."""
        raise NotImplementedError

    def summarize(self, rows: list[dict], meta: dict) -> str:
        """The table printed after a run, from its rows as read back from rows.csv.

        Default: one line per (variant, capacity, op, metric, status) with the median value
        and the number of rows, and the error of rows that were not measured.
        """
        import statistics

        from replaybench.bench.summary import format_table

        keys = ("variant", "capacity", "op", "metric", "unit", "status")
        groups: dict[tuple, list[dict]] = {}
        for r in rows:
            groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
        body = []
        for (variant, capacity, op, metric, unit, status), mine in groups.items():
            values = [r["value"] for r in mine if r.get("value") is not None]
            median = f"{statistics.median(values):.4g}" if values else "-"
            body.append([str(x if x is not None else "-") for x in (variant, capacity, op, metric)]
                        + [median, str(unit or "-"), str(len(mine)), status, (mine[0].get("error") or "")[:100]])
        header = ["variant", "capacity", "op", "metric", "median", "unit", "rows", "status", "error"]
        return "\n".join(format_table(header, body, {1, 4, 6}))


_HERE = Path(__file__).resolve().parent


def _discover() -> None:
    """Register every module of this folder but private ones, by name, without importing it
    (a scenario's module is imported when a suite names it)."""
    for m in pkgutil.iter_modules([str(_HERE)]):
        if not m.name.startswith("_"):
            SCENARIOS.register(m.name, f"{__name__}.{m.name}", origin=__name__)


#: Scenario name -> the module path that defines its ``SCENARIO``.
SCENARIOS: Registry[str] = Registry("scenario", _discover)


def names() -> list[str]:
    """The scenarios of this folder (every module but private ones)."""
    return SCENARIOS.names()


def load(name: str) -> Scenario:
    """The ``SCENARIO`` of module ``name`` of this folder, or else of the module at import path ``name``.

    Raises SelectionError for a name that is neither, or a module without a Scenario.
    """
    if not isinstance(name, str) or not name:
        raise SelectionError(f"'scenario' must name a scenario ({', '.join(names())}) or a module, got {name!r}")
    module_name = SCENARIOS.get(name) if name in SCENARIOS else name
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not (module_name == err.name or module_name.startswith(err.name + ".")):  # the module exists; an import inside failed
            raise
        raise SelectionError(f"unknown scenario {name!r}: neither one of {', '.join(names())} "
                             f"nor an importable module") from None
    scenario = getattr(module, "SCENARIO", None)
    if not isinstance(scenario, Scenario) or not scenario.name:
        raise SelectionError(f"scenario {name!r}: {module_name} defines no SCENARIO (a named Scenario instance)")
    return scenario


def check_memory(capacities: list[int], bytes_per_slot: int, option: str = "--capacities") -> None:
    """Refuse capacities whose slots alone (``capacity * bytes_per_slot``) exceed this machine's
    memory: every cell at such a capacity would fail. Raises SelectionError naming ``option``."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system that says: nothing to check against
        return
    for c in capacities:
        if c * bytes_per_slot > total:
            raise SelectionError(f"{option}: capacity {c} needs at least {c * bytes_per_slot / 2**30:.3g} GiB "
                                 f"({bytes_per_slot} B per slot); this machine has {total / 2**30:.3g} GiB")
