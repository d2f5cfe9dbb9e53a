"""PAAC stepping: where the time of one env step goes, per method.

Rows: scenario ``paac``, op ``profile`` of the stepping cells (metrics ``inference``,
``env_step``, ``sync``, ``other`` in us per env step; see bench/scenarios/paac.py for what each
method, the rows' ``stepping``, counts in each), newest run per cell. Per environment (a panel): the cells at the
n_e closest to :data:`N_ENVS` (32, the issue's comparison point), one stacked horizontal bar
per (method, n_w), its total (us per env step, the inverse of the throughput) written at the
bar's end.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, new_figure
from replaybench.analysis.plots.paac_throughput import stepping_rows
from replaybench.bench import contract

NAME = "paac_breakdown"
ORDER = 57
TITLE = "PAAC stepping: where the time goes"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("paac-rate",)

N_ENVS = 32
COMPONENT_COLOURS = {"env_step": "#009E73", "inference": "#56B4E9", "sync": "#D55E00", "other": "#CCCCCC"}
METHOD_ORDER = ("paac", "paac-halves", "per-env", "envpool", "gym-sync", "gym-async")


def breakdown(table):
    """One row per (run, env, method, n_e, n_w, component) at each env's n_e closest to N_ENVS."""
    rows = stepping_rows(table, "profile")
    rows = rows[(rows["status"] == contract.MEASURED) & rows["value"].notna() & rows["n_envs"].notna()]
    if rows.empty:
        return rows
    parts = []
    for env, mine in rows.groupby("env"):
        sizes = np.array(sorted({int(n) for n in mine["n_envs"]}))
        n_e = int(sizes[np.argmin(np.abs(np.log2(sizes) - np.log2(N_ENVS)))])
        parts.append(mine[mine["n_envs"] == n_e])
    rows = pd.concat(parts)
    cols = ["run_id", "env", "stepping", "n_envs", "n_workers", "metric", "value", "unit"]
    return rows[cols].rename(columns={"stepping": "method", "metric": "component"}).reset_index(drop=True)


def build(table, metas) -> Plot:
    data = breakdown(table)
    if data.empty:
        raise NoRows("no PAAC stepping profiles (scenario 'paac', op 'profile')")
    envs = sorted(set(data["env"]))
    configs = data.drop_duplicates(["env", "method", "n_workers"])
    fig, axes = new_figure(len(envs), 1, panel=(7.0, 0.9 + 0.32 * configs.groupby("env").size().max()))
    handles = {}
    for r, env in enumerate(envs):
        ax = axes[r, 0]
        mine = data[data["env"] == env]
        keys = sorted({(m, int(w)) for m, w in zip(mine["method"], mine["n_workers"])},
                      key=lambda k: (METHOD_ORDER.index(k[0]) if k[0] in METHOD_ORDER else 99, k[1]))
        labels = []
        for y, (method, n_w) in enumerate(keys):
            bar = mine[(mine["method"] == method) & (mine["n_workers"] == n_w)]
            left = 0.0
            for component, colour in COMPONENT_COLOURS.items():
                value = float(bar.loc[bar["component"] == component, "value"].sum())
                if value > 0:
                    ax.barh(y, value, left=left, color=colour, height=0.7)
                    handles.setdefault(component, handle(component, colour, "s", ""))
                left += value
            ax.text(left, y, f" {left:.3g}", va="center", fontsize=7)
            labels.append(f"{method}, n_w={n_w}")
        ax.set_yticks(range(len(keys)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("us per env step")
        ax.set_title(f"{env}, n_e = {int(mine['n_envs'].iloc[0])}", fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    legend(fig, list(handles.values()), title="component")
    caption = ("Microseconds per env step of each method at n_e closest to 32, split into the master's batched "
               "forward (inference), stepping (PAAC: the workers' mean busy time), synchronisation (PAAC: the "
               "master's wait beyond the workers' busy time) and the rest. Per-env: the workers' inference and "
               "stepping time divided by n_w.")
    return Plot(fig, data, caption)
