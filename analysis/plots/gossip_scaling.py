"""Gossip learners: env steps/s, time to threshold, bytes sent per step and time waiting
against the number of learners, one line per scheme (runs without a straggler).

Rows: scenario ``gossip``, op ``summary``, newest run per cell; one value per seed. Plotted:
the median over seeds with min-max bars. A scheme whose seeds did not all reach the threshold
is labelled ``k/n``; one that never did is an ``x`` on the top edge. PAAC (one learner, its
environments stepped by worker processes) is a single point at 1 learner. A task measured at one
learner count only has nothing to draw against learners: its panels are bars, one per scheme
(median, min-max), titled with that count, and so is the figure's title (:attr:`Plot.title`).
:func:`gossip_rows` is the row selection the other gossip figures share.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from replaybench.analysis import load, references, stats
from replaybench.analysis import markdown as md
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, new_figure
from replaybench.bench import contract

__all__ = ["gossip_rows", "scheme_colour", "scheme_label", "summary_spread", "report_section"]

NAME = "gossip_scaling"
ORDER = 61
TITLE = "Gossip learners: throughput, time to threshold and communication against learners"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("gala-straggler",)

_METRICS = [("env_steps_per_s", "env steps/s (all learners)"), ("time_to_threshold_s", "time to threshold (s)"),
            ("bytes_per_step", "bytes sent per env step"), ("wait_fraction", "fraction of time waiting")]
_COLOURS = {"gossip": "#0072B2", "gossip-free": "#56B4E9", "allreduce": "#D55E00", "independent": "#7F7F7F",
            "paac": "#009E73"}
_CELL = ["scenario", "op", "metric", "variant", "topology", "env", "learners", "seed", "straggler"]


def gossip_rows(table: pd.DataFrame, op: str) -> pd.DataFrame:
    """Rows of scenario ``gossip`` and ``op``, newest run per (scheme, topology, learners,
    straggler, seed, metric), with ``straggler`` (the slowdown) and ``scheme`` (a label
    with the topology for gossip) added."""
    rows = table[(table["scenario"] == "gossip") & (table["op"] == op)]
    if rows.empty:
        return rows
    rows = rows.assign(straggler=[float(contract.params_of(p).get("straggler_slowdown", 1.0)) for p in rows["params"]])
    rows = load.latest_per_cell(rows, _CELL)
    return rows.assign(scheme=[scheme_label(v, t) for v, t in zip(rows["variant"], rows["topology"])])


def scheme_label(variant, topology) -> str:
    """``gossip (exponential/p1/k2)``, or the variant alone for the baselines."""
    return f"{variant} ({topology})" if isinstance(topology, str) and topology not in ("", "none") else str(variant)


def scheme_colour(label: str) -> str:
    return _COLOURS.get(label.split(" ")[0], "#CC79A7")


def summary_spread(rows: pd.DataFrame) -> pd.DataFrame:
    """Median, min, max over seeds per (scheme, env, learners, straggler, metric), with
    ``n_seeds`` (runs) and ``n_reached`` (runs with an ``ok`` value)."""
    keys = ["scheme", "env", "learners", "straggler", "metric"]
    ok = rows[(rows["status"] == "ok") & rows["value"].notna()]
    data = stats.spread(ok, keys, "value")
    seeds = rows.groupby(keys, dropna=False)["seed"].nunique().rename("n_seeds").reset_index()
    data = seeds.merge(data, on=keys, how="left")
    data["n_reached"] = data["n"].fillna(0).astype(int)
    return data


def build(table, metas) -> Plot:
    rows = gossip_rows(table, "summary")
    if rows.empty:
        raise NoRows("no gossip summaries (scenario 'gossip', op 'summary')")
    data = summary_spread(rows[rows["metric"].isin([m for m, _ in _METRICS])])
    data = data[data["straggler"] == 1.0]
    if data.empty:
        raise NoRows("no gossip runs without a straggler")
    envs = sorted(set(data["env"]))
    counts = {env: sorted(set(data.loc[data["env"] == env, "learners"].dropna().astype(int))) for env in envs}
    fig, axes = new_figure(len(envs), len(_METRICS), panel=(3.8, 3.1))
    handles = {}
    for r, env in enumerate(envs):
        for c, (metric, ylabel) in enumerate(_METRICS):
            ax = axes[r, c]
            cell = data[(data["env"] == env) & (data["metric"] == metric)]
            top = float(cell["max"].max()) if cell["max"].notna().any() else 1.0
            if len(counts[env]) == 1:  # one learner count: bars per scheme, not a line against learners
                _bars(ax, cell, top, handles)
                ax.set_ylabel(ylabel)
                ax.set_title(f"a2c on {env}, {counts[env][0]} learners", fontsize=10)
                continue
            for scheme, line in cell.groupby("scheme", sort=True):
                line = line.sort_values("learners")
                colour = scheme_colour(scheme)
                x = line["learners"].astype(float).to_numpy()
                med = line["median"].to_numpy(float)
                reached = line["median"].notna().to_numpy()
                ax.errorbar(x[reached], med[reached], yerr=[med[reached] - line["min"].to_numpy(float)[reached],
                                                            line["max"].to_numpy(float)[reached] - med[reached]],
                            color=colour, marker="o", markersize=4, capsize=2, linewidth=1.4)
                for xi, (_, p) in zip(x, line.iterrows()):
                    if p["n_reached"] == 0:
                        ax.plot(xi, 0.92, marker="x", color=colour, transform=ax.get_xaxis_transform())
                    elif p["n_reached"] < p["n_seeds"]:
                        ax.annotate(f"{p['n_reached']}/{p['n_seeds']}", (xi, p["median"]), fontsize=6, color=colour,
                                    xytext=(3, 3), textcoords="offset points")
                handles.setdefault(scheme, handle(scheme, colour))
            xs = sorted(set(cell["learners"].dropna().astype(int)))
            if xs:
                ax.set_xscale("log", base=2)
                ax.set_xticks(xs, [str(v) for v in xs])
                ax.minorticks_off()
            ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)
            ax.grid(alpha=0.3)
            ax.set_xlabel("learners")
            ax.set_ylabel(ylabel)
            ax.set_title(f"a2c on {env}", fontsize=10)
    single = all(len(n) == 1 for n in counts.values())
    fig.suptitle("Gossip vs all-reduce vs independent learners: median over seeds, "
                 + ("error bars = min-max" if single else "bars = min-max; x = threshold not reached"), fontsize=10)
    legend(fig, list(handles.values()), title="scheme")
    data = data.sort_values(["env", "metric", "scheme", "learners"]).reset_index(drop=True)
    against = ("at one number of learners (" + ", ".join(f"{env}: {n[0]}" for env, n in counts.items())
               + "; nothing to draw against learners, so one bar per scheme)" if single else
               "against the number of learners")
    title = (f"Gossip learners at {counts[envs[0]][0]} learners: throughput, time to threshold and communication"
             if single and len({n[0] for n in counts.values()}) == 1 else "")
    return Plot(fig, data, "Env steps/s over all learners, time to the reward threshold (pooled episodes), bytes "
                           "sent per env step (all-reduce: the nominal ring volume) and the mean fraction of time a "
                           f"learner waits, {against}, without a straggler.", title=title)


def _bars(ax, cell: pd.DataFrame, top: float, handles: dict) -> None:
    """One bar per scheme (median, min-max error bar; "not reached" where no seed reached it)."""
    schemes = sorted(set(cell["scheme"]))
    for i, scheme in enumerate(schemes):
        p = cell[cell["scheme"] == scheme].iloc[0]
        colour = scheme_colour(scheme)
        if p["n_reached"] == 0 or pd.isna(p["median"]):
            ax.text(i, top * 0.05, "not\nreached", ha="center", va="bottom", fontsize=7.5, color=colour)
        else:
            ax.bar(i, p["median"], 0.7, color=colour,
                   yerr=[[p["median"] - p["min"]], [p["max"] - p["median"]]], capsize=3)
            if p["n_reached"] < p["n_seeds"]:
                ax.annotate(f"{int(p['n_reached'])}/{int(p['n_seeds'])}", (i, p["max"]), fontsize=6, color=colour,
                            ha="center", xytext=(0, 3), textcoords="offset points")
        handles.setdefault(scheme, handle(scheme, colour, marker="s", linestyle=""))
    ax.set_xticks(range(len(schemes)), [s.split(" ")[0] for s in schemes], fontsize=8)
    ax.set_xlim(-0.6, len(schemes) - 0.4)  # the slot of a scheme with no bar stays in view
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    ax.grid(alpha=0.3, axis="y")


def report_section(data: pd.DataFrame | None, res, drawn: Mapping[str, pd.DataFrame]) -> list[str]:
    """Issue 15's targets (the newest gossip run's ``targets.gossip``: :mod:`analysis.references`)
    beside what the gossip figures measured (medians over seeds)."""
    scaling, straggler = data, drawn.get("gossip_straggler")
    if scaling is None:
        return []
    _, targets = references.newest(res.metas, "targets", "gossip", scenario="gossip")

    def med(data, scheme_prefix, metric=None, **where):
        d = data[data["scheme"].str.startswith(scheme_prefix)]
        if metric is not None:
            d = d[d["metric"] == metric]
        for k, v in where.items():
            d = d[d[k] == v]
        return d

    body = []
    n = targets["learners"] if targets else None
    at_n = scaling[scaling["learners"] == n] if targets else scaling.iloc[0:0]
    allreduce = med(at_n, "allreduce", "time_to_threshold_s")
    ar = allreduce["median"].iloc[0] if not allreduce.empty else None
    if targets is None:
        body.append(["issue 15's targets", "-", references.NOT_RECORDED, "-"])
    for _, g in med(at_n, "gossip", "time_to_threshold_s").iterrows():
        reached = f"{int(g['n_reached'])}/{int(g['n_seeds'])} seeds"
        text = f"{md.num(g['median'])} s ({reached}) vs all-reduce {md.num(ar)} s" if ar is not None else \
            f"{md.num(g['median'])} s ({reached}); all-reduce not reached"
        verdict = "-" if pd.isna(g["median"]) or ar is None or pd.isna(ar) else \
            ("met" if g["median"] <= ar else "not met")
        body.append([f"{n} learners: gossip reaches the threshold in no more wall time than all-reduce",
                     g["scheme"], text, verdict])
    if targets and med(at_n, "gossip", "time_to_threshold_s").empty:
        body.append([f"{n} learners: gossip reaches the threshold in no more wall time than all-reduce", "-",
                     f"no {n}-learner runs in these results", "-"])
    if straggler is not None and targets:
        least = targets["straggler_at_least_x_allreduce"]
        slowed = straggler[(straggler["straggler"] > 1.0) & straggler["scheme"].str.startswith("gossip")]
        for _, g in slowed.iterrows():
            ratio = g["x_allreduce"]
            body.append([f"{int(g['learners'])} learners, one slowed {g['straggler']:g}x: gossip >= {least:g}x the "
                         "env steps/s of all-reduce", g["scheme"],
                         f"{md.num(g['median'])} vs {md.num(g['allreduce_median'])} steps/s = {md.num(ratio)}x",
                         "-" if pd.isna(ratio) else ("met" if ratio >= least else "not met")])
    consensus = drawn.get("gossip_consensus")
    if consensus is not None:
        for (scheme, n), g in consensus.groupby(["scheme", "learners"], sort=True):
            if not scheme.startswith(("gossip", "independent")):
                continue
            body.append([f"{int(n)} learners: consensus distance stays bounded (largest over the run, per bound k)",
                         scheme,
                         f"max {md.num(g['distance'].max())}, last {md.num(g.sort_values('repeat')['distance'].iloc[-1])}",
                         "see figure"])
    return (["## Gossip learners", "",
             "Issue 15's targets beside the measurements (medians over seeds; `replaybench run --suite gossip`). "
             "The staleness bound k is a bound on rounds: a learner runs at most k rounds ahead of an in-peer, so "
             "with a permanent straggler every learner of a connected graph ends up at the straggler's pace plus "
             "k rounds of slack; only gossip without a bound (`gossip-free`) can leave it behind, at the price of "
             "a consensus distance that the bound no longer limits. On 2 cores, 4 or 8 learners share 2 cores: "
             "throughput cannot grow with learners there, so the figures show the trend, not the scaling.", ""]
            + md.table(["target", "scheme", "measured", "verdict"], body) + [""])
