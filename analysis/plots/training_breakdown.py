"""Training: where the wall time goes, per configuration.

Rows: scenario ``training``, op ``profile``, newest run per cell; metric = one component
(``env_step``, ``inference``, ``replay``, ``sgd``, ``wait``, ``other``), value = seconds spent
in it, summed over the processes of one role (params ``"role"``: sequential, actor or
learner). Per seed the roles are added up (the run's total process time per component);
plotted per configuration: the median over seeds of each component, as a share of the sum of the
components' medians (a stacked horizontal bar, 100% = the configuration's total), with the
total in seconds written at the bar's end. One panel per (algorithm, environment).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaybench.analysis import palette, stats
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, new_figure
from replaybench.analysis.plots._training import CONFIG, config_label, several_buffers, training_rows

NAME = "training_breakdown"
ORDER = 52
TITLE = "Training: where the wall time goes"

COMPONENT_COLOURS = {"env_step": "#009E73", "inference": "#56B4E9", "replay": "#0072B2", "sgd": "#D55E00",
                     "wait": "#7F7F7F", "other": "#CCCCCC"}


def _n(value) -> float:
    return 0.0 if pd.isna(value) else float(value)


def build(table, metas) -> Plot:
    rows = training_rows(table, "profile")
    rows = rows[(rows["status"] == "ok") & rows["value"].notna()]
    if rows.empty:
        raise NoRows("no training time profiles (scenario 'training', op 'profile')")
    rows = rows.assign(algo=rows["algo"].fillna("?"), env=rows["env"].fillna("?"))
    # one row per role (actor, learner ...) and component: sum the roles within each seed first
    per_seed = rows.groupby([*CONFIG, "baseline", "seed", "metric"], dropna=False)["value"].sum().reset_index()
    data = stats.spread(per_seed, [*CONFIG, "baseline", "metric"], "value").rename(columns={"metric": "component"})
    data["unit"] = "s"
    totals = data.groupby(CONFIG, dropna=False)["median"].transform("sum")
    data["share"] = data["median"] / totals
    components = [c for c in COMPONENT_COLOURS if c in set(data["component"])] + sorted(
        set(data["component"]) - set(COMPONENT_COLOURS))
    tasks = sorted(set(data["task"]))
    several = several_buffers(data)
    n_cfg = data.drop_duplicates(CONFIG).groupby("task").size().max()
    fig, axes = new_figure(len(tasks), 1, panel=(7.5, 0.9 + 0.38 * n_cfg))
    handles = {}
    for r, name in enumerate(tasks):
        ax = axes[r, 0]
        task = data[data["task"] == name]
        configs = sorted(task.groupby(CONFIG, dropna=False, sort=False),
                         key=lambda kv: (not kv[1]["baseline"].iloc[0], _n(kv[1]["learners"].iloc[0]),
                                         _n(kv[1]["actors"].iloc[0])))
        labels = []
        for y, (_, mine) in enumerate(configs):
            cfg = mine.iloc[0]
            left = 0.0
            for comp in components:
                share = mine.loc[mine["component"] == comp, "share"]
                if share.empty:
                    continue
                width = float(share.iloc[0])
                colour = COMPONENT_COLOURS.get(comp) or palette.policy_colour(comp)
                ax.barh(y, width, left=left, color=colour, edgecolor="white", linewidth=0.5)
                if width > 0.07:
                    ax.text(left + width / 2, y, f"{100 * width:.0f}%", ha="center", va="center", fontsize=7,
                            color="white" if comp not in ("other",) else "black")
                left += width
                handles.setdefault(comp, handle(comp, colour, marker="s", linestyle=""))
            total = float(np.nansum(mine["median"]))
            ax.text(1.01, y, f"{total:.3g} s", va="center", fontsize=7, transform=ax.get_yaxis_transform())
            labels.append(config_label(cfg, several))
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.xaxis.set_major_formatter(lambda v, _: f"{100 * v:.0f}%")
        ax.set_xlabel("share of the summed time (median over seeds); total seconds at the right")
        ax.set_title(name, fontsize=10)
    fig.suptitle("Where the wall time goes", fontsize=10)
    legend(fig, list(handles.values()), title="component")
    data = data.sort_values(["algo", "env", "learners", "actors", "component"]).reset_index(drop=True)
    return Plot(fig, data, "Share of the measured time per component (environment steps, inference, replay, "
                           "SGD, waiting), per configuration.")
