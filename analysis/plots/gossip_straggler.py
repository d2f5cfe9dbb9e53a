"""Gossip learners with a straggler: env steps/s with and without one slowed learner, per
scheme, and each learner's own env steps/s in the slowed runs.

Rows: scenario ``gossip``, newest run per cell, at the learner counts that have straggler
runs. Left: op ``summary`` metric ``env_steps_per_s``, median over seeds with min-max bars,
side by side for no straggler and each slowdown. Right: op ``learner`` (one row per learner,
``repeat`` = rank; the straggler is the last rank), median over seeds. The ratio gossip /
all-reduce at the same slowdown is in the CSV (``x_allreduce``).
"""

from __future__ import annotations

import numpy as np

from replaybench.analysis import stats
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, new_figure
from replaybench.analysis.plots.gossip_scaling import gossip_rows, scheme_colour, summary_spread

NAME = "gossip_straggler"
ORDER = 63
TITLE = "Gossip learners: one learner slowed"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("gala-straggler",)


def build(table, metas) -> Plot:
    rows = gossip_rows(table, "summary")
    if rows.empty or not (rows["straggler"] > 1.0).any():
        raise NoRows("no gossip runs with a straggler (params straggler_slowdown > 1)")
    counts = sorted(set(rows.loc[rows["straggler"] > 1.0, "learners"].astype(int)))
    rows = rows[rows["learners"].isin(counts) & (rows["metric"] == "env_steps_per_s")]
    data = summary_spread(rows)
    base = data[data["scheme"] == "allreduce"][["env", "learners", "straggler", "median"]]
    data = data.merge(base.rename(columns={"median": "allreduce_median"}), on=["env", "learners", "straggler"],
                      how="left")
    data["x_allreduce"] = data["median"] / data["allreduce_median"]
    per = gossip_rows(table, "learner")
    per = per[per["learners"].isin(counts) & (per["straggler"] > 1.0) & (per["status"] == "ok")]
    per = stats.spread(per, ["env", "learners", "straggler", "scheme", "repeat"], "value") if not per.empty else per
    panels = sorted({(e, int(n)) for e, n in zip(data["env"], data["learners"])})
    fig, axes = new_figure(len(panels), 2, panel=(4.4, 3.1))
    handles = {}
    for r, (env, n) in enumerate(panels):
        ax = axes[r, 0]
        cell = data[(data["env"] == env) & (data["learners"] == n)]
        schemes = sorted(set(cell["scheme"]))
        slows = sorted(set(cell["straggler"]))
        width = 0.8 / max(len(slows), 1)
        for j, slow in enumerate(slows):
            part = cell[cell["straggler"] == slow].set_index("scheme").reindex(schemes)
            x = np.arange(len(schemes)) + (j - (len(slows) - 1) / 2) * width
            med = part["median"].to_numpy(float)
            err = [med - part["min"].to_numpy(float), part["max"].to_numpy(float) - med]
            ax.bar(x, med, width=width * 0.95, yerr=err, capsize=2,
                   color=[scheme_colour(s) for s in schemes], alpha=1.0 if slow == 1.0 else 0.55,
                   hatch=None if slow == 1.0 else "//", edgecolor="black", linewidth=0.4)
        ax.set_xticks(np.arange(len(schemes)), schemes, rotation=20, ha="right", fontsize=7)
        ax.set_ylabel("env steps/s (all learners)")
        ax.set_title(f"{env}, {n} learners: solid = no straggler, hatched = "
                     + ", ".join(f"{s:g}x" for s in slows if s != 1.0), fontsize=8)
        ax.grid(alpha=0.3, axis="y")
        ax = axes[r, 1]
        if not per.empty:
            pc = per[(per["env"] == env) & (per["learners"] == n)]
            for scheme, line in pc.groupby("scheme", sort=True):
                colour = scheme_colour(scheme)
                ax.plot(line["repeat"], line["median"], marker="o", color=colour, linewidth=1.2)
                handles.setdefault(scheme, handle(scheme, colour))
        ranks = sorted(set(per["repeat"].astype(int))) if not per.empty else []
        if ranks:
            ax.set_xticks(ranks, [str(v) for v in ranks])
        ax.set_xlabel("learner rank (the last is slowed)")
        ax.set_ylabel("its env steps/s")
        ax.set_title("each learner in the straggler runs", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("Straggler: gossip need not wait for the slowest learner, all-reduce must", fontsize=10)
    legend(fig, list(handles.values()), title="scheme")
    return Plot(fig, data.sort_values(["env", "learners", "straggler", "scheme"]).reset_index(drop=True),
                "Env steps/s over all learners with and without one slowed learner (left) and each "
                "learner's own env steps/s in the slowed runs (right); medians over seeds.")
