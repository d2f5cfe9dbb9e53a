"""Cache misses per transition by layout and capacity, one row of panels per measuring method.

Rows: scenario ``cache`` (``replaybench run --suite cache``), newest run per cell (of any
suite: a cell measured by two cache suites is drawn once). Each
row is one (method, stream): ``model`` (the trace-driven LRU model), ``cachegrind`` (valgrind's
simulated caches, differential runs) and ``perf`` (hardware counters), for the ``tree``
stream (the sum tree's arrays only) or ``tree+data`` (the descent and the gather of the
sampled rows). Columns are (op, level): L1d and LL (the last level the method models; the L2
on these VMs). Bars: misses per *transition* = misses per call / items per call (256).

A cell the method could not measure is not drawn as zero: its bar slot says ``unsupported``
(perf on a VM without counters), ``skipped`` (e.g. the uniform buffer has no tree) or
``failed``, and the reason is in the CSV's ``error`` column. A row whose cells are all
unsupported says so across the panel, with the reason. A differential (cachegrind, perf)
within its resolution of zero is a row of status ``below-resolution`` whose value is an upper
bound: it is drawn as an open hatched bar up to the bound, labelled ``< bound``, with a legend
entry, and the CSV holds the bound in ``bound_per_transition`` (``misses_per_transition``
stays empty), never a negative count.

The model and cachegrind simulate **the caches of the host that ran them** (each row's
``cache_config``: size, ways and line of L1d and the last level modelled): their counts are a
function of that geometry, so the same layout on another host (another L1d size) gets other
numbers, and two hosts' tables are never one table. The figure's title and the report section
name the geometry (:func:`geometries`); the CSV keeps it per row.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from replaybench.analysis import load, palette
from replaybench.analysis import markdown as md
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, new_figure, note, pow2
from replaybench.bench import contract

NAME = "cache_misses"
ORDER = 30
TITLE = "Cache misses per transition"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("pal-kary-vs-baselines", "pal-k-sweep")

_METHODS = ["model", "cachegrind", "perf"]
_BELOW = contract.BELOW_RESOLUTION  # a differential within its resolution: value = upper bound
_LEVELS = ["L1d", "L2", "LL"]


def _order(values, first):
    values = [v for v in dict.fromkeys(values) if v is not None]
    return [v for v in first if v in values] + sorted(v for v in values if v not in first)


def build(table, metas) -> Plot:
    rows = load.latest_per_cell(table[table["scenario"] == "cache"], load.CELL_COLUMNS)  # newest run, any suite
    if rows.empty:
        raise NoRows("no cache-miss rows (replaybench run --suite cache, part of make bench)")
    data = rows[["run_id", "method", "stream", "op", "level", "variant", "structure", "K", "capacity", "status",
                 "value", "items_per_call", "error", "cache_config"]].copy()
    per_item = data["value"] / data["items_per_call"].astype(float)
    data["misses_per_transition"] = np.where(data["status"] == "ok", per_item, np.nan)
    data["bound_per_transition"] = np.where(data["status"] == _BELOW, per_item, np.nan)
    data = data.rename(columns={"value": "misses_per_call"})
    panels_r = [(m, s) for m in _order(data["method"], _METHODS) for s in _order(data["stream"], ["tree"])
                if ((data["method"] == m) & (data["stream"] == s)).any()]
    panels_c = [(op, lv) for op in _order(data["op"], ["sample", "update"]) for lv in _order(data["level"], _LEVELS)
                if ((data["op"] == op) & (data["level"] == lv)).any()]
    variants = sorted(set(data["variant"]), key=lambda v: (v.startswith("peer:"), v))
    caps = sorted(set(data["capacity"].dropna()))
    panel_width = max(3.0, 1.2 + 0.12 * len(variants) * len(caps))
    fig, axes = new_figure(len(panels_r), len(panels_c), panel=(panel_width, 2.6))
    width = 0.8 / max(1, len(variants))
    handles = {}
    for r, (method, stream) in enumerate(panels_r):
        for c, (op, level) in enumerate(panels_c):
            ax = axes[r, c]
            cell = data[(data["method"] == method) & (data["stream"] == stream) & (data["op"] == op)
                        & (data["level"] == level)]
            ax.set_title(f"{method}, {stream}: {op}, {level}", fontsize=9)
            ax.set_xticks(range(len(caps)), [pow2(c) for c in caps])
            ax.set_xlim(-0.5, len(caps) - 0.5)
            if r == len(panels_r) - 1:
                ax.set_xlabel("capacity (transitions)")
            if c == 0:
                ax.set_ylabel("misses per transition")
            ax.grid(alpha=0.3, axis="y")
            ax.set_axisbelow(True)
            if cell.empty:
                note(ax, "not measured")
                continue
            if (cell["status"] != "ok").all() and cell["status"].nunique() == 1:
                reason = cell["error"].dropna().iloc[0] if cell["error"].notna().any() else ""
                note(ax, f"{cell['status'].iloc[0].upper()}\n{reason[:120]}", width=int(panel_width * 10))
                ax.set_yticks([])
                continue
            top = cell[["misses_per_transition", "bound_per_transition"]].max(skipna=True).max(skipna=True)
            top = top if top > 0 else 1.0
            ax.set_ylim(0.0, top * 1.08)
            for i, variant in enumerate(variants):
                x0 = i * width - 0.4 + width / 2
                for _, row in cell[cell["variant"] == variant].iterrows():
                    x = caps.index(row["capacity"]) + x0
                    if row["status"] == "ok":
                        value = row["misses_per_transition"]
                        ax.bar(x, value, width, color=palette.variant_colour(variant))
                        if abs(value) < top * 0.01:  # a bar too small to see: say its value
                            ax.text(x, top * 0.02, f"{value:.2g}", rotation=90, ha="center", va="bottom",
                                    fontsize=6, color="0.2")
                    elif row["status"] == _BELOW:  # an upper bound: open bar, never a count
                        bound = row["bound_per_transition"]
                        ax.bar(x, bound, width, facecolor="none", edgecolor=palette.variant_colour(variant),
                               hatch="///", linewidth=0.8)
                        ax.text(x, max(bound, top * 0.02), f"< {bound:.2g}", rotation=90, ha="center", va="bottom",
                                fontsize=6, color="0.2")
                        handles.setdefault(_BELOW, Patch(facecolor="none", edgecolor="0.3", hatch="///",
                                                         label="below resolution: < bound"))
                    else:
                        ax.text(x, top * 0.02, row["status"], rotation=90, ha="center", va="bottom", fontsize=6,
                                color="0.4")
                if (cell["variant"] == variant).any():
                    first = cell[cell["variant"] == variant].iloc[0]
                    label = palette.variant_label(variant, first["structure"], first["K"])
                    handles.setdefault(variant, handle(label, palette.variant_colour(variant), marker="s",
                                                       linestyle=""))
    simulated = geometries(data)
    fig.suptitle("Cache misses per transition (one call = a batch of 256), by method, address stream, op and "
                 "cache level" + "".join(f"\n{m} simulates this host's caches: {g}" for m, g in simulated.items())
                 + ("\n(the simulated counts depend on these sizes: another host's L1d gives other numbers)"
                    if simulated else ""), fontsize=10)
    below = handles.pop(_BELOW, None)  # after the variants
    legend(fig, list(handles.values()) + ([below] if below else []), title="variant (structure, K)")
    data = data.sort_values(["method", "stream", "op", "level", "capacity", "variant"]).reset_index(drop=True)
    return Plot(fig, data, "Cache misses per transition by layout and capacity, per measuring method; cells a "
                           "method could not measure are labelled, not drawn as zero; open hatched bars are upper "
                           "bounds (a differential within its resolution).")


def geometries(data: pd.DataFrame) -> dict[str, str]:
    """``{method: "L1d 48KiB/12w/64B; LL 1024KiB/16w/64B"}``: the cache geometry each simulating
    method (model, cachegrind) used, as its rows record it (several joined by " or ")."""
    out = {}
    for method, part in data.groupby("method", sort=True):
        configs = sorted(set(part["cache_config"].dropna().astype(str))) if "cache_config" in part else []
        if configs:
            out[str(method)] = " or ".join(configs)
    return out


def report_section(data: pd.DataFrame | None, res, drawn: Mapping[str, pd.DataFrame]) -> list[str]:
    """The report's cache-miss tables (one per method and stream) from this figure's data, with
    the cache geometry the simulating methods used (:func:`geometries`)."""
    if data is None:
        return []
    simulated = geometries(data)
    out = ["## Cache misses per transition", "",
           "Misses per call / items per call (one value per cell: the model is deterministic and cachegrind is "
           "one differential). `unsupported` = the method cannot run on this machine (or the model has no trace "
           "of that tree); `< b` = the differential is within its resolution of zero: fewer than b misses.", ""]
    if simulated:
        out += ["The model and cachegrind simulate the caches of the host that ran them: "
                + "; ".join(f"{m}: {g}" for m, g in simulated.items())
                + ". Their counts are a function of that geometry (a smaller L1d holds fewer of the upper levels, "
                  "so every descent misses more): the same layout on a host with another L1d size reads other "
                  "numbers, and this host's table is not another host's.", ""]
    rank = {m: i for i, m in enumerate(["model", "cachegrind", "perf"])}
    groups = sorted(data.groupby(["method", "stream"], sort=True), key=lambda kv: (rank.get(kv[0][0], 9), kv[0]))
    for (method, stream), part in groups:
        cols = sorted({(op, lv) for op, lv in zip(part["op"], part["level"])})
        body = []
        for (variant, cap), cell in part.groupby(["variant", "capacity"], sort=True):
            line = [f"`{variant}`", f"2^{int(cap).bit_length() - 1}"]
            for op, lv in cols:
                hit = cell[(cell["op"] == op) & (cell["level"] == lv)]
                if hit.empty:
                    line.append("")
                elif hit["status"].iloc[0] == "ok":
                    line.append(f"{hit['misses_per_transition'].iloc[0]:.3g}")
                elif hit["status"].iloc[0] == "below-resolution":  # an upper bound, not a count
                    line.append(f"< {hit['bound_per_transition'].iloc[0]:.2g}")
                else:
                    line.append(hit["status"].iloc[0])
            body.append(line)
        out += [f"### {method}, {stream}", ""]
        out += md.table(["variant", "capacity", *[f"{op} {lv}" for op, lv in cols]], body)
        out.append("")
    return out
