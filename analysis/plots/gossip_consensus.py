"""Gossip learners: consensus distance (mean ||theta_i - mean theta||) over wall time.

Rows: scenario ``gossip``, op ``consensus`` (one row per snapshot round: the learners'
models after the same number of updates, with their mean ``wall_s``), newest run per cell.
One panel per (env, learners, straggler); one line per scheme: the median over seeds at each
snapshot index, against the median wall time. All-reduce learners hold one model (distance 0);
independent learners drift apart; gossip stays bounded.
"""

from __future__ import annotations

from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, new_figure
from replaybench.analysis.plots.gossip_scaling import gossip_rows, scheme_colour

NAME = "gossip_consensus"
ORDER = 62
TITLE = "Gossip learners: consensus distance over time"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("gala-straggler",)


def build(table, metas) -> Plot:
    rows = gossip_rows(table, "consensus")
    if rows.empty:
        raise NoRows("no consensus rows (scenario 'gossip', op 'consensus')")
    rows = rows[(rows["status"] == "ok") & (rows["learners"] > 1)]
    if rows.empty:
        raise NoRows("no consensus rows of runs with more than one learner")
    keys = ["env", "learners", "straggler", "scheme", "repeat"]
    data = rows.groupby(keys, sort=True).agg(distance=("value", "median"), wall_s=("wall_s", "median"),
                                             n=("value", "count")).reset_index()
    panels = sorted({(e, int(n), float(s)) for e, n, s in zip(data["env"], data["learners"], data["straggler"])})
    cols = min(4, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = new_figure(nrows, cols, panel=(3.6, 2.9))
    handles = {}
    for i, (env, n, slow) in enumerate(panels):
        ax = axes[i // cols, i % cols]
        cell = data[(data["env"] == env) & (data["learners"] == n) & (data["straggler"] == slow)]
        for scheme, line in cell.groupby("scheme", sort=True):
            colour = scheme_colour(scheme)
            ax.plot(line["wall_s"], line["distance"], color=colour, linewidth=1.3)
            handles.setdefault(scheme, handle(scheme, colour, marker=""))
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.grid(alpha=0.3)
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("consensus distance (L2)")
        title = f"{env}, {n} learners" + (f", straggler {slow:g}x" if slow != 1.0 else "")
        ax.set_title(title, fontsize=9)
    for j in range(len(panels), nrows * cols):
        axes[j // cols, j % cols].set_visible(False)
    fig.suptitle("Consensus distance mean_i ||theta_i - mean theta||: median over seeds per snapshot", fontsize=10)
    legend(fig, list(handles.values()), title="scheme")
    return Plot(fig, data, "Consensus distance of the learners' models over wall time (symlog scale), "
                           "median over seeds at each snapshot round.")
