"""Compare two runs cell by cell and say which differences are larger than the run-to-run spread.

A *cell* is what one configuration measured: rows equal in :data:`bench.contract.CELL_COLUMNS`
(variant, op, capacity, parameters, level, method, policy, workers ...), ``ok`` rows only (a
``below-resolution`` row holds a bound, not a measurement). Its values are throughputs
(:func:`bench.contract.items_per_s`, as in :mod:`bench.summary`, shown in the op's unit such as
M transitions/s) for timing rows and the stored value for every other metric (misses, items/s
of the concurrency scenario, training summaries). Training return curves (op ``episode``) are
not cells and are left out.

Rule. Per cell present in both runs: the medians ``a`` and ``b``, ``b/a``, and a verdict:

- ``not significant`` when the ranges ``[min, max]`` of the two cells' values overlap: the
  difference is within what repeating the measurement moves it by;
- ``significant`` when the ranges do not overlap;
- ``n=1`` when either side has a single value (no spread to judge by; a deterministic meter,
  such as the cache model, gives one value per cell, and there any difference is real).

The min-max range is the spread the harness's summary prints; it is conservative (a wider
range makes more differences "not significant") and needs no assumption about the
distribution of the values.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from replaybench.analysis import load, stats
from replaybench.bench import contract
from replaybench.bench.contract import CELL_COLUMNS, format_table

__all__ = ["RULE", "cells", "compare_tables", "compare_runs"]

RULE = ("not significant = the two cells' [min, max] ranges over their values overlap; "
        "n=1 = a side has one value, so no spread to judge by")

#: Cell columns shown when they differ between cells (op, capacity and variant always are).
_SHOWN = ["scenario", "metric", "K", "dtype", "batch", "transitions", "method", "stream", "level", "policy",
          "mode", "actors", "learners", "algo", "env", "seed"]


def cells(table: pd.DataFrame) -> pd.DataFrame:
    """Per cell: ``median``, ``min``, ``max``, ``n`` of its values and the ``shown_unit``."""
    ok = table[(table["status"] == contract.MEASURED) & table["value"].notna() & (table["op"] != "episode")
               & (table["op"] != "empty")]
    timed = stats.timings(ok)
    other = ok[ok["metric"] != contract.TIMING_METRIC].copy()
    units = {op: contract.op_unit(op) for op in set(timed["op"])}  # e.g. (1e6, "M transitions/s")
    timed = timed.assign(x=timed["items_per_s"] / timed["op"].map(lambda op: units[op][0]),
                         shown_unit=timed["op"].map(lambda op: units[op][1]))
    other = other.assign(x=other["value"], shown_unit=other["unit"].fillna(""))
    both = pd.concat([timed, other], ignore_index=True)
    if both.empty:
        return pd.DataFrame(columns=[*CELL_COLUMNS, "shown_unit", "median", "min", "max", "n"])
    return stats.spread(both, [*CELL_COLUMNS, "shown_unit"], "x")


def compare_tables(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Cells of both tables side by side: ``median_a``, ``median_b``, ``ratio`` (b/a), ``verdict``."""
    key = [*CELL_COLUMNS, "shown_unit"]
    ca, cb = cells(a), cells(b)
    # merge on text keys: None and NA must match themselves (a run without cells has none: a
    # row-wise agg over no rows returns a frame, not a column)
    for c in (ca, cb):
        c["_key"] = c[key].astype(str).agg("\x1f".join, axis=1) if len(c) else pd.Series(dtype=object)
    out = ca.merge(cb[["_key", "median", "min", "max", "n"]], on="_key", suffixes=("_a", "_b")).drop(columns="_key")
    out["ratio"] = out["median_b"] / out["median_a"]
    overlap = (out["min_a"] <= out["max_b"]) & (out["min_b"] <= out["max_a"])
    single = (out["n_a"] < 2) | (out["n_b"] < 2)
    out["verdict"] = "significant"
    out.loc[overlap, "verdict"] = "not significant"
    out.loc[single, "verdict"] = "n=1"
    return out


def _fmt(x) -> str:
    return "-" if pd.isna(x) else f"{x:.4g}"


def compare_runs(run_a, run_b) -> str:
    """The comparison of two stored runs as text (see the module docstring for the rule).

    Raises
    ------
    analysis.load.RunError
        when either run cannot be loaded (the message names the file and line).
    """
    tables = []
    for run in (run_a, run_b):
        res = load.load_runs([run])
        if res.problems:
            raise res.problems[0]
        tables.append(res.table)
    out = compare_tables(*tables)
    name_a, name_b = Path(run_a).name, Path(run_b).name
    head = [f"a = {name_a}, b = {name_b}: medians per cell, b/a = ratio of medians (throughput cells: > 1 = b "
            f"faster)", f"verdict: {RULE}", ""]
    empty = [f"{side} = {Path(run).name} has no rows (its rows file holds only the header: the run measured "
             f"nothing, e.g. it was interrupted before its first cell)"
             for side, run, table in (("a", run_a, tables[0]), ("b", run_b, tables[1])) if table.empty]
    if out.empty:
        return "\n".join(head + (empty or ["no cell was measured in both runs"]))
    shown = [c for c in _SHOWN if out[c].astype(str).nunique() > 1]
    order = {c: out[c].astype(str) for c in ["scenario", "op", "variant", *shown]}
    order["capacity"] = out["capacity"].astype(float).fillna(-1)
    out = out.iloc[pd.DataFrame(order).sort_values(["scenario", "op", "capacity", "variant", *shown]).index.map(
        out.index.get_loc)]
    header = ["op", "capacity", "variant", *shown, "unit", "a median", "a min-max", "b median", "b min-max", "b/a",
              "verdict"]
    body = []
    for _, r in out.iterrows():
        body.append([str(r["op"]), "-" if pd.isna(r["capacity"]) else str(r["capacity"]), str(r["variant"]),
                     *["-" if pd.isna(r[c]) else str(r[c]) for c in shown], r["shown_unit"],
                     _fmt(r["median_a"]), f"{_fmt(r['min_a'])}-{_fmt(r['max_a'])}", _fmt(r["median_b"]),
                     f"{_fmt(r['min_b'])}-{_fmt(r['max_b'])}", f"{r['ratio']:.3f}", r["verdict"]])
    n = len(shown)
    lines = head + format_table(header, body, right={1, *range(4 + n, 9 + n)})
    counts = out["verdict"].value_counts()
    lines += ["", "cells: " + ", ".join(f"{counts.get(v, 0)} {v}" for v in ("significant", "not significant", "n=1"))]
    return "\n".join(lines)
