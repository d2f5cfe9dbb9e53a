"""Throughput of sample / update / insert against the fan-out K (the PAL K sweep), per capacity.

Rows: the ``ok`` timings of runs that swept K (``replaybench run --suite micro-sweep-k``, or any
run whose grid names K), newest run per cell. One panel per (capacity, op); one line per
variant (kary, kary-aligned, kary-prefix ...) with its median throughput and the min-max over
its values as error bars. K values a layout refuses (non-powers of 2 for the aligned ones)
were recorded as skipped and are simply absent from that line.

**K and padding change together.** A K-ary tree over ``capacity`` leaves has ``K**L`` leaf slots,
L the smallest depth with ``K**L >= capacity`` (:func:`leaves`), so at 2^16 K = 2, 4 and 16 fit
exactly while K = 32 pads to 2^20 slots (16x) and K = 3 to 3^11 (2.7x): a K whose tree is
padded walks a larger tree, which is part of what its point measures. Padded points are hollow,
each panel lists its padding factors, and the CSV holds ``leaves`` and ``padding`` (slots over
capacity) per point; compare K only among filled points to see K alone.
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
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("pal-k-sweep",)

_OPS = ["sample", "update", "insert_batch", "insert_one", "mixed"]
_KEYS = ["run_id", "variant", "structure", "dtype", "batch", "transitions", "capacity", "op", "K"]


def leaves(capacity: int, K: int) -> int:
    """Leaf slots of a K-ary tree over ``capacity`` leaves: ``K**L`` with L the smallest depth
    such that ``K**L >= capacity`` (the layouts' rule, impl/trees/layouts.py, restated here
    because the analysis reads results, not impl). Cost: O(log_K capacity)."""
    slots = 1
    while slots < capacity:
        slots *= K
    return slots


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
    data["leaves"] = [leaves(int(c), int(k)) for c, k in zip(data["capacity"], data["K"])]
    data["padding"] = data["leaves"] / data["capacity"].astype(float)
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
                padded = line[line["padding"] > 1]
                if not padded.empty:  # hollow: this K pads the tree (more leaf slots than capacity)
                    ax.plot(padded["K"], padded["median"] / scale, linestyle="none", marker=palette.marker(variant),
                            markersize=5, markerfacecolor="white", markeredgecolor=colour, zorder=3)
                label = variant + (f" ({dtype})" if len(dtypes) > 1 else "")
                handles.setdefault(label, handle(label, colour, palette.marker(variant), style))
            ks = sorted(set(data["K"]))
            ax.set_xscale("log", base=2)
            ax.set_xticks(ks, [str(int(k)) for k in ks])
            ax.minorticks_off()
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.set_title(f"{op}, capacity {pow2(cap)}", fontsize=10)
            pads = cell.drop_duplicates("K")
            pads = pads[pads["padding"] > 1].sort_values("K")
            if not pads.empty:
                ax.text(0.02, 0.02, "padded: " + ", ".join(f"K={int(k)} x{p:.3g}" for k, p in
                                                          zip(pads["K"], pads["padding"])),
                        transform=ax.transAxes, fontsize=6.5, color="0.3", va="bottom")
            ax.set_ylabel(f"throughput ({unit})")
            if r == len(caps) - 1:
                ax.set_xlabel("fan-out K (children per node)")
    fig.suptitle("Throughput vs fan-out K: median over values, bars = min-max\n"
                 "hollow: the tree has K^L > capacity leaf slots (padded), so K and padding change together",
                 fontsize=10)
    if (data["padding"] > 1).any():
        handles["padded"] = handle("padded tree (K^L > capacity)", "0.3", "o", "")
        handles["padded"].set_markerfacecolor("white")
    legend(fig, list(handles.values()), title="variant")
    data = data.sort_values(["capacity", "op", "variant", "K"]).reset_index(drop=True)
    return Plot(fig, data, "Throughput against K for the K-ary layouts (median, min-max bars). K and the tree's "
                           "padding are confounded: a K-ary tree has K^L leaf slots (L the smallest depth with K^L >= "
                           "capacity), so some K pad the tree (hollow points; each panel lists the factors) and walk "
                           "more of it. Compare the filled points for K alone.")


def report_section(data: pd.DataFrame | None, res, drawn: Mapping[str, pd.DataFrame]) -> list[str]:
    """The report's fan-out table (the fastest K per layout) from this figure's data."""
    if data is None:
        return []
    body = []
    for (cap, op, variant), part in data.groupby(["capacity", "op", "variant"], sort=True):
        best = part.loc[part["median"].idxmax()]
        scale, unit = contract.op_unit(op)
        pads = part[part["padding"] > 1]
        body.append([f"2^{int(cap).bit_length() - 1}", op, f"`{variant}`", int(best["K"]), md.num(best["median"] / scale),
                     f"{md.num(best['min'] / scale)}-{md.num(best['max'] / scale)}", unit,
                     ", ".join(f"{int(k)}: {md.num(m / scale)}" for k, m in zip(part["K"], part["median"])),
                     ", ".join(f"{int(k)}: x{p:.3g}" for k, p in zip(pads["K"], pads["padding"])) or "none"])
    return (["## Fan-out K", "", "The fastest K per layout (median throughput, min-max), and the median at every K "
             "measured. *padded K*: the K whose tree has more leaf slots than the capacity (K^L, L the smallest depth "
             "with K^L >= capacity) and by how much: there K and the tree's size change together, so only the other "
             "K show the effect of K alone.", ""]
            + md.table(["capacity", "op", "variant", "best K", "median", "min-max", "unit", "median by K", "padded K"],
                       body) + [""])
