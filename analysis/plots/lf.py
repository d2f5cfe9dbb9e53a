"""The Lingua Franca benchmarks: every backend's speed over Ray's, beside the paper's LF/Ray.

Rows: scenario ``lf`` of the newest run that has any (ratios are only taken within one run);
:func:`bench.derive.lf_ratios` gives, per cell and backend, the median and ``x_ray`` (speed
over Ray's median in the same cell: rates over Ray's rate, Ray's time over the backend's time),
and the paper's ratio from the run's recorded ``paper.lf_over_ray`` (:mod:`analysis.references`;
none recorded: no diamonds, and the caption says so).
One panel per workload (lock-step sampling by environment, parallel Q-learning by actors,
mini-batch and replay, multi-agent inference by agents), one stem per backend from 1 (Ray) to
its ratio on a log axis; the black diamond on our dataflow's stem is the paper's Lingua Franca over Ray ratio for that
cell. The CSV holds every stem (median, min, max, n, x_ray, paper).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from replaybench.analysis import references
from replaybench.analysis import markdown as md
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, log_y
from replaybench.bench.derive import LF_WORKLOADS, lf_ratios

NAME = "lf"
ORDER = 60
TITLE = "Lingua Franca benchmarks: speed over Ray"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("lf-gym", "lf-atari", "lf-pql", "lf-multiagent")

_COLOURS = {"ray": "#4c72b0", "dataflow": "#c44e52", "sync": "#55a868", "async": "#8172b2", "mp-queues": "#937860",
            "serial": "#8c8c8c"}
_TITLES = {"lockstep": "lock-step sampling (random actions)", "pql": "parallel Q-learning (Blackjack)",
           "multiagent": "multi-agent inference"}


def _label(e) -> str:
    if e["op"] == "lockstep":
        return f"{e['env']}\n{int(e['actors'])} envs"
    if e["op"] == "pql":
        return f"{int(e['actors'])} actors\nbatch {int(e['batch'])}\n{e['policy']}"
    return f"{e['env']}\n{int(e['actors'])} agents"


def build(table, metas) -> Plot:
    rows = table[table["scenario"] == "lf"] if "scenario" in table else table.iloc[0:0]
    if rows.empty:
        raise NoRows("no LF benchmark rows (scenario 'lf')")
    run_id = sorted(rows["run_id"].unique())[-1]
    rows = rows[rows["run_id"] == run_id].astype(object)
    paper = references.recorded(metas.get(run_id), "paper", "lf_over_ray")
    data = pd.DataFrame(lf_ratios(rows.where(rows.notna(), None).to_dict("records"), (paper or {}).get("cells")))
    if data.empty or data["x_ray"].isna().all():
        raise NoRows(f"run {run_id}: no LF cell measured both Ray and another backend")
    data.insert(0, "run_id", run_id)
    ops = [op for op in LF_WORKLOADS if op in set(data["op"])]
    # each panel as wide as its groups need, about 0.6 inch a group: one row that fits a page
    widths = [max(2, data[data["op"] == op][["env", "policy", "actors", "batch"]].drop_duplicates().shape[0]) for op in ops]
    fig = Figure(figsize=(0.6 * sum(widths) + 1.2 * len(ops) + 1.5, 4.2), layout="constrained")
    axes = fig.subplots(1, len(ops), squeeze=False, gridspec_kw={"width_ratios": widths})
    handles = {}
    for ax, op in zip(axes[0], ops):
        part = data[data["op"] == op]
        groups = part[["env", "policy", "actors", "batch"]].drop_duplicates().reset_index(drop=True)
        backends = [b for b in LF_WORKLOADS[op][0] if b in set(part["backend"])]
        width = 0.8 / len(backends)
        for gi, g in groups.iterrows():
            cell = part[(part["env"] == g["env"]) & (part["policy"] == g["policy"]) & (part["actors"] == g["actors"])
                        & (part["batch"].fillna(-1) == (-1 if pd.isna(g["batch"]) else g["batch"]))]
            for bi, backend in enumerate(backends):
                hit = cell[cell["backend"] == backend]
                if hit.empty or pd.isna(hit.iloc[0]["x_ray"]):
                    continue
                e = hit.iloc[0]
                x = gi - 0.4 + width * (bi + 0.5)
                ax.plot([x, x], [1.0, e["x_ray"]], color=_COLOURS.get(backend, "0.5"), linewidth=2.5)
                ax.plot(x, e["x_ray"], marker="o", color=_COLOURS.get(backend, "0.5"), markersize=6)
                handles.setdefault(backend, handle(backend, _COLOURS.get(backend, "0.5"), "o", ""))
                if e["paper"] is not None and not pd.isna(e["paper"]):
                    ax.plot(x, e["paper"], marker="D", color="black", markersize=5, linestyle="")
                    handles.setdefault("paper", handle("paper: LF / Ray", "black", "D", ""))
        ax.axhline(1.0, color="0.4", linewidth=0.8)
        ax.set_xticks(np.arange(len(groups)), [_label({**g, "op": op}) for _, g in groups.iterrows()], fontsize=7)
        log_y(ax)
        ax.set_ylabel("speed over Ray (x, log)")
        ax.set_title(_TITLES[op], fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"LF benchmarks, run {run_id}: medians, each backend's speed over Ray's in the same run", fontsize=10)
    legend(fig, list(handles.values()), title="backend")
    diamonds = ("black diamonds: the paper's Lingua Franca over Ray ratio." if paper is not None else
                f"the paper's Lingua Franca over Ray ratios: {references.NOT_RECORDED}.")
    return Plot(fig, data, "Each backend's speed over Ray's in the same run (rates over Ray's rate, Ray's time over "
                           f"the backend's time); {diamonds}")


def report_section(data: pd.DataFrame | None, res, drawn: Mapping[str, pd.DataFrame]) -> list[str]:
    """The LF benchmarks (the lf figure's data): medians, speed over Ray, the paper's LF/Ray
    (where the run records ``paper.lf_over_ray``: :mod:`analysis.references`)."""
    if data is None:
        return []
    run_id = data["run_id"].iloc[0]
    recorded = references.recorded(res.metas.get(run_id), "paper", "lf_over_ray") is not None
    body = []
    for _, e in data.iterrows():
        unit = "s" if e["op"] == "pql" else "steps/s"
        batch = "-" if pd.isna(e["batch"]) else int(e["batch"])
        paper = "-" if e["paper"] is None or pd.isna(e["paper"]) else f"{e['paper']:.2f}x"
        x = "-" if pd.isna(e["x_ray"]) else f"{e['x_ray']:.2f}x"
        single = "-" if e["x_single"] is None or pd.isna(e["x_single"]) else f"{e['x_single']:.2f}x"
        body.append([e["op"], e["env"], e["policy"], int(e["actors"]), batch, e["backend"],
                     f"{md.num(e['median'])} {unit}", f"{md.num(e['min'])}-{md.num(e['max'])}", x, paper, single])
    return (["## Lingua Franca benchmarks", "",
             f"Run `{run_id}`. Lock-step sampling (random actions), parallel Q-learning on Blackjack "
             "(time for the run's rounds) and multi-agent inference, every backend in the same run; *x Ray* is the "
             "backend's speed over Ray's median in the same cell; *paper* is Lingua Franca's over Ray's in "
             + ("arXiv 2312.04704 (32-core AWS machine), shown on our static dataflow's line" if recorded else
                f"arXiv 2312.04704: {references.NOT_RECORDED}")
             + "; *x 1 process* is the speed "
             "over the one-process backend's (SyncVectorEnv, or the policies one after another). On a machine with "
             "fewer cores than actors, Ray's one process per env, actor or agent time-shares the cores (each message "
             "also wakes a scheduler), while the dataflow runs min(cores, envs) worker processes; the parallel "
             "Q-learning rows with 1 to 16 actors show how the gap moves with the number of actors.", ""]
            + md.table(["workload", "env", "replay", "actors", "batch", "backend", "median", "min-max", "x Ray",
                      "paper LF/Ray", "x 1 process"], body) + [""])
