"""Throughput of sample / update / insert against the fan-out K (the PAL K sweep), per capacity.

Rows: the ``ok`` timings of runs that swept K (``replaybench run --suite micro-sweep-k``, or any
run whose grid names K), newest run per cell. One panel per (capacity, op); one line per
variant (kary, kary-aligned, kary-prefix ...) with its median throughput and the min-max over
its values as error bars. K values a layout refuses (non-powers of 2 for the aligned ones)
were recorded as skipped and are simply absent from that line.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from replaybench.analysis import load, palette, stats
from replaybench.analysis import markdown as md
from replaybench.bench import contract
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import draw_median, handle, legend, new_figure, pow2

NAME = "k_sweep"
ORDER = 10
TITLE = "Throughput vs K (K-ary layouts)"

_OPS = ["sample", "update", "insert_batch", "insert_one", "mixed"]
_KEYS = ["run_id", "variant", "structure", "dtype", "batch", "transitions", "capacity", "op", "K"]


def build(table, metas) -> Plot:
    swept = [run for run, meta in metas.items() if "K" in stats.grid_keys(meta)]
    rows = stats.timings(load.latest_per_cell(table[table["run_id"].isin(swept)]))
    rows = rows[rows["K"].notna()]
    if rows.empty:
        raise NoRows("no timings from a run that swept K (replaybench run --suite micro-sweep-k)")
    data = stats.spread(rows, _KEYS, "items_per_s")
    # keep (variant, capacity, op) lines that have at least two K values
    n_k = data.groupby(["variant", "dtype", "capacity", "op"], dropna=False)["K"].transform("nunique")
    data = data[n_k >= 2]
    if data.empty:
        raise NoRows("the K-sweep runs hold a single K per variant")
    data["unit"] = "items/s"
    ops = [op for op in _OPS if op in set(data["op"])] + sorted(set(data["op"]) - set(_OPS))
    caps = sorted(set(data["capacity"]))
    dtypes = sorted(set(data["dtype"].dropna()))
    fig, axes = new_figure(len(caps), len(ops), sharex=True)
    handles = {}
    for r, cap in enumerate(caps):
        for c, op in enumerate(ops):
            ax = axes[r, c]
            scale, unit = contract.op_unit(op)
            cell = data[(data["capacity"] == cap) & (data["op"] == op)]
            for (variant, dtype), line in cell.groupby(["variant", "dtype"], dropna=False, sort=True):
                line = line.sort_values("K")
                colour = palette.variant_colour(variant)
                style = "-" if len(dtypes) < 2 or dtype == dtypes[0] else "--"
                draw_median(ax, line["K"], line["median"] / scale, line["min"] / scale, line["max"] / scale, colour,
                            marker=palette.marker(variant), linestyle=style)
                label = variant + (f" ({dtype})" if len(dtypes) > 1 else "")
                handles.setdefault(label, handle(label, colour, palette.marker(variant), style))
            ks = sorted(set(data["K"]))
            ax.set_xscale("log", base=2)
            ax.set_xticks(ks, [str(int(k)) for k in ks])
            ax.minorticks_off()
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.set_title(f"{op}, capacity {pow2(cap)}", fontsize=10)
            ax.set_ylabel(f"throughput ({unit})")
            if r == len(caps) - 1:
                ax.set_xlabel("fan-out K (children per node)")
    fig.suptitle("Throughput vs fan-out K: median over values, bars = min-max", fontsize=11)
    legend(fig, list(handles.values()), title="variant")
    data = data.sort_values(["capacity", "op", "variant", "K"]).reset_index(drop=True)
    return Plot(fig, data, "Throughput against K for the K-ary layouts (median, min-max bars).")


def report_section(data: pd.DataFrame | None, res, drawn: Mapping[str, pd.DataFrame]) -> list[str]:
    """The report's fan-out table (the fastest K per layout) from this figure's data."""
    if data is None:
        return []
    body = []
    for (cap, op, variant), part in data.groupby(["capacity", "op", "variant"], sort=True):
        best = part.loc[part["median"].idxmax()]
        scale, unit = contract.op_unit(op)
        body.append([f"2^{int(cap).bit_length() - 1}", op, f"`{variant}`", int(best["K"]), md.num(best["median"] / scale),
                     f"{md.num(best['min'] / scale)}-{md.num(best['max'] / scale)}", unit,
                     ", ".join(f"{int(k)}: {md.num(m / scale)}" for k, m in zip(part["K"], part["median"]))])
    return (["## Fan-out K", "", "The fastest K per layout (median throughput, min-max), and the median at every K "
             "measured.", ""]
            + md.table(["capacity", "op", "variant", "best K", "median", "min-max", "unit", "median by K"], body) + [""])
