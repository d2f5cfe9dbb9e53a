"""Cost per operation against capacity (log-log), per variant, with the machine's caches marked.

Rows: ``ok`` timings of micro-scenario runs that swept no parameter (micro, quick,
sweep-capacity ...), every variant at its default parameters; where several runs measured the
same cell, the newest run's values. One panel per op; y = nanoseconds per item (per
transition; per iteration for ``mixed``; the median over values, min-max bars), x =
capacity.

Cache lines. A vertical line per data cache of the recorded machine (meta.json
``machine.caches``: L1d, L2, L3) sits at the capacity whose *float32 leaf row* fills that
cache: ``capacity = cache bytes / 4``. It is a landmark, not the exact point a tree stops
fitting: the whole structure is larger (inner nodes add ``1/(K-1)`` of the leaves, the min
tree beside the sum tree doubles it: about 2.1x the leaf row for K=16, 4x for the binary
heap), so a tree leaves each cache 2-4x to the left of its line, and a sample touches only
one root-to-leaf path, so the cost rises gradually rather than in a step.
"""

from __future__ import annotations

import math

from replaybench.analysis import load, palette, stats
from replaybench.bench import contract
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import capacity_axis, draw_median, handle, legend, log_y, new_figure

NAME = "capacity"
ORDER = 20
TITLE = "Cost per operation vs capacity"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("pal-kary-vs-baselines",)

_OPS = ["sample", "update", "insert_batch", "insert_one", "mixed"]
_KEYS = ["variant", "structure", "K", "dtype", "batch", "transitions", "op", "capacity", "run_id"]
LEAF_BYTES = 4  # float32 leaves: the default dtype of every tree


def default_timings(table, metas):
    """Timings of the runs without a parameter grid, newest run per cell (shared with :mod:`.peers`)."""
    plain = [run for run, meta in metas.items() if not stats.grid_keys(meta)]
    rows = table[(table["run_id"].isin(plain)) & (table["scenario"] == "micro") & (table["op"] != "empty")
                 & table["capacity"].notna()]  # the empty op times the harness's loop, not a buffer
    return stats.timings(load.latest_per_cell(rows, load.CELL_COLUMNS))


def _human(nbytes: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"


def _caches(data, metas) -> tuple[dict, str]:
    """Cache sizes of the newest run behind ``data`` and a note when the runs' machines differ."""
    runs = sorted(set(data["run_id"]), reverse=True)
    sizes = [load.cache_sizes(metas.get(r, {})) for r in runs]
    chosen = next((s for s in sizes if s), {})
    differ = len({tuple(sorted(s.items())) for s in sizes if s}) > 1
    return chosen, (f" (caches of run {runs[sizes.index(chosen)]}; the runs' machines differ)" if differ else "")


def build(table, metas) -> Plot:
    rows = default_timings(table, metas)
    if rows.empty:
        raise NoRows("no micro timings from a run without a parameter grid (make bench / make bench-quick)")
    data = stats.spread(rows, _KEYS, "ns_per_item")
    data["unit"] = "ns per item"
    data["item"] = data["op"].map(contract.item_name)
    ops = [op for op in _OPS if op in set(data["op"])] + sorted(set(data["op"]) - set(_OPS))
    ncols = min(3, len(ops))
    nrows = math.ceil(len(ops) / ncols)
    fig, axes = new_figure(nrows, ncols, panel=(4.6, 3.5))
    caches, caveat = _caches(data, metas)
    caps = sorted(set(data["capacity"]))
    handles = {}
    for i, op in enumerate(ops):
        ax = axes.flat[i]
        cell = data[data["op"] == op]
        for variant, line in cell.groupby("variant", sort=True):
            line = line.sort_values("capacity")
            colour, mark = palette.variant_colour(variant), palette.marker(variant)
            draw_median(ax, line["capacity"], line["median"], line["min"], line["max"], colour, marker=mark)
            first = line.iloc[0]
            label = palette.variant_label(variant, first["structure"], first["K"])
            handles.setdefault(variant, handle(label, colour, mark))
        capacity_axis(ax, caps)
        log_y(ax)
        lo, hi = min(caps) / 1.5, max(caps) * 1.5
        ax.set_xlim(lo, hi)
        for name, size in sorted(caches.items()):
            at = size / LEAF_BYTES
            if lo <= at <= hi:
                ax.axvline(at, color="0.5", linestyle=":", linewidth=1)
                ax.text(at, 0.98, f" {name} {_human(size)}", transform=ax.get_xaxis_transform(), rotation=90,
                        va="top", ha="right", fontsize=7, color="0.35")
        ax.grid(alpha=0.3, which="both")
        ax.set_title(op, fontsize=10)
        ax.set_ylabel(f"ns per {contract.item_name(op)}")
    for ax in axes.flat[len(ops):]:
        ax.set_visible(False)
    outside = [f"{n} {_human(s)} at capacity 2^{math.log2(s / LEAF_BYTES):.3g}"
               for n, s in sorted(caches.items()) if not min(caps) / 1.5 <= s / LEAF_BYTES <= max(caps) * 1.5]
    fig.suptitle("Cost per operation vs capacity: median over values, bars = min-max\n"
                 f"dotted: the capacity whose float32 leaf row (capacity x 4 B) fills that cache{caveat}"
                 + (f"\nbeyond the axis: {', '.join(outside)}" if outside else ""), fontsize=10)
    legend(fig, list(handles.values()), title="variant (structure, K)")
    data = data.sort_values(["op", "variant", "capacity"]).reset_index(drop=True)
    return Plot(fig, data, "Nanoseconds per item against capacity, log-log; dotted lines: where the float32 "
                           "leaf row fills L1d / L2 / L3 of the recorded machine. Each point is from the "
                           "newest run that measured it (the CSV names the run).")
