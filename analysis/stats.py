"""Metrics over a results table (a DataFrame of :mod:`analysis.load`): timings with throughput and
cost per item, medians with spread, ratios.

Nothing here is stored, and no metric is defined here: throughput, cost per item and the ratio
rules are the results contract's (:mod:`bench.contract`), applied to columns.

- throughput (items/s) = :func:`bench.contract.items_per_s` and cost (ns per item) =
  :func:`bench.contract.ns_per_item` of the ``ok`` seconds-per-call rows;
- spread = min-max over a cell's values (every repeat of every worker process), the same
  spread the terminal summary prints; the interquartile range is kept beside it (``q1``,
  ``q3``) in the figures' CSVs;
- ratios (``x binary``, ``x best peer``): :func:`bench.contract.reference_ratios`, medians from
  the same run only.
"""

from __future__ import annotations

import pandas as pd

from replaybench.bench import contract

__all__ = ["timings", "spread", "grid_keys", "ratio_columns"]


def timings(table: pd.DataFrame) -> pd.DataFrame:
    """The ``ok`` seconds-per-call rows with ``items_per_s`` and ``ns_per_item`` added."""
    rows = table[(table["status"] == contract.MEASURED) & (table["metric"] == contract.TIMING_METRIC)
                 & (table["value"] > 0) & table["items_per_call"].notna()].copy()
    items = rows["items_per_call"].astype(float)
    rows["items_per_s"] = contract.items_per_s(items, rows["value"])
    rows["ns_per_item"] = contract.ns_per_item(items, rows["value"])
    return rows


def spread(rows: pd.DataFrame, by: list[str], column: str) -> pd.DataFrame:
    """Per group of ``by``: ``median``, ``min``, ``max``, ``q1``, ``q3`` and ``n`` of ``column``.

    Missing keys (None, NA) form groups of their own rather than being dropped.
    """
    groups = rows.groupby(list(by), dropna=False, sort=True)[column]
    out = groups.agg(median="median", min="min", max="max", n="count")
    out["q1"] = groups.quantile(0.25)
    out["q3"] = groups.quantile(0.75)
    return out.reset_index()


def grid_keys(meta: dict) -> list[str]:
    """The parameters a run swept (meta.json ``selection.params``), e.g. ``["K"]``."""
    return list(((meta.get("selection") or {}).get("params") or {}))


def ratio_columns(cells: pd.DataFrame) -> pd.DataFrame:
    """Add ``x_<reference>`` (``x_binary``), ``x_best_peer`` and ``best_peer`` to per-cell medians
    of throughput.

    ``cells`` has one row per cell with ``median`` and the columns of
    :func:`bench.contract.comparison_group` it has (run_id, op, capacity, batch, transitions,
    params); the ratios follow :func:`bench.contract.reference_ratios` (> 1 = faster than the
    reference). Where there is no reference the ratio is NaN and ``best_peer`` None.
    """
    records = cells.astype(object).where(cells.notna(), None).to_dict("records")
    ratios = pd.DataFrame(contract.reference_ratios(records), index=cells.index)
    out = cells.copy()
    for column in ratios.columns:
        out[column] = ratios[column].astype(object if column == "best_peer" else float)
    return out
