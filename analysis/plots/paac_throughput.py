"""PAAC stepping: env steps/s against the number of environments n_e, one panel per n_w.

Rows: scenario ``paac``, op ``step`` (metric ``env_steps_per_s``, one value per timed window),
newest run per cell. Per environment (a row of panels) and number of worker processes n_w (a
column; EnvPool: threads): one line per method (the rows' ``stepping``: ``paac``, ``paac-halves``, ``per-env``,
``envpool``), the median over windows with min-max bars, against n_e on a log2 axis (log y).
The single-process and one-process-per-env peers (``gym-sync``, ``gym-async``) have no n_w
axis and are drawn dashed in every panel of their environment.
"""

from __future__ import annotations

import pandas as pd

from replaybench.analysis import load, references, stats
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import capacity_axis, draw_median, handle, legend, log_y, new_figure, note
from replaybench.bench import contract

NAME = "paac_throughput"
ORDER = 56
TITLE = "PAAC stepping: env steps/s vs environments, per worker count"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("paac-rate",)

#: Method -> (colour, marker); methods without an n_w axis are dashed.
METHOD_STYLE = {"paac": ("#0072B2", "o"), "paac-halves": ("#009E73", "s"), "per-env": ("#D55E00", "v"),
                "envpool": ("#CC79A7", "D"), "gym-sync": ("#000000", "^"), "gym-async": ("#7F7F7F", "x")}
NO_WORKER_AXIS = ("gym-sync", "gym-async")


def stepping_rows(table: pd.DataFrame, op: str) -> pd.DataFrame:
    """Scenario ``paac`` rows of ``op`` ("step" or "profile"), newest run per cell, with
    ``n_envs`` and ``n_workers`` taken from params."""
    rows = table[(table["scenario"] == "paac") & (table["op"] == op)]
    rows = load.latest_per_cell(rows, contract.CELL_COLUMNS)
    params = [contract.params_of(p) for p in rows["params"]]
    return rows.assign(n_envs=[p.get("n_envs") for p in params], n_workers=[p.get("n_workers") for p in params])


def throughput(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, env, method, n_e, n_w): median, min, max and n of env steps/s."""
    rows = stepping_rows(table, "step")
    rows = rows[(rows["status"] == contract.MEASURED) & rows["value"].notna()]
    if rows.empty:
        return rows
    data = stats.spread(rows, ["run_id", "env", "stepping", "n_envs", "n_workers"], "value")
    return data.rename(columns={"stepping": "method"}).assign(unit="steps/s")


def build(table, metas) -> Plot:
    data = throughput(table)
    if data.empty:
        raise NoRows("no PAAC stepping rows (scenario 'paac', op 'step')")
    envs = sorted(set(data["env"]))
    workers = sorted({int(w) for w in data.loc[~data["method"].isin(NO_WORKER_AXIS), "n_workers"]}) or [0]
    fig, axes = new_figure(len(envs), len(workers), panel=(3.6, 3.0))
    handles = {}
    for r, env in enumerate(envs):
        mine = data[data["env"] == env]
        for c, n_w in enumerate(workers):
            ax = axes[r, c]
            ax.set_title(f"{env}, n_w = {n_w}", fontsize=9)
            panel = mine[(mine["n_workers"] == n_w) | mine["method"].isin(NO_WORKER_AXIS)]
            if panel.empty:
                note(ax, f"nothing measured at n_w = {n_w}")
                continue
            for method, line in panel.groupby("method", sort=True):
                line = line.sort_values("n_envs")
                colour, marker = METHOD_STYLE.get(method, ("#999999", "."))
                dashed = "--" if method in NO_WORKER_AXIS else "-"
                draw_median(ax, line["n_envs"], line["median"], line["min"], line["max"], colour, marker=marker,
                            linestyle=dashed)
                handles.setdefault(method, handle(method, colour, marker, dashed))
            capacity_axis(ax, mine["n_envs"], label="environments n_e")
            log_y(ax)
            ax.grid(alpha=0.3, which="both")
            if c == 0:
                ax.set_ylabel("env steps/s")
    legend(fig, [handles[m] for m in METHOD_STYLE if m in handles], title="method")
    caption = ("Env steps per second of each way to drive n_e environments with one network (median over timed "
               "windows, min-max bars): PAAC's shared-memory stepping with one batched forward (and with two halves "
               "overlapping inference and stepping), today's per-environment inference over the same n_w processes, "
               "EnvPool with n_w threads; gymnasium's SyncVectorEnv (one process) and AsyncVectorEnv (a process per "
               "env) dashed in every panel.")
    return Plot(fig, data, caption)


def target_ratios(table: pd.DataFrame, metas, targets: dict | None = None) -> pd.DataFrame:
    """PAAC's stepping against each peer at the targets' number of environments, per run and
    env: one row per (run, env, peer, n_w) with both medians, the ratio of medians, its range
    ``[min paac / max peer, max paac / min peer]`` and the target. The targets are each run's
    ``targets.paac_stepping`` (:mod:`analysis.references`: ``n_envs`` and, per peer, the ratio
    PAAC must reach, or None); runs that record none are left out. ``targets``, when given,
    stands for every run's (e.g. to compare a quick run at its own n_envs).

    PAAC is the faster of ``paac`` and ``paac-halves`` at each n_w; against ``per-env`` the
    comparison is at the same n_w (the same number of processes stepping), against the other
    peers PAAC's best n_w counts (n_w is then the PAAC cell's)."""
    data = throughput(table)
    if data.empty:
        return data
    out = []
    for (run_id, env), mine in data.groupby(["run_id", "env"]):
        goal = targets or references.recorded(metas.get(run_id), "targets", "paac_stepping")
        if goal is None:
            continue
        n_envs = goal["n_envs"]
        mine = mine[mine["n_envs"] == n_envs]
        paac = mine[mine["method"].isin(["paac", "paac-halves"])]
        if paac.empty:
            continue
        best_per_nw = paac.loc[paac.groupby("n_workers")["median"].idxmax()]
        best = best_per_nw.loc[best_per_nw["median"].idxmax()]
        for peer, target in goal["at_least"].items():
            theirs = mine[mine["method"] == peer]
            for _, p in theirs.iterrows():
                if peer == "per-env":
                    hit = best_per_nw[best_per_nw["n_workers"] == p["n_workers"]]
                    if hit.empty:
                        continue
                    ours = hit.iloc[0]
                else:
                    ours = best
                out.append({"run_id": run_id, "env": env, "n_envs": n_envs, "peer": peer,
                            "n_workers": int(ours["n_workers"]), "peer_n_workers": int(p["n_workers"]),
                            "paac_method": ours["method"], "paac": ours["median"], "peer_median": p["median"],
                            "ratio": ours["median"] / p["median"], "ratio_low": ours["min"] / p["max"],
                            "ratio_high": ours["max"] / p["min"], "target": target})
    return pd.DataFrame(out)
