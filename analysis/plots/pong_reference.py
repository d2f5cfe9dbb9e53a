"""Pong: our PAAC (A2C) and Stable-Baselines3's A2C on one axis of environment steps.

Rows: op ``episode``, metric ``return``, status ``ok``, algo ``a2c``, env :data:`ENV`, from two
scenarios: ``training`` (our PAAC runs: suites ``training-pong``, ``training-pong-zoo``) and
``frameworks`` with params ``framework: "sb3"`` (the reference: suite ``frameworks-a2c-pong``).
Each row is one finished episode with its raw return and the env steps (4 frames each, all
environments together) at its end, so both sides share the x axis.

Per side and suite, the newest run only (a rerun replaces an older run of the same suite);
per run and seed one line: the mean return of the last :data:`WINDOW` episodes (fewer at the
start of a run) against env steps, one point per episode. Each run has a colour of its own
(blues for ours, oranges for SB3's: :data:`SIDES`) and each suite a line style; a dotted line at
the threshold the reference runs record (params ``threshold``). Where the PAAC authors' code
starts to learn Pong (:data:`AUTHORS_ONSET_STEPS`, from their README;
../shared/context/papers.md) is a grey band when the runs reach half of it; runs that end long
before it keep their own x range (a band at 5M would squash 0.05M of steps into a sliver) and a
note at the right edge says how far the onset is. The title names the sides drawn
(:attr:`Plot.title`), never a side without runs. The CSV holds
every drawn point, with the wall seconds at each; :func:`report_section` gives per run the best
trailing mean and the env steps and wall time to it and to the threshold. A side without rows is left out and
named in the caption; :class:`NoRows` when neither side has rows. Cost: one pass over the episode rows.
"""

from __future__ import annotations

import pandas as pd

from replaybench.analysis import markdown as md
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, new_figure
from replaybench.bench import contract

__all__ = ["NAME", "ORDER", "TITLE", "CLAIMS", "ENV", "WINDOW", "THRESHOLD", "AUTHORS_ONSET_STEPS", "SIDES", "reference_rows",
           "curves", "milestones", "build", "report_section"]

NAME = "pong_reference"
ORDER = 51
TITLE = "Pong: return against env steps (PAAC, and Stable-Baselines3's A2C where stored)"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("paac-rate",)

ENV = "ALE/Pong-v5"
WINDOW = 20
#: The mean return issue 39 asks of our PAAC (and frameworks-a2c-pong records as its threshold).
THRESHOLD = -10.0
#: The PAAC authors' README: Pong "will begin to learn after about 5 million frames", counted by
#: their code once per 4-frame env step, so about 5M env steps (../shared/context/papers.md).
AUTHORS_ONSET_STEPS = 5_000_000

#: side -> (scenario, framework in params or None, the colours of its runs in order, where its rows come from)
SIDES = {"PAAC (ours)": ("training", None, ("#0072B2", "#56B4E9", "#009E73", "#1F3A93"),
                         "scenario 'training', algo 'a2c'"),
         "Stable-Baselines3 A2C": ("frameworks", "sb3", ("#D55E00", "#E69F00", "#CC79A7", "#8C564B"),
                                   "scenario 'frameworks', framework 'sb3', algo 'a2c'")}
#: Runs reaching this fraction of :data:`AUTHORS_ONSET_STEPS` get the onset band on their axis.
ONSET_SHOWN = 0.5
_STYLES = ["-", "--", ":", "-."]


def reference_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The episode-return rows of both sides on :data:`ENV`, with a ``side`` column, the newest
    run per side and suite."""
    rows = table[(table["op"] == "episode") & (table["metric"] == "return") & (table["status"] == contract.MEASURED)
                 & (table["algo"] == "a2c") & (table["env"] == ENV)]
    parts = []
    for side, (scenario, framework, _, _) in SIDES.items():
        mine = rows[rows["scenario"] == scenario]
        if framework is not None:
            mine = mine[[contract.params_of(p).get("framework") == framework for p in mine["params"]]]
        if mine.empty:
            continue
        mine = mine.assign(side=side, suite=mine["suite"].fillna("?") if "suite" in mine else "?")
        started = mine["started"].astype(str) if "started" in mine else ""
        order = started + "\x1f" + mine["run_id"].astype(str)
        parts.append(mine[order == order.groupby(mine["suite"]).transform("max")])
    return pd.concat(parts, ignore_index=True) if parts else rows.assign(side=[], suite=[])


def curves(rows: pd.DataFrame) -> pd.DataFrame:
    """Per side, suite, run and seed: ``env_steps``, ``mean_return`` (the mean of the last
    :data:`WINDOW` returns up to that episode) and ``episodes`` (how many that mean holds)."""
    parts = []
    for (side, suite, run_id, seed), g in rows.groupby(["side", "suite", "run_id", "seed"], dropna=False, sort=True):
        g = g.dropna(subset=["env_steps", "value"]).sort_values(["env_steps", "repeat"])
        if g.empty:
            continue
        values = g["value"].astype(float)
        parts.append(pd.DataFrame({"side": side, "suite": suite, "run_id": run_id, "seed": seed,
                                   "env_steps": g["env_steps"].astype(float).to_numpy(),
                                   "wall_s": g["wall_s"].astype(float).to_numpy(),
                                   "mean_return": values.rolling(WINDOW, min_periods=1).mean().to_numpy(),
                                   "episodes": values.rolling(WINDOW, min_periods=1).count().astype(int).to_numpy()}))
    columns = ["side", "suite", "run_id", "seed", "env_steps", "wall_s", "mean_return", "episodes"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def build(table, metas) -> Plot:
    rows = reference_rows(table)
    missing = [f"{side} ({where})" for side, (_, _, _, where) in SIDES.items() if not (rows["side"] == side).any()]
    if len(missing) == len(SIDES):
        raise NoRows(f"no rows for {' nor '.join(missing)} on {ENV} (op 'episode')")
    data = curves(rows)
    fig, axes = new_figure(1, 1, panel=(8.0, 4.2))
    ax = axes[0, 0]
    handles = []
    for side, (_, _, colours, _) in SIDES.items():
        mine = data[data["side"] == side]
        n = 0  # one colour per run and seed: three runs of one side are three colours
        for i, (suite, by_suite) in enumerate(mine.groupby("suite", sort=True)):
            style = _STYLES[i % len(_STYLES)]
            for (run_id, seed), line in by_suite.groupby(["run_id", "seed"], dropna=False, sort=True):
                colour = colours[n % len(colours)]
                n += 1
                ax.plot(line["env_steps"], line["mean_return"], color=colour, linestyle=style, linewidth=1.4)
                handles.append(handle(f"{side}: {run_id} (seed {seed})", colour, marker="", linestyle=style))
    # the reference suite's threshold (frameworks-a2c-pong: issue 30's -10) as the runs record it
    thresholds = sorted({float(t) for t in (contract.params_of(p).get("threshold") for p in
                                            rows.loc[rows["side"] == "Stable-Baselines3 A2C", "params"]) if t is not None})
    for t in thresholds:
        ax.axhline(t, color="0.4", linestyle=":", linewidth=1)
        handles.append(handle(f"threshold {t:g} (mean of {WINDOW})", "0.4", marker="", linestyle=":"))
    end = float(data["env_steps"].max())
    if end >= ONSET_SHOWN * AUTHORS_ONSET_STEPS:
        ax.axvspan(AUTHORS_ONSET_STEPS * 0.9, AUTHORS_ONSET_STEPS * 1.1, color="0.85", zorder=0)
        handles.append(handle("the PAAC authors' code starts to learn (~5M env steps, their README)", "0.85",
                              marker="s", linestyle=""))
    else:  # the onset is far past these runs: say so instead of squashing them against the y axis
        ax.set_xlim(0, end * 1.05)
        ax.annotate(f"the PAAC authors' code starts to learn at ~{AUTHORS_ONSET_STEPS / 1e6:.0f}M env steps\n"
                    f"(their README): {AUTHORS_ONSET_STEPS / end:.0f}x past the end of these runs \u2192",
                    (0.02, 0.97), xycoords="axes fraction", ha="left", va="top", fontsize=7.5, color="0.35")
    ax.set_xlabel("environment steps (4 frames each)")
    ax.set_ylabel(f"mean return of the last {WINDOW} episodes")
    ax.set_title(f"{ENV}: return against env steps", fontsize=10)
    ax.grid(alpha=0.3)
    legend(fig, handles)
    drawn = [side for side in SIDES if (data["side"] == side).any()]
    return Plot(fig, data, f"Mean return of the last {WINDOW} episodes against environment steps on {ENV}: "
                           + " and ".join({"PAAC (ours)": "our PAAC (scenario training)",
                                           "Stable-Baselines3 A2C": "Stable-Baselines3's A2C with rl-baselines3-zoo's "
                                                                    "Atari settings (scenario frameworks, suite "
                                                                    "frameworks-a2c-pong)"}[d] for d in drawn)
                + ", one line (and colour) per run and seed."
                + "".join(f" Not drawn, no stored run: {m}." for m in missing),
                title="Pong: " + " and ".join(drawn) + " on the same env steps")


def milestones(line: pd.DataFrame) -> dict:
    """Of one run and seed's curve (rows of :func:`curves`, in order): the best trailing mean over
    a full window (``best``, with the ``best_steps`` and ``best_wall_s`` of its first episode),
    the first full-window mean at or above :data:`THRESHOLD` (``threshold_steps``,
    ``threshold_wall_s``; None when never reached), the episodes and the env steps/s of the whole
    run (last env steps over last wall seconds)."""
    full = line[line["episodes"] >= WINDOW]
    out = {"episodes": len(line), "env_steps": float(line["env_steps"].iloc[-1]),
           "steps_per_s": float(line["env_steps"].iloc[-1] / line["wall_s"].iloc[-1])
           if line["wall_s"].iloc[-1] > 0 else None,  # False for NaN: a run without wall times
           "best": None, "best_steps": None, "best_wall_s": None, "threshold_steps": None, "threshold_wall_s": None}
    if not full.empty:
        best = full.loc[full["mean_return"].idxmax()]
        out.update(best=float(best["mean_return"]), best_steps=float(best["env_steps"]), best_wall_s=float(best["wall_s"]))
        reached = full[full["mean_return"] >= THRESHOLD]
        if not reached.empty:
            out.update(threshold_steps=float(reached["env_steps"].iloc[0]),
                       threshold_wall_s=float(reached["wall_s"].iloc[0]))
    return out


def report_section(data: pd.DataFrame | None, res, drawn) -> list[str]:
    """Per run and seed of the Pong figure: episodes, env steps/s, the best mean of the last
    :data:`WINDOW` episodes and the env steps and wall time to it and to :data:`THRESHOLD`, on
    the machine the run names."""
    if data is None or data.empty:
        return []

    def minutes(seconds):
        return "-" if seconds is None or pd.isna(seconds) else f"{seconds / 60:.0f} min"

    def steps(n):
        return "-" if n is None else f"{n / 1e6:.2f}M"

    body = []
    for (side, suite, run_id, seed), line in data.groupby(["side", "suite", "run_id", "seed"], dropna=False, sort=True):
        m = milestones(line)
        body.append([side, suite, f"`{run_id}`", str(seed), str(m["episodes"]), steps(m["env_steps"]),
                     "-" if m["steps_per_s"] is None else f"{m['steps_per_s']:,.0f}",
                     "-" if m["best"] is None else f"{m['best']:.1f}", steps(m["best_steps"]), minutes(m["best_wall_s"]),
                     steps(m["threshold_steps"]) if m["threshold_steps"] is not None else "not reached",
                     minutes(m["threshold_wall_s"])])
    return ["## Pong: time to the threshold", "",
            f"Per run: the best mean of the last {WINDOW} episodes, and the env steps and wall time (on the "
            f"machine of the run, learning included) to it and to the first mean >= {THRESHOLD:g}; env steps/s "
            f"over the whole run. The PAAC authors' code starts to learn after about "
            f"{AUTHORS_ONSET_STEPS / 1e6:.0f}M env steps.", ""] + md.table(
        ["side", "suite", "run", "seed", "episodes", "env steps", "steps/s", f"best mean of {WINDOW}", "at",
         "wall to best", f"to {THRESHOLD:g}", f"wall to {THRESHOLD:g}"], body) + [""]
