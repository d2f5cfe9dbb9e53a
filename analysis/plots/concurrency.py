"""Concurrency: per-op throughput, the ratio to global-lock and lock wait against the worker split.

Rows: scenario ``concurrency``, newest run per cell. Each repeat of a configuration (variant,
policy, transitions, capacity, batch, mode, actors, learners) gives ``items_per_s`` per op
kind and a ``lock_wait_fraction``. Plotted per repeat: the *sample* rate (the learners' work;
insert and sample items are never summed: with a fixed samples-per-insert ratio the insert
rate follows from it), and for a cell without learners the insert rate; the ratio of that
rate to global-lock's median in the same run, mode, size and split; the lock wait (mean of
the repeat's fractions). Runs made before the redesign (no ratio kept between actors and
learners) load and draw the same way. Plotted: the median over repeats, min-max bars.

One column of panels per transition size (cartpole ~45 B, mujoco, atari ~28 KB); rows:
throughput (linear: within a panel it spans well under 10x), ratio to global-lock, lock wait. The x axis
is categorical: one evenly spaced tick per worker split (``2A+1L``: 2 actors, 1 learner),
ordered by the number of workers and then of writers, so grids of any size (1-2 workers on the
project machines, up to 16 on larger ones) stay readable. Colour = policy, line style = mode
(threads solid, processes dashed), marker = variant. Hollow markers: oversubscribed (more workers
than cores; the rows' params say ``"oversubscribed": true``); the dotted line falls where the
number of workers passes the machine's cores.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from replaybench.analysis import load, palette, stats
from replaybench.analysis import markdown as md
from replaybench.bench import contract, derive
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, new_figure

NAME = "concurrency"
ORDER = 40
TITLE = "Concurrency: throughput vs workers"

_SIZES = ["cartpole", "mujoco", "atari"]
BASELINE = "global-lock"
#: (metric, column of :func:`aggregate`, y label, scale)
_METRICS = [("items_per_s", "items_per_s", "work rate (M items/s:\nsample; insert without learners)", 1e6),
            ("x_global_lock", "x_global_lock", "x global-lock\n(same run and split)", 1.0),
            ("lock_wait_fraction", "lock_wait_fraction", "lock wait (fraction of time)", 1.0)]
_CONFIG = ["run_id", "variant", "structure", "K", "policy", "capacity", "batch", "transitions", "mode", "actors",
           "learners"]


def _oversubscribed(params) -> bool:
    return bool(contract.params_of(params).get("oversubscribed"))


def aggregate(table) -> pd.DataFrame:
    """Per configuration and repeat: the work rate (sample items/s; insert items/s when the
    cell has no learners), its ratio to global-lock's median in the same run and split, the
    mean lock wait, the oversubscribed flag."""
    rows = table[(table["scenario"] == "concurrency") & (table["status"] == "ok")]
    rows = load.latest_per_cell(rows, load.CELL_COLUMNS)  # newest run per cell, of any suite
    if rows.empty:
        return rows
    rows = rows.assign(oversubscribed=rows["params"].map(_oversubscribed))
    keys = [*_CONFIG, "repeat"]
    learners = rows["learners"].astype(float).fillna(0)
    work = rows[(rows["metric"] == "items_per_s")
                & (((learners > 0) & (rows["op"] == "sample")) | ((learners == 0) & (rows["op"] == "insert")))]
    agg = work.groupby(keys, dropna=False).agg(items_per_s=("value", "first"), op=("op", "first"),
                                               oversubscribed=("oversubscribed", "max")).reset_index()
    split = [k for k in _CONFIG if k != "policy"]
    base = (agg[agg["policy"] == BASELINE].groupby(split, dropna=False)["items_per_s"].median()
            .rename("baseline").reset_index())
    agg = agg.merge(base, on=split, how="left")
    agg["x_global_lock"] = agg["items_per_s"] / agg["baseline"]
    wait = rows[rows["metric"] == "lock_wait_fraction"].groupby(keys, dropna=False)["value"].mean()
    agg = agg.merge(wait.rename("lock_wait_fraction").reset_index(), on=keys, how="outer")
    agg["workers"] = agg["actors"].astype(float).fillna(0) + agg["learners"].astype(float).fillna(0)
    return agg.drop(columns="baseline")


def _splits(rows) -> pd.Series:
    """``(writers, learners)`` of each row, as ints."""
    return pd.Series([(int(a or 0), int(l_ or 0)) for a, l_ in zip(rows["actors"].fillna(0), rows["learners"].fillna(0))],
                     index=rows.index)


def build(table, metas) -> Plot:
    agg = aggregate(table)
    if agg.empty:
        raise NoRows("no concurrency rows (scenario 'concurrency')")
    keys = [*_CONFIG, "workers"]
    parts = [stats.spread(agg.dropna(subset=[column]), keys, column).assign(metric=metric, unit=unit)
             for (metric, column, _, _), unit in zip(_METRICS, ("items/s", "1", "1"))
             if agg[column].notna().any()]
    over = agg.groupby(keys, dropna=False)["oversubscribed"].max().reset_index()
    data = pd.concat(parts, ignore_index=True)
    data = data.merge(over, on=keys, how="left")
    line_key = ["variant", "K", "policy", "mode", "capacity", "batch"]
    present = set(data["transitions"].dropna())
    sizes = [s for s in _SIZES if s in present] + sorted(present - set(_SIZES))
    metrics = [m for m, _, _, _ in _METRICS if m in set(data["metric"])]
    labels = {m: (label, scale) for m, _, label, scale in _METRICS}
    fig, axes = new_figure(len(metrics), len(sizes), panel=(4.6, 3.4))
    modes = sorted(set(data["mode"].dropna()))
    variants = sorted(set(data["variant"]))
    cores = {int((m.get("machine") or {}).get("usable_cpus") or 0) for r, m in metas.items()
             if r in set(data["run_id"])} - {0}
    handles = {}
    for c, size in enumerate(sizes):
        for r, metric in enumerate(metrics):
            ax = axes[r, c]
            cell = data[(data["transitions"] == size) & (data["metric"] == metric)]
            splits = sorted(set(_splits(cell)), key=lambda wl: (sum(wl), wl[0]))
            position = {wl: i for i, wl in enumerate(splits)}
            for key, line in cell.groupby(line_key, dropna=False, sort=True):
                k = dict(zip(line_key, key))
                line = line.assign(x=_splits(line).map(position)).sort_values("x")
                colour = palette.policy_colour(k["policy"])
                style = "--" if len(modes) > 1 and k["mode"] == "processes" else "-"
                mark = palette.marker(k["variant"]) if len(variants) > 1 else "o"
                scale = labels[metric][1]  # throughput drawn in M items/s
                x, med = line["x"].to_numpy(float), line["median"].to_numpy(float) / scale
                err = [med - line["min"].to_numpy(float) / scale, line["max"].to_numpy(float) / scale - med]
                ax.errorbar(x, med, yerr=err, color=colour, linestyle=style, marker="none", capsize=2, linewidth=1.3)
                hollow = line["oversubscribed"].fillna(False).to_numpy(bool)
                ax.plot(x[~hollow], med[~hollow], linestyle="none", marker=mark, color=colour, markersize=5)
                ax.plot(x[hollow], med[hollow], linestyle="none", marker=mark, markerfacecolor="white",
                        markeredgecolor=colour, markersize=5)
                label = k["policy"]
                what = palette.variant_label(k["variant"], K=k["K"]) + (f", {k['mode']}" if len(modes) > 1 else "")
                label += f" ({what})"
                handles.setdefault(label, handle(label, colour, mark, style))
            if splits:
                ax.set_xticks(range(len(splits)), [f"{w}A+{l_}L" for w, l_ in splits],
                              rotation=30 if len(splits) > 4 else 0, fontsize=8)
            for n in cores:
                within = [i for i, wl in enumerate(splits) if sum(wl) <= n]
                if within and within[-1] < len(splits) - 1:  # some split has more workers than cores
                    ax.axvline(within[-1] + 0.5, color="0.5", linestyle=":", linewidth=1)
                    ax.text(within[-1] + 0.5, 0.98, f" {n} cores", transform=ax.get_xaxis_transform(), va="top",
                            fontsize=7, color="0.35")
            ax.grid(alpha=0.3, which="both")
            ax.set_title(f"{size} transitions", fontsize=10)
            label, scale = labels[metric]
            top = float(np.nanmax(cell["max"])) / scale * 1.1 if not cell.empty else 1.0
            ax.set_ylim(0, max(0.05, top))  # within a panel the values span < 10x: linear
            ax.set_ylabel(label)
            if metric == "x_global_lock":
                ax.axhline(1.0, color="0.5", linewidth=0.8)
            if r == len(metrics) - 1:
                ax.set_xlabel("workers: A actors (insert) + L learners (sample + update)")
    fig.suptitle("Concurrency: median over repeats, bars = min-max;" + ("\n" if len(sizes) == 1 else " ")
                 + "hollow markers: more workers than cores", fontsize=10)
    legend(fig, list(handles.values()), title="policy (variant, K)")
    data = data.sort_values(["metric", "transitions", "policy", "variant", "workers"]).reset_index(drop=True)
    return Plot(fig, data, "Sample throughput (insert throughput for actors alone; never summed), its ratio to "
                           "global-lock in the same split, and the lock-wait fraction against the actor/learner "
                           "split, per policy and transition size.")


def report_section(data: pd.DataFrame | None, res, drawn: Mapping[str, pd.DataFrame]) -> list[str]:
    """The report's concurrency table (throughput per actor/learner split) from this figure's data."""
    if data is None:
        return []
    rate = data[data["metric"] == "items_per_s"]
    # several runs may hold the same cell (concurrency and concurrency-scaling): one ratio per cell
    ratio = (data[data["metric"] == "x_global_lock"]
             .groupby([*_CONCURRENCY_KEY, "actors", "learners"], dropna=False)["median"].median())
    body = []
    for key, g in rate.groupby(_CONCURRENCY_KEY, dropna=False, sort=True):
        g = g.sort_values(["workers", "actors"])
        cells = []
        for a, l_, m in zip(g["actors"], g["learners"], g["median"]):
            x = ratio.get((*key, a, l_))
            cells.append(f"{int(a)}A+{int(l_)}L: {md.num(m / 1e6)}" + (f" ({x:.2f}x)" if x is not None and pd.notna(x) else ""))
        body.append([*(("-" if pd.isna(k) else str(k)) for k in key), ", ".join(cells)])
    return (["## Concurrency", "", "Sample throughput (M transitions/s, median over repeats; insert throughput for "
             "actors alone: the two are never summed) per actor/learner split, and in brackets the ratio to "
             "global-lock in the same run and split.", ""]
            + md.table(["transitions", "variant", "policy", "mode", "split: M items/s (x global-lock)"], body) + [""]
            + shared_path_section(rate, res.metas))


def shared_path_section(rate: pd.DataFrame, metas: Mapping[str, Mapping]) -> list[str]:
    """Per run that measured it (meta.json ``shared_path``: bench.scenarios.concurrency), what
    binds two learners on one buffer, per policy: one shared learner step over the in-process
    buffer's, the GIL's bound, two threads' compiled steps
    over one thread's (median, min-max), and the run's own two learners over one (sample/s
    medians over repeats), as threads and as processes. ``[]`` when no run has it."""
    out = []
    for run_id in sorted(metas):
        shared = (metas[run_id] or {}).get("shared_path")
        if not shared:
            continue
        mine = rate[(rate["run_id"] == run_id) & (rate["actors"].astype(float) == 0)]

        def measured(e, mode):
            g = mine[(mine["policy"] == e["policy"]) & (mine["variant"] == e["variant"])
                     & (mine["transitions"] == e["transitions"]) & (mine["mode"] == mode)]
            one, two = (g.loc[g["learners"].astype(float) == n, "median"] for n in (1, 2))
            return f"{two.iloc[0] / one.iloc[0]:.2f}" if len(one) and len(two) and one.iloc[0] else "-"

        def compiled(k):
            return f"{k['ratio']:.2f} ({k['ratio_min']:.2f}-{k['ratio_max']:.2f})" if k else "-"

        body = []
        for e in shared:
            body.append([e["transitions"], e["variant"], e["policy"],
                         derive.step_over_local_cell(e),
                         f"{e['gil_bound']:.2f}" if e.get("gil_bound") is not None else "-",
                         compiled(e.get("gil_pair")), compiled(e.get("kernel_private")), compiled(e.get("kernel")),
                         measured(e, "threads"), measured(e, "processes")])
        out += [f"What binds two learners on one buffer (run `{run_id}`): one learner step (sample + update) on the "
                "shared buffer over the same calls on the in-process buffer (step x local); the GIL's bound "
                "2 / (1 + the share of a "
                "learner step that holds it); what two threads holding the GIL for that share of a step of that "
                "length get here with nothing else shared (GIL 2T x 1 here, handing the GIL over included: a "
                "thread that wants it while the other holds it sleeps until it is woken); two threads' "
                "compiled learner steps over one thread's (no Python; "
                "median, min-max), each thread on a buffer of its own (nothing shared: what this machine's two "
                "cores give such learners, the bound of the figures right of it; '-' where the run predates it) "
                "and both on one buffer (the policy's locks and the lines both write); and the run's two learners "
                "over one (sample/s), as threads and as processes. A policy well below its own-buffers figure "
                "compiled is bound by sharing; one near it compiled but not in Python is bound by the GIL.", ""]
        out += md.table(["transitions", "variant", "policy", "step x local", "GIL bound", "GIL 2T x 1 here",
                         "kernel 2T x 1 own buffers",
                         "kernel 2T x 1", "threads 2 x 1", "processes 2 x 1"], body) + [""]
    return out


_CONCURRENCY_KEY = ["transitions", "variant", "policy", "mode"]
