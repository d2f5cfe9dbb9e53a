"""Time to a good policy (the learning scenario): per task, each configuration's time to
threshold against its worker processes, the best sequential configuration as a dotted line and
each peer framework's trainer as a band.

Rows: scenario ``learning``, op ``learning``, of every learning run, one panel per run and task
(a figure never joins two runs: the same task measured by two runs is two panels, each with
that run's own best sequential configuration). Per configuration over its seeds (:mod:`bench.time_to_policy`): the median time with
its interquartile range, censored seeds (no snapshot held the threshold within the budget)
counted as longer than any finished one; a configuration whose median is censored is drawn at
the top of the panel as a hollow marker. x: worker processes (1 for the sequential loop and the
peers; actors + learners for a parallel layout).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from replaybench.analysis import markdown as md
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, new_figure
from replaybench.bench import time_to_policy as ttp

NAME = "time_to_policy"
ORDER = 40
TITLE = "Time to a good policy"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("pal-convergence",)

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
#: The peers' bands, one shade per peer configuration (the last of ours' colours, where ours are many).
_PEER_SHADES = ("#ff7f0e", "#7f7f7f", "#bcbd22", "#17becf")


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, task, configuration) of the learning runs, in run order: layout,
    workers, k/n, median and quartiles (inf: not reached by that share of seeds), env steps and
    updates to threshold, final policies holding, and the per-seed speedup over the run's best
    sequential configuration for that task (median of the seeds both reached)."""
    rows = table[(table["scenario"] == "learning") & (table["op"] == "learning")]
    if rows.empty:
        raise NoRows("no learning runs (scenario learning)")
    out = []
    for run_id in sorted(set(rows["run_id"].astype(str))):
        out += _run_summary(run_id, rows[rows["run_id"] == run_id].to_dict("records"))
    return pd.DataFrame(out)


def _run_summary(run_id: str, records: list[dict]) -> list[dict]:
    outs, kinds = ttp.outcomes(records), ttp.layouts(records)
    workers = {ttp.config_key(r): (r.get("actors") or 0) + (r.get("learners") or 0) or 1 for r in records}
    out = []
    for task in sorted({k[:2] for k in outs}):
        seq = {k[2]: v for k, v in outs.items() if k[:2] == task and kinds[k] == "sequential"}
        best = ttp.best_reference(seq)
        for key in sorted((k for k in outs if k[:2] == task), key=lambda k: (kinds[k] != "sequential",
                                                                             kinds[k] == "peer", k[2])):
            s = ttp.summarize(outs[key])
            exact = [x for _, rel, x in ttp.per_seed_speedups(seq[best], outs[key]) if rel == "="] if (
                best is not None and key[2] != best) else []
            out.append({"run_id": run_id, "algo": task[0], "env": task[1], "config": key[2], "layout": kinds[key],
                        "workers": workers[key], "n": s.n, "reached": s.reached, "median_s": s.median_s,
                        "q1_s": s.q1_s, "q3_s": s.q3_s, "env_steps": s.median_env_steps,
                        "updates": s.median_updates, "final_holds": s.final_holds,
                        "best_sequential": best, "x_best_sequential": float(np.median(exact)) if exact else math.nan})
    return out


def build(table, metas) -> Plot:
    data = summary(table)
    panels = list(dict.fromkeys(zip(data["run_id"], data["algo"], data["env"])))  # (run, task), in run order
    ncols = min(2, len(panels))
    fig, axes = new_figure(math.ceil(len(panels) / ncols), ncols, panel=(5.0, 3.6))
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    handles = {}
    names = sorted(set(data.loc[data["layout"] != "peer", "config"]))
    colours = {name: _COLOURS[i % len(_COLOURS)] for i, name in enumerate(names)}  # one colour per config
    peers = sorted(set(data.loc[data["layout"] == "peer", "config"]))
    shades = {name: _PEER_SHADES[i % len(_PEER_SHADES)] for i, name in enumerate(peers)}  # in every panel alike
    for ax, (run_id, algo, env) in zip(axes.flat, panels):
        cell = data[(data["run_id"] == run_id) & (data["algo"] == algo) & (data["env"] == env)]
        finite = cell.loc[np.isfinite(cell["median_s"]), "q3_s"]
        top = max([v for v in finite if math.isfinite(v)] + [v for v in cell["median_s"] if math.isfinite(v)] + [1.0])
        ceiling = top * 1.15
        best = cell["best_sequential"].iloc[0]
        ours = cell[cell["layout"] != "peer"].reset_index(drop=True)
        for i, r in ours.iterrows():
            colour = colours[r["config"]]
            x = r["workers"] + (i - (len(ours) - 1) / 2) * 0.06
            reached = math.isfinite(r["median_s"])
            y = r["median_s"] if reached else ceiling
            lo = r["q1_s"] if math.isfinite(r["q1_s"]) else ceiling
            hi = r["q3_s"] if math.isfinite(r["q3_s"]) else ceiling
            ax.errorbar([x], [y], yerr=[[y - min(lo, y)], [max(hi, y) - y]], fmt="o", color=colour,
                        mfc=colour if reached else "none", capsize=3, linewidth=1.0)
            ax.annotate(f"{r['reached']}/{r['n']}", (x, y), textcoords="offset points", xytext=(4, 3), fontsize=6,
                        color=colour)
            handles.setdefault(r["config"], handle(r["config"], colour))
        if best is not None and (ours["config"] == best).any():
            ref = ours[ours["config"] == best].iloc[0]
            if math.isfinite(ref["median_s"]):
                ax.axhline(ref["median_s"], color="black", linestyle=":", linewidth=1.0)
        for j, r in enumerate(cell[cell["layout"] == "peer"].itertuples()):
            shade = shades[r.config]
            if math.isfinite(r.median_s):
                hi = r.q3_s if math.isfinite(r.q3_s) else ceiling
                ax.axhspan(r.q1_s, hi, color=shade, alpha=0.18)
                ax.axhline(r.median_s, color=shade, linewidth=1.0)
            ax.annotate(f"{r.config} {r.reached}/{r.n}" + ("" if math.isfinite(r.median_s) else " (median not reached)"),
                        (0.98, 0.03 + 0.06 * j), xycoords="axes fraction", fontsize=6, color=shade, ha="right")
            handles.setdefault(f"peer {r.config}", handle(f"{r.config} (peer)", shade))
        ax.set_ylim(0, ceiling * 1.05)
        xs = sorted(set(ours["workers"]))
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
        ax.set_xlabel("worker processes (actors + learners; 1: sequential)")
        ax.set_ylabel("seconds to threshold (median, IQR)")
        ax.set_title(f"{env} ({algo}), run {run_id}\ndotted: best sequential ({best})", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("Time to threshold, greedy evaluation of snapshots, one panel per run and task\n"
                 "k/n: seeds reached; hollow: median not reached (censored), drawn at the top", fontsize=9)
    legend(fig, list(handles.values()), title="configuration")
    return Plot(fig, data, "Median seconds to the first weight snapshot whose greedy evaluation holds the "
                           "threshold, with the interquartile range over seeds (censored seeds counted); bands: "
                           "the peers' trainers, same protocol, same run.")


def report_section(data, res, drawn) -> list[str]:
    if data is None or data.empty:
        return []

    def s(x):
        return "not reached" if not math.isfinite(x) else md.num(x)

    out = ["### Time to a good policy", "",
           "Scenario learning: weight snapshots evaluated greedily after each run on fixed seeds; time to threshold "
           "is the first snapshot holding it; censored seeds are counted, never dropped; speedups are per seed "
           "against the same run's best sequential configuration, median of the seeds both reached. One table per "
           "run and task (never pooled across runs).", ""]
    for (run_id, algo, env), cell in data.groupby(["run_id", "algo", "env"], sort=True):
        out += [f"Run `{run_id}`: {env} ({algo}), best sequential: `{cell['best_sequential'].iloc[0]}`", ""]
        out += md.table(["config", "layout", "reached", "median s", "IQR s", "env steps", "updates", "final holds",
                         "x best seq"],
                        [[r.config, r.layout, f"{r.reached}/{r.n}", s(r.median_s),
                          "-" if not math.isfinite(r.q1_s) else f"{s(r.q1_s)}-{s(r.q3_s)}",
                          "-" if r.env_steps is None or not math.isfinite(r.env_steps) else f"{r.env_steps:,.0f}",
                          "-" if r.updates is None or not math.isfinite(r.updates) else f"{r.updates:,.0f}",
                          f"{r.final_holds}/{r.n}", "-" if not math.isfinite(r.x_best_sequential)
                          else md.num(r.x_best_sequential)] for r in cell.itertuples()])
        out.append("")
    return out
