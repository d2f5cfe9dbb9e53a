"""Learners and the sum tree on a GPU against the CPU (issue 40), one run per panel.

Rows, from the newest run of each kind that holds a measured CUDA row (for the tree, where no
run has one, the newest run of the ``gpu`` scenario: a machine without a GPU compares its
trees on the CPU):

- scenario ``training`` (suites training-gpu, training-gpu-quick), op ``summary``: per cell, metric
  ``updates_per_s`` of the replay learners (engine ``process``: DQN's learner on the CPU,
  on CUDA replaying a graph, eager, or prefetching) and ``env_steps_per_s`` of every cell
  (the sequential baselines, the parallel layouts, PAAC); the cell's ``device`` and its
  algorithm overrides come from params;
- scenario ``gpu`` (suite gpu-tree-quick): ``seconds_per_call`` of one sample of 256 at 2**20
  per contestant (variant, tree device, where the batch lands, and for torch-kary on CUDA
  whether the sample replays a CUDA graph: "eager" where params say ``cuda_graph`` false or,
  in runs from before that setting, nothing), median and min-max of its repeats, in
  microseconds.

Bars, not lines: each bar is one cell of one run, so no line joins two runs. Env steps/s get a
panel per task (algorithm and environment): DQN on CartPole and A2C on Pong are different work,
never bars of one axis. A task with one cell only has nothing to compare on its panel: it is left
out, and the caption names it with its rate (the PAAC claim's section shows Pong's). The caption
says what the panels hold, the sequential baselines only where the run has them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, NullFormatter

from replaybench.analysis import load, stats
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, new_figure
from replaybench.bench import contract

NAME = "gpu"
ORDER = 58
TITLE = "GPU: learners and the sum tree against the CPU"

DEVICE_COLOURS = {"cpu": "#0072B2", "cuda": "#009E73"}
PANELS = (("learner", "replay learner: updates/s"), ("steps", "training: env steps/s"),
          ("tree", "sample of 256 at 2^20: us per call"))


def _newest_run_with_cuda(rows: pd.DataFrame, devices: pd.Series, or_any: bool = False) -> pd.DataFrame:
    """``rows`` of the newest run (by meta's start, then id) that measured a CUDA cell; with
    ``or_any``, where none did, of the newest run that measured any cell."""
    measured = rows[rows["status"] == contract.MEASURED]
    with_cuda = measured[devices.loc[measured.index] == "cuda"]
    measured = with_cuda if not with_cuda.empty or not or_any else measured
    if measured.empty:
        return rows.iloc[0:0]
    latest = load.latest_per_cell(measured.assign(cell="x"), ("cell",))["run_id"].iloc[0]
    return rows[rows["run_id"] == latest]


def _training(table: pd.DataFrame) -> pd.DataFrame:
    rows = table[(table["scenario"] == "training") & (table["op"] == "summary")
                 & table["metric"].isin(["updates_per_s", "env_steps_per_s"])]
    if rows.empty:
        return rows
    params = pd.Series([contract.params_of(p) for p in rows["params"]], index=rows.index)
    rows = _newest_run_with_cuda(rows, params.map(lambda p: p.get("device")))
    rows = rows[(rows["status"] == contract.MEASURED) & rows["value"].notna()]
    out = []
    for idx, r in rows.iterrows():
        p = params[idx]
        device = p.get("device")
        overrides = p.get("overrides") or {}
        parallel = r["engine"] == "process"
        if r["metric"] == "updates_per_s" and not parallel:
            continue
        layout = f"{int(r['actors'])}+{int(r['learners'])}" if parallel else r["engine"]
        how = ""
        if device == "cuda" and r["algo"] == "dqn":
            how = " eager" if overrides.get("cuda_graph") is False else " graph"
        how += " prefetch" if p.get("learner_prefetch") else ""
        how += f" lag {p['priority_lag']}" if p.get("priority_lag") else ""
        task = f"{r['algo'].upper()} {r['env'].split('/')[-1]}"
        label = f"{layout}, {device}{how}"
        out.append({"panel": "learner" if r["metric"] == "updates_per_s" else "steps", "run_id": r["run_id"],
                    "task": task, "label": label, "device": device, "median": float(r["value"]),
                    "min": float(r["value"]), "max": float(r["value"]), "unit": r["unit"],
                    "baseline": r["engine"] == "sequential"})
    data = pd.DataFrame(out)
    if data.empty:
        return data
    # a task with one env-steps bar has nothing to compare on a panel of its own (the caption says it)
    steps = data["panel"] == "steps"
    alone = steps & (data.groupby(["panel", "task"])["panel"].transform("size") == 1)
    return data.assign(drawn=~alone)


def _tree(table: pd.DataFrame) -> pd.DataFrame:
    rows = table[(table["scenario"] == "gpu") & (table["metric"] == "seconds_per_call")]
    if rows.empty:
        return rows
    params = pd.Series([contract.params_of(p) for p in rows["params"]], index=rows.index)
    # a machine without a GPU still compares its trees (the CUDA cells are unavailable rows there)
    rows = _newest_run_with_cuda(rows, params.map(lambda p: p.get("device")), or_any=True)
    rows = rows[(rows["status"] == contract.MEASURED) & rows["value"].notna()]
    if rows.empty:
        return rows
    rows = rows.assign(device=[params[i].get("device") for i in rows.index],
                       batch_to=[params[i].get("batch_to", params[i].get("device")) for i in rows.index],
                       # runs made before the cuda_graph setting (no such param) sampled eagerly
                       how=[" eager" if rows.at[i, "variant"] == "torch-kary" and params[i].get("device") == "cuda"
                            and params[i].get("cuda_graph") is not True else "" for i in rows.index],
                       us=rows["value"] * 1e6)
    data = stats.spread(rows, ["run_id", "variant", "device", "batch_to", "how"], "us")
    data["label"] = [f"{v} ({d} tree{h}, batch on {b})" for v, d, h, b in zip(data["variant"], data["device"],
                                                                            data["how"], data["batch_to"])]
    return data.assign(panel="tree", unit="us", task="sample of 256 at 2^20", baseline=False, drawn=True)[
        ["panel", "run_id", "task", "label", "device", "median", "min", "max", "unit", "baseline", "drawn"]]


def _panel_title(key: tuple) -> str:
    panel, task = key
    return f"training, {task}: env steps/s" if panel == "steps" else dict(PANELS)[panel]


def build(table, metas) -> Plot:
    parts = [d for d in (_training(table), _tree(table)) if not d.empty]
    if not parts:
        raise NoRows("no training run with a measured CUDA cell (suite training-gpu) and no gpu-tree-quick run")
    data = pd.concat(parts, ignore_index=True)
    shown = data[data["drawn"].astype(bool)]
    if shown.empty:
        raise NoRows("every task has a single cell: nothing to set beside it")
    # one panel per (panel, task) of the env-steps bars, one for the learners and one for the tree
    order = {key: i for i, (key, _) in enumerate(PANELS)}
    group = [(p, t if p == "steps" else "") for p, t in zip(shown["panel"], shown["task"])]
    shown = shown.assign(group=group)
    keys = sorted(set(group), key=lambda k: (order.get(k[0], 9), k[1]))
    tallest = max(sum(g == key for g in group) for key in keys)
    fig, axes = new_figure(1, len(keys), panel=(4.6, 0.9 + 0.3 * tallest))
    for ax, key in zip(axes[0], keys):
        mine = shown[[g == key for g in shown["group"]]].sort_values("median", ascending=key[0] == "tree",
                                                                        kind="stable")
        y = np.arange(len(mine))
        colours = [DEVICE_COLOURS.get(d, "#999999") for d in mine["device"]]
        err = np.vstack([mine["median"] - mine["min"], mine["max"] - mine["median"]])
        ax.barh(y, mine["median"], xerr=np.clip(err, 0, None), color=colours, height=0.7, capsize=2)
        for yy, v, right in zip(y, mine["median"], mine["max"]):  # the median, written past its error bar
            ax.text(right, yy, f" {v:,.0f}" if v >= 100 else f" {v:.3g}", va="center", fontsize=7)
        labels = [f"{t} {lb}" if key[0] == "learner" else lb for t, lb in zip(mine["task"], mine["label"])]
        ax.set_yticks(y, labels, fontsize=7.5)
        ax.invert_yaxis()
        if key[0] != "learner" and mine["median"].max() / max(mine["median"].min(), 1e-12) > 10:
            ax.set_xscale("log")  # decades apart: a log axis, ticks written plainly
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.margins(x=0.15)
        ax.set_xlabel(mine["unit"].iloc[0])
        ax.set_title(f"{_panel_title(key)}\n(run {mine['run_id'].iloc[0]})", fontsize=8.5)
        ax.grid(alpha=0.3, axis="x")
    legend(fig, [handle(d, c, "s", "") for d, c in DEVICE_COLOURS.items()], title="device")
    steps = shown[shown["panel"] == "steps"]
    alone = data[~data["drawn"].astype(bool)]
    parts = ["One bar per cell of one run."]
    if (shown["panel"] == "learner").any():
        parts.append("Learners: DQN CartPole's learner updates/s with the learner on one CPU thread or on CUDA "
                     "(graph: each update one captured CUDA graph; eager: one launch per kernel; prefetch: the next "
                     "sample drawn beside the update).")
    if not steps.empty:
        parts.append("Env steps/s: one panel per task, every training cell of it in the run"
                     + (", the sequential baselines included." if steps["baseline"].any() else
                        "; the run has no sequential baseline of these tasks, so no speedup over one is drawn here "
                        "(the training figure has the runs that do)."))
    if not alone.empty:
        parts.append("Left out, one cell each (nothing to compare them with on a panel of their own): "
                     + "; ".join(f"{r.task} {r.label}: {r.median:,.0f} {r.unit}" for r in alone.itertuples()) + ".")
    if (shown["panel"] == "tree").any():
        parts.append("Tree: one sample of 256 at 2^20 rows, the rows included, median and min-max of the repeats; "
                     "'batch on cuda' is what a GPU learner reads; torch-kary on cuda replays each sample as a CUDA "
                     "graph ('eager': one launch per kernel).")
    parts.append("Bars of a panel come from one run on one machine.")
    return Plot(fig, data, " ".join(parts))
