"""What each setting of a swept parameter buys: speed over the run's default setting.

Rows: the ``ok`` timings of micro runs whose grid (meta.json ``selection.params``) sweeps any
of :data:`KEYS` (``micro-sweep-memory``: prefetch x hugepages; ``micro-sweep-kernel``: kernel x
prefetch; ``micro-sweep-storage``: storage x transitions; ``micro-threads``: 1 and 2 threads), the
newest run of each suite.
A cell's *setting* is its values of the run's swept keys; its *default* is the cell with the
first value of each key, in the same run, op, capacity and variant (and the same
``transitions`` when the run sweeps row sizes as a workload, since a 28 KB row is not the
default for a 45-byte one: it is compared with its own first storage). One panel per (suite,
op); one group of bars per (variant, capacity), one bar per setting, its height the median
throughput over the default's median (> 1 = the setting is faster), the whisker the ratio of
the extremes. Only ratios within one run are drawn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import pandas as pd

from replaybench.analysis import stats
from replaybench.analysis import markdown as md
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, new_figure, pow2
from replaybench.bench import contract

NAME = "grid_effects"
ORDER = 12
TITLE = "What the speed parameters buy (prefetch, huge pages, kernel, row storage, threads)"

#: The swept keys this figure shows; the first value in a run's grid is the default it compares with.
KEYS = ("prefetch", "hugepages", "kernel", "storage", "threads")
#: Workload columns that split the comparison instead of being a setting of their own.
_SPLIT = ("transitions",)
_COLOURS = ["#8c8c8c", "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860", "#da8bc3"]


def _value(row, key):
    if key == "threads":
        return int(row[key]) if pd.notna(row[key]) else 1
    return json.loads(row["params"] or "{}").get(key)


def _newest_per_suite(metas: dict) -> dict:
    """``{run_id: suite name}`` of each suite's newest run (by start time, then run id)."""
    newest = {}
    for run, meta in metas.items():
        suite = (meta.get("suite") or {}).get("name") or run
        key = (str(meta.get("start_time") or ""), run)
        if suite not in newest or key > newest[suite]:
            newest[suite] = key
    return {run: suite for suite, (_, run) in newest.items()}


def effects(table: pd.DataFrame, metas: dict) -> pd.DataFrame:
    """One row per measured setting: suite, run_id, op, capacity, variant, the split keys,
    ``setting`` (``"prefetch=True hugepages=False"``), ``median``/``min``/``max`` throughput and
    ``x_default`` / ``x_lo`` / ``x_hi`` against the default setting's cell in the same run."""
    out = []
    for run, suite in _newest_per_suite(metas).items():
        grid = (metas[run].get("selection") or {}).get("params") or {}
        keys = [k for k in KEYS if k in grid]  # in KEYS order, whatever order meta.json keeps
        if not keys:
            continue
        rows = stats.timings(table[(table["run_id"] == run) & (table["scenario"] == "micro")
                                   & (table["op"] != "empty")])
        if rows.empty:
            continue
        rows = rows.assign(**{k: [_value(r, k) for _, r in rows.iterrows()] for k in keys})
        base = ["op", "capacity", "variant", *_SPLIT]
        cells = stats.spread(rows.astype({k: str for k in keys}), [*base, *keys], "items_per_s")
        default = {k: str(grid[k][0]) for k in keys}
        for _, group in cells.groupby(base, dropna=False, sort=False):
            ref = group[np.logical_and.reduce([group[k] == v for k, v in default.items()])]
            if ref.empty:
                continue
            ref = ref.iloc[0]
            for _, c in group.iterrows():
                out.append({"suite": suite, "run_id": run,
                            **{k: c[k] for k in base},
                            "setting": " ".join(f"{k}={c[k]}" for k in keys), "median": c["median"], "min": c["min"],
                            "max": c["max"], "n": c["n"], "x_default": c["median"] / ref["median"],
                            "x_lo": c["min"] / ref["max"], "x_hi": c["max"] / ref["min"]})
    return pd.DataFrame(out)


def build(table, metas) -> Plot:
    data = effects(table, metas)
    if data.empty:
        raise NoRows("no micro run swept " + ", ".join(KEYS) + " (replaybench run --suite micro-sweep-memory, "
                     "micro-sweep-kernel, micro-sweep-storage or micro-threads)")
    panels = list(data[["suite", "op"]].drop_duplicates().itertuples(index=False, name=None))
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    groups_max = max(len(data[(data["suite"] == s) & (data["op"] == o)][["variant", "capacity", "transitions"]]
                         .drop_duplicates()) for s, o in panels)
    fig, axes = new_figure(nrows, ncols, panel=(max(4.4, 0.55 * groups_max + 1.2), 3.4))
    handles = {}
    for ax, (suite, op) in zip(axes.flat, panels):
        part = data[(data["suite"] == suite) & (data["op"] == op)]
        settings = list(dict.fromkeys(part["setting"]))
        groups = part[["variant", "capacity", "transitions"]].drop_duplicates().reset_index(drop=True)
        width = 0.8 / len(settings)
        for gi, g in groups.iterrows():
            cell = part[(part["variant"] == g["variant"]) & (part["capacity"] == g["capacity"])
                        & (part["transitions"] == g["transitions"])]
            for si, setting in enumerate(settings):
                hit = cell[cell["setting"] == setting]
                if hit.empty:
                    continue
                e, colour = hit.iloc[0], _COLOURS[si % len(_COLOURS)]
                x = gi - 0.4 + width * (si + 0.5)
                ax.bar(x, e["x_default"], width=width * 0.9, color=colour)
                ax.plot([x, x], [e["x_lo"], e["x_hi"]], color="black", linewidth=0.8)
                handles.setdefault((suite, setting), handle(f"{suite}: {setting}", colour, "s", ""))
        ax.axhline(1.0, color="0.3", linewidth=0.8)
        labels = [f"{g['variant']}\n{pow2(g['capacity'])}" + ("" if g["transitions"] == "cartpole" else
                                                              f" {g['transitions']}") for _, g in groups.iterrows()]
        ax.set_xticks(np.arange(len(groups)), labels, fontsize=7)
        ax.set_ylabel("speed over the default setting (x)")
        ax.set_title(f"{suite}: {op} ({contract.op_unit(op)[1]})", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("Median speed over the default setting, same run", fontsize=10)
    legend(fig, list(handles.values()), title="setting (first = default)")
    data = data.sort_values(["suite", "op", "capacity", "variant", "setting"]).reset_index(drop=True)
    return Plot(fig, data, "Speed of each parameter setting over the run's default setting (the first value of "
                           "each swept key) for the same variant, op and capacity, medians from one run; whiskers: the "
                           "ratio of the extremes.")


def report_section(data: pd.DataFrame | None, res, drawn: Mapping[str, pd.DataFrame]) -> list[str]:
    """The report's table of each swept setting against the run's default, from this figure's data."""
    if data is None:
        return []
    body = []
    for _, e in data.iterrows():
        scale, unit = contract.op_unit(e["op"])
        body.append([e["suite"], e["op"], f"2^{int(e['capacity']).bit_length() - 1}", f"`{e['variant']}`",
                     e["transitions"], e["setting"], md.num(e["median"] / scale), unit, md.num(e["x_default"]),
                     f"{md.num(e['x_lo'])}-{md.num(e['x_hi'])}"])
    return (["## Speed parameters and threads", "",
             "Each setting's median throughput and its ratio to the run's default setting (the first value of each "
             "swept key) for the same variant, op, capacity and row kind, in the same run; the range is the ratio "
             "of the extremes. `threads=2`: two threads, each on its own buffer, against one.", ""]
            + md.table(["suite", "op", "capacity", "variant", "rows", "setting", "median", "unit", "x default",
                      "range"], body) + [""])
