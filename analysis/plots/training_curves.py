"""Training: episodic return against environment steps and against wall time.

Rows: scenario ``training``, op ``episode``, metric ``return`` (one row per finished episode,
with ``env_steps`` and ``wall_s`` at its end), newest run per cell. Per configuration
(variant, policy, algorithm, environment, actors, learners) and seed, the returns are
smoothed with a running mean over ``SMOOTH`` episodes and interpolated onto ``POINTS`` evenly
spaced x values up to the shortest seed's end; the line is the median over seeds, the band the
min-max over seeds. The CSV holds those plotted points (``n_seeds`` per point).

One row of panels per (algorithm, environment): left against environment steps, right against
wall seconds. Black: the sequential baseline; other colours: actor / learner configurations.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, new_figure
from replaybench.analysis.plots._training import CONFIG, WORKER_COLOURS, config_label, several_buffers, training_rows

NAME = "training_curves"
ORDER = 50
TITLE = "Training: return vs steps and wall time"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("pal-convergence",)

SMOOTH = 10
POINTS = 60
_AXES = [("env_steps", "environment steps"), ("wall_s", "wall time (s)")]


def _curve(groups, x: str) -> pd.DataFrame | None:
    """Median and min-max over seeds of the smoothed returns on a common grid of ``x``."""
    seeds = []
    for _, g in groups:
        # episodes ending at the same x (E envs per actor finish together) keep their order
        # (repeat = the episode's index), whatever order the rows came in
        g = g.dropna(subset=[x, "value"]).sort_values([x, "repeat"], kind="stable")
        if len(g) >= 2:
            seeds.append((g[x].to_numpy(float), g["value"].rolling(SMOOTH, min_periods=1).mean().to_numpy(float)))
    if not seeds:
        return None
    end = min(xs[-1] for xs, _ in seeds)
    start = max(xs[0] for xs, _ in seeds)
    if end <= start:
        return None
    grid = np.linspace(start, end, POINTS)
    ys = np.vstack([np.interp(grid, xs, ys) for xs, ys in seeds])
    return pd.DataFrame({"x_axis": x, "x": grid, "median": np.median(ys, axis=0), "min": ys.min(axis=0),
                         "max": ys.max(axis=0), "n_seeds": len(seeds)})


def build(table, metas) -> Plot:
    rows = training_rows(table, "episode")
    rows = rows[(rows["metric"] == "return") & (rows["status"] == "ok")]
    if rows.empty:
        raise NoRows("no training return curves (scenario 'training', op 'episode')")
    tasks = sorted(set(rows["task"]))
    configs = (rows.drop_duplicates(CONFIG).assign(_a=lambda d: d["actors"].fillna(0).astype(float),
                                                   _l=lambda d: d["learners"].fillna(0).astype(float))
               .sort_values(["baseline", "_l", "_a"], ascending=[False, True, True]))
    show_variant = several_buffers(rows)
    fig, axes = new_figure(len(tasks), 2, panel=(5.4, 3.4))
    parts, handles = [], {}
    style_of = {}  # label -> (colour, line style): black for the baseline, then the colours in turn
    for _, cfg in configs.iterrows():
        label = config_label(cfg, show_variant)
        if label not in style_of:
            i = sum(1 for colour, _ in style_of.values() if colour != "#000000")
            style_of[label] = ("#000000", "-") if cfg["baseline"] else (
                WORKER_COLOURS[i % len(WORKER_COLOURS)], "-" if i < len(WORKER_COLOURS) else "--")
    for r, name in enumerate(tasks):
        task = rows[rows["task"] == name]
        for c, (x, xlabel) in enumerate(_AXES):
            ax = axes[r, c]
            for key, cfg_rows in task.groupby(CONFIG, dropna=False, sort=False):
                first = cfg_rows.iloc[0]
                label = config_label(first, show_variant)
                curve = _curve(cfg_rows.groupby("seed", dropna=False), x)
                if curve is None:
                    continue
                colour, style = style_of[label]
                ax.plot(curve["x"], curve["median"], color=colour, linewidth=1.5, linestyle=style)
                ax.fill_between(curve["x"], curve["min"], curve["max"], color=colour, alpha=0.15, linewidth=0)
                handles.setdefault(label, handle(label, colour, marker="", linestyle=style))
                parts.append(curve.assign(**dict(zip(CONFIG, key)), baseline=first["baseline"]))
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"return (running mean of {SMOOTH} episodes)")
            ax.set_title(name, fontsize=10)
            ax.grid(alpha=0.3)
    if not parts:
        raise NoRows("training return curves have fewer than two episodes per seed")
    fig.suptitle("Training return: median over seeds, band = min-max over seeds", fontsize=10)
    legend(fig, list(handles.values()), title="configuration")
    return Plot(fig, pd.concat(parts, ignore_index=True),
                "Episodic return against environment steps and wall time (median over seeds, min-max band).")
