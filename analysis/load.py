"""Load stored runs into one table, checking each run before trusting it.

A *run* is a folder ``results/<run-id>/`` holding ``rows.csv`` and ``meta.json`` as
:mod:`bench.results` writes them. :func:`load_runs` reads any number of runs into a
:class:`Results`: one pandas DataFrame (``table``) with every column of
:data:`bench.contract.COLUMNS` (a run written before a column existed gets ``None`` there;
columns this reader does not know are dropped; a ``suite`` column names the suite that made
the run), and each run's meta.json (``metas``, keyed by run id) for the machine, caches and
suite behind the numbers.

Every check is the results contract's (:func:`bench.contract.read_frame`,
:func:`bench.contract.read_meta`), each failing with a :class:`RunError` that names the file
and, for rows.csv, the line: the files exist and meta.json is a JSON object; line 1 is a header
holding at least :data:`bench.contract.REQUIRED`; every later line has as many fields as the
header; the file is UTF-8 and its header names each column once; numbers parse by the
contract's column types, integers within 64 bits; meta.json's fields have the contract's types
(:data:`bench.contract.META_TYPES`); ``schema_version`` is not newer than
:data:`bench.contract.SCHEMA_VERSION`; ``status`` is known; an ``ok`` row holds a measurement
(finite, not negative unless its metric is signed) and a ``below-resolution`` row its bound.

One broken run does not stop the others: :func:`load_runs` records it in
``Results.problems`` and goes on; so it does with a run that would merge with one loaded
before it (the same folder by another path, or a shared run id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from replaybench.bench import contract
from replaybench.bench.contract import CELL_COLUMNS, RunError  # the contract's own objects, named for loaders' callers

__all__ = ["RunError", "Results", "machine_of", "host_of", "host_key", "find_runs", "load_run", "load_runs",
           "cache_sizes", "latest_per_cell", "CELL_COLUMNS"]


@dataclass
class Results:
    """Rows of many runs in one table, with each run's meta.json and the runs that failed to load.

    ``table``: one row per stored row, columns :data:`bench.contract.COLUMNS` (``run_id`` tells
    the runs apart); ``metas``: ``{run_id: meta dict}``; ``dirs``: ``{run_id: folder}``;
    ``problems``: one :class:`RunError` per run that could not be used or would merge with an
    earlier one (see :func:`load_runs`).
    """

    table: pd.DataFrame
    metas: dict = field(default_factory=dict)
    dirs: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)

    def machines(self) -> dict[str, str]:
        """``{run_id: machine}``: the machine each run names (:func:`machine_of`)."""
        table = self.table
        return {run_id: machine_of(meta, table.loc[table["run_id"] == run_id, "machine"])
                for run_id, meta in self.metas.items()}

    def hosts(self) -> dict[str, str]:
        """``{run_id: host}``: the host each run was made on (:func:`host_of`)."""
        return {run_id: host_of(meta) for run_id, meta in self.metas.items()}

    def by_host(self) -> list[tuple[str, "Results"]]:
        """The runs split by host (:func:`host_of`: CPU model, logical CPUs and caches, not the
        ``--machine`` label, which has named several hosts alike), one :class:`Results` each,
        in :meth:`by_machine`'s order: the host with the most runs first, the others by name.
        A table or figure drawn from one part never holds numbers of two hosts. ``problems``
        stay with the first; with no run loaded, the one part is this (empty) Results itself."""
        return self._split(self.hosts(), "no runs")

    def by_machine(self) -> list[tuple[str, "Results"]]:
        """The runs split by the machine label they name (:func:`machine_of`), as
        :meth:`by_host` splits them by host."""
        return self._split(self.machines(), "unnamed")

    def _split(self, names_of: dict[str, str], empty: str) -> list[tuple[str, "Results"]]:
        if not names_of:
            return [(empty, self)]  # no run loaded: one empty part, which keeps the problems
        counts = list(names_of.values())
        names = sorted(set(counts), key=lambda m: (-counts.count(m), m))
        out = []
        for i, name in enumerate(names):
            ids = [run_id for run_id, m in names_of.items() if m == name]
            out.append((name, Results(self.table[self.table["run_id"].isin(ids)].reset_index(drop=True),
                                      {r: self.metas[r] for r in ids}, {r: self.dirs[r] for r in ids},
                                      self.problems if i == 0 else [])))
        return out


def host_key(meta: dict) -> tuple:
    """What tells two hosts apart: ``(cpu model, logical CPUs, ((cache level, bytes), ...))``
    from meta.json's ``machine``. Two runs with equal keys ran on the same kind of host (their
    numbers may be compared); the ``--machine`` label plays no part (one label, ``vm``, has
    named four hosts). Logical CPUs are part of it: a 2-CPU slice and a 16-CPU machine of one
    CPU model share caches but not what scales. Usable CPUs (a ``taskset``) are not: they are
    a run's setting on its host."""
    m = meta.get("machine") or {}
    return (str(m.get("cpu_model") or "unknown CPU"), int(m.get("logical_cpus") or 0),
            tuple(sorted(cache_sizes(meta).items())))


def _size(nbytes: int) -> str:
    for unit, size in (("g", 2**30), ("m", 2**20), ("k", 2**10)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return str(nbytes)


def host_of(meta: dict) -> str:
    """The host's name, a pure function of :func:`host_key`: the CPU model's own words (less
    vendor and filler words), the logical CPUs and the data cache sizes by level, e.g.
    ``epyc-2cpu-48k-1m-32m`` or ``xeon-16cpu-48k-2m-300m`` (L1d-L2-L3); usable in paths."""
    model, cpus, caches = host_key(meta)
    filler = {"amd", "intel", "r", "tm", "processor", "cpu", "core", "unknown", ""}
    words = [w for w in re.split(r"[^a-z0-9]+", model.lower()) if w not in filler] or ["cpu"]
    sizes = [_size(size) for _, size in caches]
    return "-".join([*words, f"{cpus}cpu" if cpus else "cpus-unknown", *sizes])


def machine_of(meta: dict, machine_column=None) -> str:
    """The name of the machine a run was made on: meta.json's ``machine_label`` (``--machine``),
    else the first name in its rows' ``machine`` column, else the host name, else "unnamed"."""
    label = meta.get("machine_label")
    if not label and machine_column is not None:
        named = [m for m in machine_column if isinstance(m, str) and m]
        label = named[0] if named else None
    return str(label or (meta.get("machine") or {}).get("hostname") or "unnamed")


def find_runs(root="results") -> list[Path]:
    """Run folders under ``root`` (sub-folders holding rows.csv or meta.json), oldest first.

    Run ids start with a UTC timestamp, so sorting by name sorts by start time.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (contract.has_rows(p) or (p / "meta.json").exists()))


def load_run(run_dir) -> tuple[pd.DataFrame, dict]:
    """One checked run: (its rows as a DataFrame with every known column, its meta dict).

    ``run_id`` is filled from the folder name where a row lacks one; a ``suite`` column holds
    the name of the suite that made the run (from meta.json).
    """
    run_dir = Path(run_dir)
    meta = contract.read_meta(run_dir)
    frame = contract.read_frame(run_dir)
    frame = frame.reindex(columns=contract.COLUMNS) if len(frame) else pd.DataFrame(columns=contract.COLUMNS)
    frame["run_id"] = frame["run_id"].fillna(meta.get("run_id") or run_dir.name)
    frame["suite"] = (meta.get("suite") or {}).get("name") or meta.get("scenario")
    frame["started"] = meta.get("start_time") or ""  # orders runs whatever their ids (reference-...)
    return legacy_columns(frame.astype(object)), meta


#: The ``mode`` that training rows held before the ``engine`` column, by engine.
_LEGACY_TRAINING_MODES = {"processes": "process", "ray": "ray", "dataflow": "dataflow"}


def legacy_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows written before a column split, read as rows written after it (the stored files
    are never edited; this is a reading):

    - training rows held the engine in ``mode`` ("processes" for the process engine and for
      the sequential baseline alike): ``engine`` is "paac" for algo a2c (its only engine),
      "sequential" for a baseline (actors 0), else the mode's engine, and ``mode`` is cleared
      (it is the concurrency scenario's);
    - gossip rows held the topology in ``policy``: ``topology`` takes it, ``policy`` is "none";
      the PAAC line's ``engine`` is "paac";
    - lf rows held the backend (ray, dataflow, sync ...) in ``variant``: ``backend`` takes it;
    - paac stepping rows (ops ``step`` and ``profile``, structure ``batched`` or ``per-env``;
      not its training runs' profiles) held the stepping method in ``variant``: ``stepping``
      takes it.
    In those two, ``variant`` is then empty, as new rows leave it.
    Rows that have the new columns are left as they are. Cost: O(rows of those scenarios)."""
    old_training = (frame["scenario"] == "training") & frame["engine"].isna() & frame["mode"].notna()
    if old_training.any():
        part = frame.loc[old_training]
        baseline = part["actors"].isna() | (part["actors"] == 0)
        frame.loc[old_training, "engine"] = [
            "paac" if algo == "a2c" else "sequential" if b else _LEGACY_TRAINING_MODES.get(m, m)
            for algo, b, m in zip(part["algo"], baseline, part["mode"])]
        frame.loc[old_training, "mode"] = None
    old_gossip = (frame["scenario"] == "gossip") & frame["mode"].notna()
    if old_gossip.any():
        policy = frame.loc[old_gossip, "policy"]
        frame.loc[old_gossip, "topology"] = [None if p in (None, "none") else p for p in policy]
        frame.loc[old_gossip, "policy"] = "none"
        frame.loc[old_gossip, "engine"] = ["paac" if v == "paac" else None for v in frame.loc[old_gossip, "variant"]]
        frame.loc[old_gossip, "mode"] = None
    for moved, holds in ((frame["scenario"] == "lf", "backend"),
                         ((frame["scenario"] == "paac") & frame["op"].isin(["step", "profile"])
                          & frame["structure"].isin(["batched", "per-env"]), "stepping")):
        moved &= frame[holds].isna() & frame["variant"].notna()
        if moved.any():
            frame.loc[moved, holds] = frame.loc[moved, "variant"]
            frame.loc[moved, "variant"] = None
    return frame


def _typed(table: pd.DataFrame) -> pd.DataFrame:
    """Integer columns as nullable Int64, numbers as float, the rest as object (None for empty)."""
    for column in table.columns:
        if column in contract.INT_COLUMNS:
            table[column] = pd.array(table[column].tolist(), dtype="Int64")
        elif column in contract.FLOAT_COLUMNS:
            table[column] = pd.to_numeric(table[column], errors="coerce").astype(float)
        else:
            table[column] = table[column].astype(object).where(table[column].notna(), None)
    return table


def load_runs(run_dirs) -> Results:
    """Every run in ``run_dirs`` that passes the checks, in one :class:`Results`.

    A run that fails is left out and its :class:`RunError` appended to ``problems``; the
    caller decides how loudly to say so. Runs are taken in the order given, and a later run is
    left out the same way when it would be merged with an earlier one:

    - its folder is one already loaded, reached through another path (a symlink, ``..``):
      folders are compared by their real paths, so its rows would count twice;
    - it shares a run id (meta.json's ``run_id``, or one in its rows' ``run_id`` column) with an
      earlier run: the table tells runs apart by run id only, so their rows would become one run.

    Cost: one pass over each run's files.
    """
    frames, metas, dirs, problems = [], {}, {}, []
    real_dirs: dict[Path, Path] = {}  # real path -> the path it was first given as
    owners: dict[str, Path] = {}  # run id -> the folder that holds it
    for run_dir in run_dirs:
        run_dir = Path(run_dir)
        real = run_dir.resolve()
        if real in real_dirs:
            problems.append(RunError(run_dir, f"the same folder as {real_dirs[real]} (both are {real}); "
                                              f"left out so that its rows count once"))
            continue
        real_dirs[real] = run_dir
        try:
            frame, meta = load_run(run_dir)
        except RunError as err:
            problems.append(err)
            continue
        run_id = meta.get("run_id") or run_dir.name
        ids = {run_id, *frame["run_id"].dropna().astype(str)}
        shared = sorted(ids & owners.keys())
        if shared:
            problems.append(RunError(run_dir, f"run_id {shared[0]!r} is also the run id of {owners[shared[0]]}, "
                                              f"loaded before it; left out so that two runs are not merged into one"))
            continue
        owners.update(dict.fromkeys(ids, run_dir))
        frames.append(frame)
        metas[run_id] = meta
        dirs[run_id] = run_dir
    table = (pd.concat(frames, ignore_index=True) if frames
             else pd.DataFrame(columns=[*contract.COLUMNS, "suite", "started"]))
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
