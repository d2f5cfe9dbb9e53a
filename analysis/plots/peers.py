"""Our variants against the peer libraries (cpprb, TorchRL, Tianshou): throughput ratios with spread.

Rows: the same timings as :mod:`.capacity` (runs without a parameter grid, default
parameters, newest run per cell). For each peer (a row of panels), op (a column) and capacity
(a group of bars): one bar per variant of ours, the ratio of its median throughput to the
peer's median in the *same run*, op, capacity and workload (> 1: ours is faster; log scale).
The error bar is the ratio's range over the values, ``[min ours / max peer, max ours / min
peer]``: where it crosses 1 the two overlap. The uniform baseline (no priorities) is left out.

A peer whose API adds one row per call (its description in meta.json ``variants`` says "one
transition per add": Tianshou) has no batched insert: its ``insert_batch`` cell is a loop of
single adds, so our batched call reads hundreds of times faster. Those bars are drawn as measured,
hatched, with the reason written in the panel and the caption (:func:`one_row_peers`), not hidden.
"""

from __future__ import annotations

import re
import textwrap

import numpy as np

from replaybench.analysis import markdown as md
from replaybench.analysis import palette, stats
from replaybench.bench import contract
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, log_y, new_figure, note, pow2
from replaybench.analysis.plots.capacity import default_timings

NAME = "peers"
ORDER = 60
TITLE = "Ours vs peer libraries"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("pal-kary-vs-baselines", "pal-microbench-tianshou")

_OPS = ["sample", "update", "insert_batch", "insert_one", "mixed"]
_WORKLOAD = ["batch", "transitions"]


def ratios(table, metas):
    """One row per (run, op, capacity, workload, variant, peer): medians, ranges and the ratio."""
    rows = default_timings(table, metas)
    rows = rows.assign(mixed_adds=rows["params"].map(lambda p: contract.params_of(p).get("mixed_adds")))
    keys = ["run_id", "op", "capacity", *_WORKLOAD, "mixed_adds"]
    cells = stats.spread(rows, [*keys, "variant", "structure", "K"], "items_per_s")
    is_peer = cells["variant"].str.startswith(contract.PEER_PREFIX)
    ours = cells[~is_peer & (cells["structure"] != "uniform")]
    peers = cells[is_peer]
    if ours.empty or peers.empty:
        return None
    both = ours.merge(peers, on=keys, suffixes=("", "_peer"))
    both = both.rename(columns={"variant_peer": "peer"})
    both["ratio"] = both["median"] / both["median_peer"]
    both["ratio_low"] = both["min"] / both["max_peer"]
    both["ratio_high"] = both["max"] / both["min_peer"]
    cols = [*keys, "variant", "structure", "K", "peer", "median", "min", "max", "n", "median_peer", "min_peer",
            "max_peer", "n_peer", "ratio", "ratio_low", "ratio_high"]
    return both[cols].sort_values(["peer", "op", "capacity", "variant"]).reset_index(drop=True)


#: Where a peer's recorded description says its add takes one row per call.
_ONE_ROW = re.compile(r"one (transition|row) per (add|call)", re.I)
#: Ops whose batched call meets a one-row-per-call peer as a loop of single calls.
_BATCHED_INSERTS = ("insert_batch",)


def one_row_peers(metas) -> set[str]:
    """The peers whose description (meta.json ``variants[peer].description``, any run) says their
    add takes one row per call."""
    return {name for meta in metas.values() for name, v in ((meta or {}).get("variants") or {}).items()
            if name.startswith(contract.PEER_PREFIX) and _ONE_ROW.search(str((v or {}).get("description") or ""))}


def build(table, metas) -> Plot:
    data = ratios(table, metas)
    if data is None or data.empty:
        raise NoRows("no run holds both our variants and a peer library (make bench runs them together)")
    data["unit"] = "ratio of throughputs (items/s)"
    peers = sorted(set(data["peer"]))
    single = one_row_peers(metas) & set(peers)
    data["one_row_api"] = data["peer"].isin(single) & data["op"].isin(_BATCHED_INSERTS)
    ops = [op for op in _OPS if op in set(data["op"])] + sorted(set(data["op"]) - set(_OPS))
    variants = sorted(set(data["variant"]), key=lambda v: (v not in palette.VARIANT_COLOURS, v))
    caps = sorted(set(data["capacity"]))
    fig, axes = new_figure(len(ops), len(peers), panel=(1.0 + 0.14 * len(variants) * len(caps), 2.6))
    width = 0.8 / len(variants)
    handles = {}
    for c, peer in enumerate(peers):
        for r, op in enumerate(ops):
            ax = axes[r, c]
            cell = data[(data["peer"] == peer) & (data["op"] == op)]
            ax.set_title(f"{op} vs {peer.removeprefix(contract.PEER_PREFIX)}", fontsize=9)
            log_y(ax)
            ax.set_axisbelow(True)
            ax.axhline(1.0, color="0.3", linewidth=0.9)
            ax.set_xticks(range(len(caps)), [pow2(c) for c in caps])
            ax.set_xlim(-0.5, len(caps) - 0.5)
            ax.grid(alpha=0.3, axis="y", which="both")
            if r == len(ops) - 1:
                ax.set_xlabel("capacity (transitions)")
            if c == 0:
                ax.set_ylabel(f"{op}: ours / peer")
            if cell.empty:
                note(ax, f"{peer} not measured on {op}")
                continue
            # bars on a log axis start at the bottom limit: put it below the smallest ratio
            ax.set_ylim(min(0.5, cell["ratio_low"].min() / 1.5), max(2.0, cell["ratio_high"].max() * 1.5))
            for i, variant in enumerate(variants):
                part = cell[cell["variant"] == variant]
                if part.empty:
                    continue
                x = np.array([caps.index(cap) for cap in part["capacity"]]) + i * width - 0.4 + width / 2
                colour = palette.variant_colour(variant)
                ratio = part["ratio"].to_numpy(float)
                err = [ratio - part["ratio_low"].to_numpy(float), part["ratio_high"].to_numpy(float) - ratio]
                loop = bool(part["one_row_api"].any())
                ax.bar(x, ratio, width, color=colour, hatch="xx" if loop else None, edgecolor="white" if loop else None,
                       linewidth=0)
                ax.errorbar(x, ratio, yerr=err, fmt="none", ecolor="0.2", elinewidth=0.8, capsize=1.5)
                first = part.iloc[0]
                handles.setdefault(variant, handle(palette.variant_label(variant, first["structure"], first["K"]),
                                                   colour, marker="s", linestyle=""))
            if cell["one_row_api"].any():
                name = peer.removeprefix(contract.PEER_PREFIX)
                text = (f"hatched: {name}'s add takes one row per call, so these bars are our batched insert "
                        f"over a loop of its single adds ({md.num(cell['ratio'].min())}-{md.num(cell['ratio'].max())}x): "
                        "the cost of its API, not of its tree")
                ax.text(0.97, 0.5, textwrap.fill(text, 30), transform=ax.transAxes, ha="right", va="center",
                        fontsize=7, color="0.25", in_layout=False)
    fig.suptitle("Our variants vs the peer libraries: median throughput ratio in the same run (> 1: ours faster);\n"
                 "bars = [min ours / max peer, max ours / min peer]", fontsize=10)
    legend(fig, list(handles.values()), title="variant (structure, K)")
    caption = ("Throughput of our variants over each peer library's, per op and capacity "
               "(log scale; error bars: the range over the values).")
    if single:
        caption += (" Hatched: " + ", ".join(p.removeprefix(contract.PEER_PREFIX) for p in sorted(single))
                    + " adds one row per call (its API has no batched insert), so its insert_batch cell is a loop "
                      "of single adds against our one batched call: the ratio measures that API, drawn as measured.")
    return Plot(fig, data, caption)
