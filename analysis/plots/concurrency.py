"""Concurrency: the scaling figure. Items/s against workers 1, 2, 4, ... on a log2 axis, one line per
policy, the ideal line through each line's first point, panels for learners, actors and a mixed split,
threads and processes apart (issue 42 item 4, the PAL and Ape-X papers' shape).

Rows: scenario ``concurrency``, ``ok``. A cell's rate is the *sample* rate when it has learners
(the learners' work; insert and sample items are never summed: with a fixed samples-per-insert
ratio the insert rate follows from it) and the insert rate for actors alone, at 1, 2, 4, ...
workers up to the run's cores (meta.json ``machine.usable_cpus``; and the cores themselves when
they are not a power of two): cells with more workers than cores, or other counts, are left
out here (the report's table has them). Panels (columns):
``learners`` (0 actors + n learners), ``actors`` (n actors alone) and ``mixed`` (n/2 of each,
the rounding giving learners the odd one); other splits of a run (the model grids of
``concurrency-scaling``) are not drawn here: the scaling model's figure has them. Rows of
panels: the modes, ``threads`` then ``processes``. Plotted: the median over the cell's windows,
min-max bars; log2 x up to the largest worker count drawn, log y.

**One run per line.** A line is (mode, panel, policy, variant, K, transition size, capacity,
batch) of ONE run: where several runs of the machine measured it, the run with the most worker
counts is drawn (then the newest by meta.json start time, then by run id), so a line never
joins points of two runs; the figure is drawn per machine (:mod:`analysis.__main__`), and the
machine is named in the title. Each line's dotted twin is its ideal: the first point's rate
times n / n0 (n0 = 1 for learners and actors alone, 2 for the mixed split). Hollow markers: a
cell the run marked oversubscribed (``params.oversubscribed``: more workers than cores, for
runs that do not say their cores). A panel without cells says so. tests/test_figure_lines.py
checks that no line of this or any figure joins two runs.

The report section keeps the per-split table (with the ratio to global-lock in the same run and
split), the one-worker serial shares and the Amdahl model's check per cell
(:mod:`bench.serial_share`), and what binds two learners (meta.json ``shared_path``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from replaybench.analysis import load, palette, stats
from replaybench.analysis import markdown as md
from replaybench.bench import contract, derive, serial_share
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, log_y, new_figure, note

NAME = "concurrency"
ORDER = 40
TITLE = "Concurrency: throughput vs workers"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("pal-sync", "pal-linear-scaling")

PANELS = ("learners", "actors", "mixed")
MODES = ("threads", "processes")
#: The columns of this figure's data that make one drawn line (one run each).
LINE = ["run_id", "mode", "panel", "policy", "variant", "K", "transitions", "capacity", "batch"]
BASELINE = "global-lock"
_CONFIG = ["run_id", "variant", "structure", "K", "policy", "capacity", "batch", "transitions", "mode", "actors",
           "learners"]


def _oversubscribed(params) -> bool:
    return bool(contract.params_of(params).get("oversubscribed"))


def panel_of(actors: int, learners: int) -> str | None:
    """``learners``, ``actors``, ``mixed`` (n/2 each, learners taking the odd one) or None."""
    if actors == 0 and learners > 0:
        return "learners"
    if learners == 0 and actors > 0:
        return "actors"
    if actors > 0 and learners > 0 and learners - actors in (0, 1):
        return "mixed"
    return None


def _rates(table) -> pd.DataFrame:
    """The work rate of every ``ok`` window: sample items/s with learners, insert items/s without."""
    rows = table[(table["scenario"] == "concurrency") & (table["status"] == "ok") & (table["metric"] == "items_per_s")]
    if rows.empty:
        return rows
    learners = rows["learners"].astype(float).fillna(0)
    rows = rows[((learners > 0) & (rows["op"] == "sample")) | ((learners == 0) & (rows["op"] == "insert"))].copy()
    rows["actors"] = rows["actors"].astype(float).fillna(0).astype(int)
    rows["learners"] = rows["learners"].astype(float).fillna(0).astype(int)
    return rows


def _cores(meta) -> int:
    """The run's usable cores (meta.json ``machine.usable_cpus``), 0 when it does not say."""
    try:
        return int(((meta or {}).get("machine") or {}).get("usable_cpus") or 0)
    except (TypeError, ValueError):
        return 0


def _start(meta) -> str:
    return str((meta or {}).get("start_time") or "")


def points(table, metas) -> pd.DataFrame:
    """The figure's points (one per line and worker count) with their ideal, one run per line."""
    rows = _rates(table)
    if rows.empty:
        return rows
    rows = rows.assign(panel=[panel_of(a, l_) for a, l_ in zip(rows["actors"], rows["learners"])])
    rows = rows[rows["panel"].notna()]
    if rows.empty:
        return rows
    rows = rows.assign(workers=rows["actors"] + rows["learners"], oversubscribed=rows["params"].map(_oversubscribed))
    cores = rows["run_id"].map(lambda r: _cores(metas.get(r)))
    n = rows["workers"]
    keep = (((n & (n - 1)) == 0) | (n == cores)) & ((cores == 0) | (n <= cores))  # 1, 2, 4, ... up to the cores
    rows = rows[keep]
    if rows.empty:
        return rows
    keys = [*LINE, "actors", "learners", "workers"]
    data = stats.spread(rows, keys, "value")
    over = rows.groupby(keys, dropna=False)["oversubscribed"].max().reset_index()
    data = data.merge(over, on=keys, how="left")
    # one run per line: the one with the most worker counts, then the newest
    line = [k for k in LINE if k != "run_id"]
    counts = data.groupby([*line, "run_id"], dropna=False)["workers"].nunique().rename("counts").reset_index()
    counts["start"] = counts["run_id"].map(lambda r: _start(metas.get(r)))
    counts = counts.sort_values(["counts", "start", "run_id"], ascending=False)
    chosen = counts.drop_duplicates(subset=line, keep="first")[[*line, "run_id"]]
    data = data.merge(chosen, on=[*line, "run_id"], how="inner")
    data["machine"] = data["run_id"].map(lambda r: load.machine_of(metas.get(r) or {}))
    first = (data.sort_values("workers").groupby(LINE, dropna=False)[["workers", "median"]].first()
             .rename(columns={"workers": "n0", "median": "rate0"}).reset_index())
    data = data.merge(first, on=LINE, how="left")
    data["ideal"] = data["rate0"] * data["workers"] / data["n0"]
    data["unit"] = "items/s"
    return (data.drop(columns=["rate0"]).sort_values([*LINE, "workers"], key=lambda c: c.astype(str) if c.dtype == object else c)
            .reset_index(drop=True))


def build(table, metas) -> Plot:
    data = points(table, metas)
    if data.empty:
        raise NoRows("no concurrency cells of learners alone, actors alone or half and half (scenario 'concurrency')")
    modes = [m for m in MODES if m in set(data["mode"])] + sorted(set(data["mode"].dropna()) - set(MODES))
    panels = [p for p in PANELS if p in set(data["panel"])]
    fig, axes = new_figure(len(modes), len(panels), panel=(4.2, 3.3))
    present = set(data["transitions"].dropna())
    sizes = [t for t in ("cartpole", "mujoco", "atari") if t in present] + sorted(present - {"cartpole", "mujoco", "atari"})
    variants = sorted(set(data["variant"].dropna()))
    handles = {}
    top = int(data["workers"].max())
    ticks = [1 << k for k in range(top.bit_length()) if 1 << k <= top] + ([top] if top & (top - 1) else [])
    for r, mode in enumerate(modes):
        for c, panel in enumerate(panels):
            ax = axes[r, c]
            cell = data[(data["mode"] == mode) & (data["panel"] == panel)]
            for key, line in cell.groupby(LINE, dropna=False, sort=True):
                k = dict(zip(LINE, key))
                line = line.sort_values("workers")
                colour = palette.policy_colour(k["policy"])
                mark = palette.marker(k["variant"]) if len(variants) > 1 else "o"
                style = ("-", "--", "-.", ":")[min(3, sizes.index(k["transitions"]))] if k["transitions"] in sizes else "-"
                x = line["workers"].to_numpy(float)
                med = line["median"].to_numpy(float) / 1e6
                err = [med - line["min"].to_numpy(float) / 1e6, line["max"].to_numpy(float) / 1e6 - med]
                ax.errorbar(x, med, yerr=err, color=colour, linestyle=style, marker="none", capsize=2, linewidth=1.3)
                hollow = line["oversubscribed"].fillna(False).to_numpy(bool)
                ax.plot(x[~hollow], med[~hollow], linestyle="none", marker=mark, color=colour, markersize=5)
                ax.plot(x[hollow], med[hollow], linestyle="none", marker=mark, markerfacecolor="white",
                        markeredgecolor=colour, markersize=5)
                ax.plot(x, line["ideal"].to_numpy(float) / 1e6, color=colour, linestyle=":", linewidth=0.9)
                label = k["policy"] + (f" ({palette.variant_label(k['variant'], K=k['K'])})" if len(variants) > 1 else "")
                label += f", {k['transitions']}" if len(sizes) > 1 else ""
                handles.setdefault(label, handle(label, colour, mark, style))
            if cell.empty:
                note(ax, f"no {mode} cells of this split")
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
            ax.set_xlim(0.8, top * 1.25)
            if not cell.empty:
                log_y(ax)
            ax.grid(alpha=0.3, which="both")
            what = {"learners": "learners alone (sample + update)", "actors": "actors alone (insert)",
                    "mixed": "n/2 actors + n/2 learners"}[panel]
            ax.set_title(f"{mode}: {what}", fontsize=9)
            if c == 0:
                ax.set_ylabel("M items/s (sample; insert\nfor actors alone)")
            if r == len(modes) - 1:
                ax.set_xlabel("workers")
    machines = sorted(set(data["machine"]))
    runs = sorted(set(data["run_id"]))
    fig.suptitle(f"Machine {', '.join(machines)}: median over windows, bars = min-max; dotted = ideal through the "
                 f"first point;\nworkers up to the cores; one run per line ({len(runs)} run(s))", fontsize=9)
    legend(fig, list(handles.values()), title="policy")
    return Plot(fig, data, "Items/s against workers (log2) per policy, learners, actors and half and half, threads "
                           "and processes apart, each line one run of one machine, with the ideal line through its "
                           "first point.")


def aggregate(table) -> pd.DataFrame:
    """Per configuration and repeat: the work rate (sample items/s; insert items/s when the
    cell has no learners), its ratio to global-lock's median in the same run and split, the
    mean lock wait, the oversubscribed flag (the report's table; every split, newest run per cell)."""
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


def _split_table(table) -> pd.DataFrame:
    """Per run, configuration and split: the median rate and ratio to global-lock (the report's table)."""
    agg = aggregate(table)
    if agg.empty:
        return agg
    keys = [*_CONFIG, "workers"]
    rate = stats.spread(agg.dropna(subset=["items_per_s"]), keys, "items_per_s")
    ratio = agg.groupby(keys, dropna=False)["x_global_lock"].median().rename("x_global_lock").reset_index()
    return rate.merge(ratio, on=keys, how="left")


def report_section(data: pd.DataFrame | None, res, drawn: Mapping[str, pd.DataFrame]) -> list[str]:
    """The report's concurrency sections: throughput per actor/learner split with the ratio to
    global-lock (every split, per run), the serial shares and the Amdahl model's check
    (:func:`serial_share_section`), and what binds two learners (:func:`shared_path_section`)."""
    if data is None:
        return []
    rate = _split_table(res.table)
    body = []
    for key, g in rate.groupby(_CONCURRENCY_KEY, dropna=False, sort=True):
        g = g.sort_values(["workers", "actors"])
        cells = []
        for a, l_, m, x in zip(g["actors"], g["learners"], g["median"], g["x_global_lock"]):
            cells.append(f"{int(a)}A+{int(l_)}L: {md.num(m / 1e6)}" + (f" ({x:.2f}x)" if pd.notna(x) else ""))
        body.append([*(("-" if pd.isna(k) else str(k)) for k in key), ", ".join(cells)])
    return (["## Concurrency", "", "Sample throughput (M transitions/s, median over repeats; insert throughput for "
             "actors alone: the two are never summed) per actor/learner split, and in brackets the ratio to "
             "global-lock in the same run and split. The figure draws the learners-alone, actors-alone and "
             "half-and-half splits against workers, one run per line.", ""]
            + md.table(["run", "transitions", "variant", "policy", "mode", "split: M items/s (x global-lock)"], body)
            + [""] + line_transfer_section(res.table) + serial_share_section(res.table, res.metas)
            + shared_path_section(rate, res.metas))


def line_transfer_section(table: pd.DataFrame) -> list[str]:
    """Per run with the cells' ``line_transfer_ns_before`` / ``_after`` rows (bench.line_transfer):
    the range of a cache line's trip between two cores over its cells, and the cells measured
    next to a trip of more than twice the run's fastest (where a VM's vCPUs sat apart). ``[]``
    without such rows."""
    rows = table[(table["scenario"] == "concurrency") & (table["status"] == "ok")
                 & table["metric"].isin(["line_transfer_ns_before", "line_transfer_ns_after"])]
    out = []
    for run_id, g in rows.groupby("run_id", sort=True):
        fastest = g["value"].min()
        worst = g.groupby(["transitions", "policy", "mode", "actors", "learners"], dropna=False)["value"].max()
        slow = [f"{t} {p} {m} {int(a)}A+{int(l_)}L ({v:.0f})" for (t, p, m, a, l_), v in worst.items()
                if v > 2 * fastest]
        out += [f"Run `{run_id}`: a cache line's trip between two cores, before and after each cell, took "
                f"{fastest:.0f}-{g['value'].max():.0f} ns (median {g['value'].median():.0f}); "
                + (f"{len(slow)} of {len(worst)} cells next to a trip over twice the fastest (the vCPUs apart: "
                   f"ratios of shared lines read low there): {', '.join(slow)}." if slow
                   else "no cell next to a trip over twice the fastest."),
                ""]
    return out


def serial_share_section(table: pd.DataFrame, metas: Mapping[str, Mapping]) -> list[str]:
    """Per run with the per-call rows: the one-worker accounts of a learner step and an actor
    insert and Amdahl's bound at 16 (:func:`bench.serial_share.one_worker_shares`), then the
    model those shares set against every cell of the run (:func:`bench.serial_share.predict_cells`):
    how far off each cell is, and for a miss the account that explains it. ``[]`` without such runs."""
    rows = table[(table["scenario"] == "concurrency")]
    out = []
    for run_id in sorted(set(rows["run_id"])):
        records = rows[rows["run_id"] == run_id].replace({np.nan: None}).to_dict("records")
        try:
            shares = serial_share.one_worker_shares(records)
        except ValueError as err:  # accounts that do not sum: say so rather than print wrong shares
            out += [f"Serial shares of run `{run_id}`: not shown: {err}", ""]
            continue
        if not shares:
            continue
        at = shares[0]["at"]
        body = [[e["transitions"], e["variant"], e["policy"], e["mode"],
                 "learner step" if e["op"] == "iteration" else "actor insert", f"{1e6 * e['call_s']:.1f}",
                 f"{1e6 * e['exclusive_s']:.1f}", f"{1e6 * e['wait_s']:.2f}", f"{1e6 * e['parallel_s']:.1f}",
                 f"{100 * e['share']:.0f}%", f"{e['amdahl']:.1f}x"] for e in shares]
        out += [f"Serial share (run `{run_id}`, machine `{load.machine_of(metas.get(run_id) or {})}`): with one "
                "worker, a call's time (us) split into sections that exclude every other worker (the tree lock "
                "held exclusively), lock wait and the rest, which runs in parallel; the share is exclusive over "
                f"the call, and Amdahl's bound at {at} workers is 1 / (share + (1 - share) / {at}) "
                "(bench/serial_share.py).", ""]
        out += md.table(["transitions", "variant", "policy", "mode", "op", "call us", "exclusive us", "wait us",
                         "parallel us", "serial share", f"Amdahl at {at}"], body) + [""]
        cores = int(((metas.get(run_id) or {}).get("machine") or {}).get("usable_cpus") or 0) or 1
        checked = []
        for e in shares:
            if e["op"] != "iteration":
                continue
            where = {k: e[k] for k in ("variant", "policy", "mode", "transitions")}
            try:
                cells = serial_share.predict_cells(records, cores, **where)
            except ValueError:
                continue
            predicted = [c for c in cells if not c["input"]]
            within = sum(abs(c["error"]) <= serial_share.MISS for c in predicted)
            cell_text = ", ".join(f"{c['actors']}A+{c['learners']}L {100 * c['error']:+.0f}%"
                                  + (f" ({c['term']})" if c["term"] else "") for c in cells if not c["input"])
            checked.append([e["transitions"], e["policy"], e["mode"], f"{within}/{len(predicted)}", cell_text])
        if checked:
            out += [f"The model these shares set (inputs: the 1-actor and 1-learner cells; each call waits one "
                    f"exclusive section of every other worker), checked against every other cell of the run on "
                    f"its {cores} cores: error = predicted / measured - 1; within 25% counted; a miss names the "
                    "account that moved furthest from the model (exclusive: the section grew with contention; "
                    "parallel: the unlocked work slowed; wait: queueing beyond the sections; rate: the rate "
                    "limiter).", ""]
            out += md.table(["transitions", "policy", "mode", "within 25%", "error per cell (term of a miss)"],
                            checked) + [""]
    return out


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
                         "/".join(f"{x:.0f}" for x in e["line_transfer_ns"]) if e.get("line_transfer_ns") else "-",
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
                "compiled is bound by sharing; one near it compiled but not in Python is bound by the GIL. "
                "Line ns: a cache line's trip between two cores right before and after the compiled figures "
                "(bench/line_transfer.py; '-' where the run predates it): on a VM whose vCPUs sat on cores "
                "sharing no cache, every line both threads write costs that much more.", ""]
        out += md.table(["transitions", "variant", "policy", "step x local", "GIL bound", "GIL 2T x 1 here",
                         "kernel 2T x 1 own buffers",
                         "kernel 2T x 1", "line ns", "threads 2 x 1", "processes 2 x 1"], body) + [""]
    return out


_CONCURRENCY_KEY = ["run_id", "transitions", "variant", "policy", "mode"]
