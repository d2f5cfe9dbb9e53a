"""Scaling model: predicted against measured throughput of every concurrency cell.

For each (variant, policy, mode, transitions) of the newest concurrency run (by meta.json's
start) that has the redesigned scenario's per-call costs, the scaling model of :mod:`bench.derive` is fitted
from its 1-actor, 1- and 2-learner cells (and 2-actor, where present: :func:`~bench.derive.costs_from_rows`)
and predicts every cell of that run (:func:`~bench.derive.validate_model`). One point per
cell: x = measured rate, y = predicted (sample transitions/s; insert for actors alone), log-log,
with the line y = x and a +-25 % band. Colour = policy, marker = mode; hollow markers are the
model's inputs (fitted, so near the line by construction). One panel per transition size.
Runs made before the redesign have no per-call costs and are skipped (NoRows if none is left).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaybench.analysis import palette
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, log_x, log_y, new_figure
from replaybench.bench import derive

NAME = "scaling"
ORDER = 41
TITLE = "Scaling model: predicted vs measured"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("pal-linear-scaling",)

_MARKERS = {"threads": "o", "processes": "s"}


def _records(table: pd.DataFrame) -> list[dict]:
    return table.replace({np.nan: None}).to_dict("records")


def build(table, metas) -> Plot:
    rows = table[(table["scenario"] == "concurrency") & (table["status"] == "ok")]
    if rows.empty:
        raise NoRows("no concurrency rows (scenario 'concurrency')")
    points = []
    def started(run_id):  # meta's start time, then the id (an id alone does not sort runs by time)
        return str((metas.get(run_id) or {}).get("start_time") or ""), run_id

    for run_id in sorted(set(rows["run_id"]), key=started, reverse=True):  # newest first
        mine = rows[rows["run_id"] == run_id]
        records = _records(mine)
        cores = int(((metas.get(run_id) or {}).get("machine") or {}).get("usable_cpus") or 0) or None
        for key, _ in mine.groupby(["variant", "policy", "mode", "transitions"], dropna=False):
            where = dict(zip(("variant", "policy", "mode", "transitions"), key))
            try:
                costs = derive.costs_from_rows(records, cores=cores, **where)
            except ValueError:  # a run before the redesign, or without the input cells
                continue
            for v in derive.validate_model(records, costs, cores or 1, **where):
                points.append({"run_id": run_id, **where, **v})
        if points:
            break  # the newest run that has a model
    if not points:
        raise NoRows("no concurrency run with per-call costs (the redesigned scenario, workers 'auto')")
    data = pd.DataFrame(points)
    sizes = sorted(set(data["transitions"]))
    fig, axes = new_figure(1, len(sizes), panel=(4.4, 4.0))
    handles = {}
    for c, size in enumerate(sizes):
        ax = axes[0, c]
        part = data[data["transitions"] == size]
        for (policy, mode), g in part.groupby(["policy", "mode"], sort=True):
            colour, mark = palette.policy_colour(policy), _MARKERS.get(mode, "^")
            fitted = g["input"].to_numpy(bool)
            x, y = g["measured"].to_numpy(float) / 1e6, g["predicted"].to_numpy(float) / 1e6
            ax.plot(x[~fitted], y[~fitted], linestyle="none", marker=mark, color=colour, markersize=5)
            ax.plot(x[fitted], y[fitted], linestyle="none", marker=mark, markerfacecolor="white",
                    markeredgecolor=colour, markersize=5)
            label = f"{policy}, {mode}"
            handles.setdefault(label, handle(label, colour, mark, "none"))
        lo = float(min(part["measured"].min(), part["predicted"].min())) / 1e6 / 1.5
        hi = float(max(part["measured"].max(), part["predicted"].max())) / 1e6 * 1.5
        line = np.array([lo, hi])
        ax.plot(line, line, color="0.4", linewidth=1)
        ax.fill_between(line, line * 0.75, line * 1.25, color="0.85", zorder=0)
        log_x(ax)
        log_y(ax)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.grid(alpha=0.3, which="both")
        err = part.loc[~part["input"], "error"].abs()
        note = f"median |error| {100 * err.median():.0f}% over {len(err)} predicted cells" if len(err) else "no predicted cells"
        ax.set_title(f"{size} transitions\n{note}", fontsize=9)
        ax.set_xlabel("measured (M transitions/s)")
        if c == 0:
            ax.set_ylabel("predicted (M transitions/s)")
    fig.suptitle(f"Scaling model of run {data['run_id'].iloc[0]}\ngrey band = +-25 %; hollow = fitted inputs",
                 fontsize=9, x=0.4)  # left of centre: the legend takes the right
    legend(fig, list(handles.values()), title="policy, mode")
    data = data.sort_values(["transitions", "policy", "mode", "actors", "learners"]).reset_index(drop=True)
    return Plot(fig, data, "Predicted against measured sample throughput (insert throughput for actors alone) of "
                           "each concurrency cell; the model is fitted from the 1-actor, 1- and 2-learner cells "
                           "(and the 2-actor one, where the run has it).")
