"""Metrics computed from the raw rows: throughput, cost per item, medians with spread, ratios.

Nothing here is stored: rows.csv holds seconds per call (and, for other scenarios, the
measured value), and every figure and table derives its numbers with these functions.

- throughput (items/s) = ``items_per_call / value`` for ``metric == "seconds_per_call"``, as
  :mod:`bench.summary` computes it for the terminal; cost = ``1e9 * value / items_per_call``
  ns per item;
- spread = min-max over a cell's values (every repeat of every worker process), the same
  spread the terminal summary prints; the interquartile range is kept beside it (``q1``,
  ``q3``) in the figures' CSVs;
- ratios (``x binary``, ``x best peer``) compare medians from the same run only.
"""

from __future__ import annotations

import pandas as pd

from replaybench.bench import summary, workloads

__all__ = ["timings", "spread", "params_of", "grid_keys", "op_unit", "item_name", "ratio_columns",
           "PEER_PREFIX"]

PEER_PREFIX = summary.PEER_PREFIX


def timings(table: pd.DataFrame) -> pd.DataFrame:
    """The ``ok`` seconds-per-call rows with ``items_per_s`` and ``ns_per_item`` added."""
    rows = table[(table["status"] == "ok") & (table["metric"] == "seconds_per_call")
                 & (table["value"] > 0) & table["items_per_call"].notna()].copy()
    items = rows["items_per_call"].astype(float)
    rows["items_per_s"] = items / rows["value"]
    rows["ns_per_item"] = 1e9 * rows["value"] / items
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


def params_of(params) -> dict:
    """A row's ``params`` JSON as a dict ({} when empty or unreadable), as :mod:`bench.summary` reads it."""
    return summary._params({"params": params})


def grid_keys(meta: dict) -> list[str]:
    """The parameters a run swept (meta.json ``selection.params``), e.g. ``["K"]``."""
    return list(((meta.get("selection") or {}).get("params") or {}))


def op_unit(op: str) -> tuple[float, str]:
    """``(scale, unit)`` to show a micro op's throughput in, e.g. ``(1e6, "M transitions/s")``
    (the scale and item of :data:`bench.workloads.OPS`)."""
    spec = workloads.OPS.get(op)
    if spec is None:
        return 1.0, "items/s"
    prefix = {1e6: "M ", 1e3: "K ", 1.0: ""}.get(spec.scale, f"{spec.scale:g} ")
    return spec.scale, f"{prefix}{spec.item}/s"


def item_name(op: str) -> str:
    """What one item of ``op`` is ("transition", "iteration", "call")."""
    spec = workloads.OPS.get(op)
    return spec.item.rstrip("s") if spec else "item"


def ratio_columns(cells: pd.DataFrame, workload: list[str]) -> pd.DataFrame:
    """Add ``x_binary``, ``x_best_peer`` and ``best_peer`` to per-cell medians of throughput.

    ``cells`` has one row per (run_id, op, capacity, variant, workload ...) with ``median``;
    a ratio is the cell's median over the reference's median in the same run, op, capacity
    and workload (> 1 = faster than the reference); "best peer" is the peer library with the
    highest median there. Where there is no reference the ratio is NaN.
    """
    key = ["run_id", "op", "capacity", *workload]
    out = cells.copy()
    ref_name = dict((name, title) for title, name in summary.REFERENCES)
    ref = out[out["variant"].isin(list(ref_name))]
    for name in ref_name:
        base = ref[ref["variant"] == name][[*key, "median"]].rename(columns={"median": "_ref"})
        base = base.drop_duplicates(key)
        out = out.merge(base, on=key, how="left")
        out[f"x_{name}"] = out["median"] / out.pop("_ref")
    peers = out[out["variant"].str.startswith(PEER_PREFIX)]
    if peers.empty:
        out["best_peer"], out["x_best_peer"] = None, float("nan")
        return out
    best = peers.sort_values("median", ascending=False).drop_duplicates(key)[[*key, "variant", "median"]]
    best = best.rename(columns={"variant": "best_peer", "median": "_peer"})
    out = out.merge(best, on=key, how="left")
    out["x_best_peer"] = out["median"] / out.pop("_peer")
    return out
