"""Our buffers inside other frameworks' DQN loops: cost per env step and learning, per buffer.

Rows: scenario ``frameworks``, algo ``dqn``, op ``summary`` (``ok`` rows). Per framework (params
``"framework"``), environment and buffer (``variant``; ``own`` = the framework's own buffer),
over runs (seeds, or seeds x two with the suite's order "abba"): the median, min and max of
``wall_per_step_s``, ``replay_share``, ``replay_per_step_s``, ``speedup_vs_own`` (one per
seed), ``time_to_threshold_s`` and ``steps_to_threshold`` (over the runs that reached it, with
how many did) and ``final_return``. The report also
sets each buffer's replay time per env step and speedup beside the framework's own buffer
and issue 29's targets, and names the bound that holds (:func:`bench.derive.replay_versus_own`).
Top row: milliseconds per env step as a bar split into the replay part (median share times median cost) and the rest, min-max over runs as an error bar, the
speedup over the framework's own buffer written above; PAL's reported speedup for its buffer in
existing frameworks (:func:`pal_speedup`, recorded from the suite) is in the caption and the
report's table. Bottom row: time to the reward
threshold (median, min-max), "not reached" where no seed reached it.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from replaybench.analysis import load, palette, references, stats
from replaybench.analysis import markdown as md
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import new_figure, note
from replaybench.bench import contract, derive

NAME = "frameworks"
ORDER = 60
#: The report's frameworks section follows the LF and gossip sections (ORDER 60 to 63).
REPORT_ORDER = 64
TITLE = "Our buffers inside Stable-Baselines3, Tianshou and TorchRL"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("pal-frameworks",)

METRICS = ("wall_per_step_s", "replay_share", "replay_per_step_s", "buffer_share", "buffer_per_step_s",
           "speedup_vs_own", "time_to_threshold_s", "steps_to_threshold", "final_return")
KEYS = ["framework", "env", "variant"]


def pal_speedup(metas) -> tuple[float, float] | None:
    """PAL's reported ``(low, high)`` speedup of sequential runs from plugging its buffer into
    existing frameworks, as the newest frameworks run records it (``paper.pal_speedup``,
    :mod:`analysis.references`); None when no run does."""
    _, paper = references.newest(metas, "paper", "pal_speedup", scenario="frameworks")
    return None if paper is None else (paper["low"], paper["high"])


def framework_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The frameworks scenario's DQN summary rows (the replay comparisons; its A2C reference runs
    have no buffer and are drawn by :mod:`analysis.plots.pong_reference`) with a ``framework``
    column (from params), of the newest run per framework, environment and buffer: runs of
    different suites use different settings (seeds, steps, hyper-parameters), so their seeds
    are not pooled."""
    rows = table[(table["scenario"] == "frameworks") & (table["op"] == "summary") & (table["algo"] == "dqn")]
    rows = rows.assign(framework=[contract.params_of(p).get("framework", "?") for p in rows["params"]],
                       env=rows["env"].fillna("?"))
    return load.latest_per_cell(rows, ("framework", "env", "variant"))


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per framework, environment, buffer and metric: spread over the ``ok`` seeds, plus
    ``n_seeds`` (runs: seeds x the suite's passes) and ``n_reached`` (runs with a value: for the
    threshold, those that reached it)."""
    ok = rows[(rows["status"] == contract.MEASURED) & rows["value"].notna() & rows["metric"].isin(METRICS)]
    ok = ok.assign(value=ok["value"].astype(float))
    data = stats.spread(ok, [*KEYS, "metric"], "value").rename(columns={"n": "n_reached"})
    runs = rows[rows["metric"] == "wall_per_step_s"].groupby(KEYS, dropna=False).size().rename("n_seeds")
    return data.merge(runs.reset_index(), on=KEYS, how="left")


def _order(variants) -> list[str]:
    return sorted(set(variants), key=lambda v: (v != "own", v))


def build(table, metas) -> Plot:
    rows = framework_rows(table)
    if rows.empty or not (rows["status"] == contract.MEASURED).any():
        raise NoRows("no frameworks runs (scenario 'frameworks')")
    data = summary(rows)
    panels = sorted(set(zip(data["framework"], data["env"])))
    fig, axes = new_figure(2, len(panels), panel=(3.6, 3.0))
    for c, (fw, env) in enumerate(panels):
        mine = data[(data["framework"] == fw) & (data["env"] == env)]
        variants = _order(mine["variant"])
        top, bottom = axes[0, c], axes[1, c]

        def get(variant, metric, field="median"):
            hit = mine[(mine["variant"] == variant) & (mine["metric"] == metric)]
            return None if hit.empty else float(hit[field].iloc[0])

        for x, v in enumerate(variants):
            colour = palette.variant_colour(v) if v != "own" else "0.45"
            ms = get(v, "wall_per_step_s")
            if ms is None:
                continue
            share = get(v, "replay_share") or 0.0
            lo, hi = get(v, "wall_per_step_s", "min"), get(v, "wall_per_step_s", "max")
            top.bar(x, 1e3 * ms * share, color=colour, edgecolor="white")
            top.bar(x, 1e3 * ms * (1 - share), bottom=1e3 * ms * share, color=colour, alpha=0.35, edgecolor="white")
            top.errorbar(x, 1e3 * ms, yerr=[[1e3 * (ms - lo)], [1e3 * (hi - ms)]], color="black", capsize=3,
                         linewidth=0.9)
            speed = get(v, "speedup_vs_own")
            label = f"{share:.0%} replay" + ("" if v == "own" or speed is None else f"\n{speed:.2f}x own")
            top.text(x, 1e3 * hi, label, ha="center", va="bottom", fontsize=7)
            t = get(v, "time_to_threshold_s")
            if t is None:
                bottom.text(x, 0, "not reached", ha="center", va="bottom", fontsize=7, color="0.35", rotation=90)
            else:
                tlo, thi = get(v, "time_to_threshold_s", "min"), get(v, "time_to_threshold_s", "max")
                bottom.bar(x, t, color=colour)
                bottom.errorbar(x, t, yerr=[[t - tlo], [thi - t]], color="black", capsize=3, linewidth=0.9)
                reached = int(get(v, "time_to_threshold_s", "n_reached"))
                bottom.text(x, thi, f"{reached}/{int(get(v, 'wall_per_step_s', 'n_seeds'))}", ha="center",
                            va="bottom", fontsize=7)
        for ax in (top, bottom):
            ax.set_xticks(range(len(variants)), variants, rotation=20, fontsize=8)
            ax.set_xlim(-0.6, len(variants) - 0.4)
        top.set_ylabel("ms per env step (dark: replay)")
        top.set_title(f"{fw}: {env}", fontsize=10)
        top.margins(y=0.25)
        bottom.set_ylabel("time to threshold (s)")
        if mine[mine["metric"] == "time_to_threshold_s"].empty:
            note(bottom, "no seed reached the threshold")
    fig.suptitle("Each framework's own DQN loop with its own buffer and with ours (median over runs, min-max)",
                 fontsize=10)
    data = data.sort_values([*KEYS, "metric"]).reset_index(drop=True)
    pal = pal_speedup(metas)
    pal = (f"PAL reports {pal[0]}-{pal[1]}x for its buffer in existing frameworks' sequential runs." if pal else
           f"PAL's reported speedup for its buffer in existing frameworks: {references.NOT_RECORDED}.")
    return Plot(fig, data, "Wall time per environment step of each framework's own DQN loop (replay part dark) and "
                           "time to the reward threshold, with the framework's own buffer and with ours; speedup "
                           f"over the own buffer above the bars. {pal}")


def report_section(data: pd.DataFrame | None, res, drawn: Mapping[str, pd.DataFrame]) -> list[str]:
    """Per framework and buffer (its own first): cost per env step, replay share, speedup over
    its own buffer beside PAL's reported range (recorded by the frameworks runs:
    :func:`pal_speedup`), time to threshold and final return; from
    the frameworks figure's data."""
    if data is None:
        return []
    pal = pal_speedup(res.metas)
    body, medians = [], {}
    for (fw, env, variant), g in data.groupby(["framework", "env", "variant"], sort=False):
        m = {r["metric"]: r for _, r in g.iterrows()}

        def cell(metric, scale=1.0, fmt="{:.3g}"):
            if metric not in m:
                return "-"
            r = m[metric]
            text = fmt.format(scale * r["median"])
            return text if r["n_reached"] < 2 else f"{text} ({fmt.format(scale * r['min'])}-{fmt.format(scale * r['max'])})"

        seeds = int(next(iter(m.values()))["n_seeds"])

        def threshold(metric, fmt):
            reached = int(m[metric]["n_reached"]) if metric in m else 0
            return f"{cell(metric, fmt=fmt)} ({reached}/{seeds} runs)" if reached else f"not reached (0/{seeds})"
        med = medians[(fw, env, variant)] = {k: float(r["median"]) for k, r in m.items()}
        if "replay_per_step_s" not in med and {"replay_share", "wall_per_step_s"} <= med.keys():
            # runs from before the row existed: replay / steps = share * wall / steps (of the medians)
            med["replay_per_step_s"] = med["replay_share"] * med["wall_per_step_s"]
        body.append((variant != "own", [fw, env, f"`{variant}`", str(seeds), cell("wall_per_step_s", 1e3),
                                        cell("replay_share", 100, "{:.0f}%"),
                                        cell("replay_per_step_s", 1e6, "{:.1f}"),
                                        "1 (reference)" if variant == "own" else cell("speedup_vs_own", fmt="{:.2f}"),
                                        threshold("time_to_threshold_s", "{:.3g}"),
                                        threshold("steps_to_threshold", "{:.0f}"),
                                        cell("final_return", fmt="{:.0f}")]))
    body = [line for _, line in sorted(body, key=lambda b: (b[1][0], b[1][1], b[0], b[1][2]))]
    if pal:
        versus = (f"PAL reports {pal[0]}-{pal[1]}x for its buffer in existing frameworks' sequential runs: compare "
                  "with the speedup column, which is bounded by ")
    else:
        versus = (f"PAL's reported speedup for its buffer in existing frameworks: {references.NOT_RECORDED}. The "
                  "speedup column is bounded by ")
    return (["## Inside other frameworks", "", "Each framework's own DQN loop (`replaybench run --suite frameworks`, or "
             "either half alone: `frameworks-sb3-tianshou`, `frameworks-torchrl`; `frameworks-tianshou` runs "
             "Tianshou's half with ten seeds, and the newest run of each framework is the one shown) "
             "with its own buffer (`own`; Stable-Baselines3 has no prioritized one, so its own is uniform) and with "
             "ours through `replaybench.adapters`, with the settings of the suite that ran it (since issue 29 the "
             "settings each framework's users run: the suite's `per_framework`, each with its source), the same seeds "
             "and settings for both buffers. Medians over runs (min-max): a seed per run, or with the suite's "
             "`order` \"abba\" two runs per seed and buffer, in the order ours, own, own, ours so that the host's "
             "drift cancels from the speedup, which is then one per seed (both own runs' mean time over both of "
             "ours); "
             "replay share = the buffer's add, sample and priority-update calls over the loop's wall time; time to "
             "threshold over the runs that reached it (a run that did not is counted in the runs and says why in "
             "its row). " + versus
             + "the own buffer's share of the loop, every call into it (a loop that spends 10% in its buffer gains at "
             "most 1.11x; below).", ""]
            + md.table(["framework", "env", "buffer", "runs", "ms per env step", "replay share",
                      "replay us per env step", f"speedup vs own (PAL: {pal[0]}-{pal[1]}x)" if pal else "speedup vs own",
                      "time to threshold (s)", "env steps to threshold", "final return"], body) + [""]
            + _targets_section(medians, res))


def _targets_section(medians: dict, res) -> list[str]:
    """Issue 29's targets per framework and buffer (from the medians over seeds): replay time
    per env step ours/own, the speedup, and which bound holds (:func:`bench.derive.replay_bound`)."""
    _, targets = references.newest(res.metas, "targets", "frameworks", scenario="frameworks")
    goal = (targets or {}).get("speedup_at_least", derive.FRAMEWORK_TARGETS["speedup_at_least"])
    body = []
    for (fw, env, variant), ours in sorted(medians.items()):
        own = medians.get((fw, env, "own"))
        v = None if variant == "own" or own is None else derive.replay_versus_own(fw, own, ours, targets)
        if v is None:
            continue
        aim = "reported (own is uniform)" if v["replay_target"] is None else f"<= {v['replay_target']:g}"
        met = "" if v["replay_target"] is None else (" met" if v["replay_ratio"] <= v["replay_target"] else " missed")
        speed = "-" if v["speedup"] is None else f"{v['speedup']:.2f}"
        share = f"{100 * v['share_own']:.1f}%" + ("" if v["calls"] == "every call" else " (replay only)")
        body.append([fw, env, f"`{variant}`", f"{v['replay_ratio']:.2f} ({aim}{met})", share,
                     f"{v['buffer_ratio']:.2f}", f"{v['ceiling']:.2f}", f"{v['predicted']:.2f}", speed,
                     v["bound"] or "-"])
    if not body:
        return []
    # Runs from before the targets were recorded are held to issue 29's, which the suite states now.
    source = " (the runs recorded none: issue 29's)" if targets is None else ""
    return (["### Against issue 29's targets", "",
             f"Replay time per env step, ours over the framework's own (target <= 0.5x where the own buffer is "
             f"prioritized), and the loop's speedup (target >= {goal:g}x){source}. The own buffer's share `s` of the "
             "loop, every call into it (add, sample, priority update, and the reads the framework's own code makes: "
             "Tianshou's n-step returns' `buffer[indices]`, `next`, `unfinished_index`; runs from before those were "
             "timed: the replay share), bounds the speedup: swapping buffers changes that time only, so the speedup "
             "is at most `1 / (1 - s)` (any buffer) and, with that time's ratio `r` (ours over own), predicted "
             f"`1 / (1 - s + s r)`. Bound: `met`; `share` (`1 / (1 - s)` < {goal:g}: no buffer reaches the target "
             "in this loop); `replay` (our buffer's time is the limit); `loop` (the buffer times predict the target, "
             "the rest of the loop took longer).", ""]
            + md.table(["framework", "env", "buffer", "replay per env step, ours/own", "own buffer share s",
                        "buffer calls ours/own r", "max speedup 1/(1-s)", "predicted 1/(1-s+sr)",
                        f"speedup (>= {goal:g})", "bound"], body)
            + [""])
