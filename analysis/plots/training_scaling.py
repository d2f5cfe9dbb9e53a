"""Training at scale: speedup over the sequential loop against workers, in the papers' shape.

Rows: scenario ``training``, op ``summary``, newest run per cell; metrics ``speedup``
(env_steps_per_s over the sequential baseline of the same run, seed and task),
``time_to_threshold_s``, ``env_steps_per_s`` and ``updates_per_s``, one value per seed.
Plotted, one row of panels per task (algorithm, environment, updates per env step, envs per
actor): the median over seeds with min-max bars against **workers** (actor + learner processes)
on a log2 axis, one line per run, engine, learner device and settings (a marker each, named in
the legend) and number of learners (and per variant / policy when there are several), a line
style per engine; where a panel holds rows of several runs (the newest run per cell differs from
cell to cell), each line and each run's baseline is labelled with its run. The speedup panel
comes first, with the ideal line (speedup = workers) through the sequential loop's point (1
worker, 1x), as PAL's and the other papers' scaling figures draw it; a learner on another
device or with other settings (a CUDA learner) is measured against the sequential loop of the same
device (bench's baseline key), which the legend and the axis say. The env-steps panel draws each
sequential baseline as a dotted line of its own: one per run, learner device and settings (a CPU
and a CUDA baseline are two lines, each labelled, never one line through both). updates/s is
env steps/s times the task's updates per step: it has no panel (the CSV and the report's table
keep it). Where a panel holds several runs, each line and baseline carries a short tag (r1,
r2 ...) that the legend names, instead of a run id written at every line end. Tasks without
parallel rows (PAAC's batched runs, sequential only) get no panel; their rows stay in the CSV,
which the report's table reads.

Time to threshold: a seed that never reached the threshold has no time (its row's status is not
``ok``): the median is taken over the seeds that did, the point is labelled ``k/n`` when only k
of n seeds reached it, and a configuration where none did is an ``x`` on the top edge labelled
"not reached". A configuration that never ran (a layout past the machine's cores, skipped; a
device the machine lacks) is no point of the figure nor of its CSV. A task in which **no** run (the baseline included) reached the threshold gets no
time panel at all (its row of panels is one shorter); the report says so in one line
(:func:`unreached_tasks`). The CSV keeps ``n_reached``, ``n_seeds`` and ``workers`` for each point.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from replaybench.analysis import markdown as md
from replaybench.analysis import references, stats
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import handle, legend, new_figure
from replaybench.analysis.plots._training import (CONFIG, buffer_label, learner_label, several_buffers, training_rows,
                                                   worker_colour)
from replaybench.bench import contract

NAME = "training_scaling"
ORDER = 51
TITLE = "Training at scale: speedup over the sequential loop against workers"
#: The papers' claims this figure bears on (its place on a host's page: analysis.plots).
CLAIMS = ("pal-convergence",)

_METRICS = [("speedup", "speedup over the sequential loop\n(same run and learner device) (x)"),
            ("time_to_threshold_s", "time to threshold (s)"),
            ("env_steps_per_s", "environment steps/s"), ("updates_per_s", "updates/s")]
#: The metrics drawn (updates/s = env steps/s x updates per step: in the CSV and the table only).
_DRAWN = ("speedup", "time_to_threshold_s", "env_steps_per_s")
#: Colours of the sequential baselines by learner (the default CPU learner black).
_BASELINE_COLOURS = ["#000000", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"]

#: Line styles of the engines: solid for the process engine, then the others in the order of their names.
_ENGINE_STYLES = ["-", "--", "-.", (0, (3, 1, 1, 1, 1, 1))]
_BUFFER_MARKERS = ["o", "s", "^", "D", "v", "P"]
_FILLS = ["full", "none", "left", "bottom", "right", "top"]


def unreached_tasks(data: pd.DataFrame | None) -> list[str]:
    """The tasks the figure draws (those with parallel rows) whose time-to-threshold panel is
    left out: they have time_to_threshold_s rows and no run of theirs (the baseline included)
    reached the threshold."""
    if data is None or data.empty or "n_reached" not in data:
        return []
    drawn = set(data.loc[~data["baseline"].astype(bool) & data["actors"].notna(), "task"])
    ttt = data[(data["metric"] == "time_to_threshold_s") & data["task"].isin(drawn)]
    reached = ttt.groupby("task")["n_reached"].max()
    return sorted(reached[reached == 0].index)


def _panels(data: pd.DataFrame, task: str) -> list[tuple[str, str]]:
    """The task's panels: every metric it has, time to threshold only when some run reached it."""
    have = set(data.loc[data["task"] == task, "metric"])
    unreached = set(unreached_tasks(data[data["task"] == task]))
    return [(m, label) for m, label in _METRICS
            if m in have and m in _DRAWN and not (m == "time_to_threshold_s" and task in unreached)]


def build(table, metas) -> Plot:
    rows = training_rows(table, "summary")
    rows = rows[rows["metric"].isin([m for m, _ in _METRICS])]
    if rows.empty:
        raise NoRows("no training summaries (scenario 'training', op 'summary')")
    rows = rows.assign(algo=rows["algo"].fillna("?"), env=rows["env"].fillna("?"))
    keys = [*CONFIG, "metric", "baseline"]
    ok = rows[(rows["status"] == "ok") & rows["value"].notna()]
    data = stats.spread(ok, keys, "value")
    seeds = rows.groupby(keys, dropna=False)["seed"].nunique().rename("n_seeds").reset_index()
    data = seeds.merge(data, on=keys, how="left")
    data["n_reached"] = data["n"].fillna(0).astype(int)
    # a configuration that never ran (skipped past the machine's cores, unavailable, failed) has
    # no measured rate: it is no point of the figure (its rows stay in the results)
    rates = data[data["metric"] != "time_to_threshold_s"]
    ran = rates.groupby(keys[:-2] + ["baseline"], dropna=False)["n_reached"].max().rename("ran").reset_index()
    data = data.merge(ran, on=keys[:-2] + ["baseline"], how="left")
    data = data[data["ran"].fillna(0) > 0].drop(columns="ran")
    # workers: the processes that step envs or learn (the parent only watches); the sequential loop is one
    data["workers"] = [1 if b else int((0 if pd.isna(a) else a) + (0 if pd.isna(l_) else l_))
                       for a, l_, b in zip(data["actors"], data["learners"], data["baseline"])]
    # a task is drawn against workers only when it has parallel rows with an actor count (PAAC's
    # batched runs have none: their figures are paac_throughput and training_curves)
    parallel = data[~data["baseline"] & data["actors"].notna()]
    tasks = sorted(set(parallel["task"]))
    if not tasks:
        raise NoRows("no parallel training summaries with an actor count")
    several = several_buffers(data)
    # the process engine (the harness's own, in most rows) solid, the others after it by name
    engines = sorted(set(parallel["engine"].dropna().astype(str)), key=lambda e: (e != "process", e))
    dashes = {e: _ENGINE_STYLES[i % len(_ENGINE_STYLES)] for i, e in enumerate(engines)}
    # several buffers: a marker each, so that lines of one learner count and engine (one colour,
    # one dash) still differ where the legend is not beside them
    buffers = sorted({buffer_label(r) for _, r in parallel.iterrows()}) if several else []
    markers = {b: _BUFFER_MARKERS[i % len(_BUFFER_MARKERS)] for i, b in enumerate(buffers)}
    # learners on another device or with other settings (a CUDA learner, lag=1): a marker each
    # (the CPU learner with the default settings first: "o"), unless the buffers took the markers
    learners_seen = sorted({learner_label(r) for _, r in parallel.iterrows()})
    learner_markers = ({w: _BUFFER_MARKERS[i % len(_BUFFER_MARKERS)] for i, w in enumerate(learners_seen)}
                       if len(learners_seen) > 1 and not several else {})
    # ... and where the buffers took the markers, a fill each (the CPU learner with the defaults full),
    # so that a CUDA learner's point never looks like the CPU learner's
    learner_fills = ({w: _FILLS[i % len(_FILLS)] for i, w in enumerate(learners_seen)}
                     if len(learners_seen) > 1 and several else {})
    panels = {task: _panels(data, task) for task in tasks}
    fig, axes = new_figure(len(tasks), max(len(p) for p in panels.values()), panel=(4.2, 3.2))
    handles = {}
    # a short tag per run, named once in the legend (run ids written at each line end overlapped)
    tags = {run: f"r{i + 1}" for i, run in enumerate(sorted(set(data["run_id"].astype(str))))}
    baselines = sorted({learner_label(r) for _, r in data[data["baseline"]].iterrows()})
    base_colour = {b: _BASELINE_COLOURS[i % len(_BASELINE_COLOURS)] for i, b in enumerate(baselines)}
    tagged = set()  # the runs whose tag a panel shows
    for r, task in enumerate(tasks):
        for c in range(len(panels[task]), axes.shape[1]):
            axes[r, c].remove()  # a panel left out (no run reached the threshold): the row is shorter
        for c, (metric, ylabel) in enumerate(panels[task]):
            ax = axes[r, c]
            cell = data[(data["task"] == task) & (data["metric"] == metric)]
            several_runs = cell["run_id"].nunique() > 1  # then each line and baseline names its run
            base = cell[cell["baseline"]]
            top = float(cell["max"].max()) if cell["max"].notna().any() else 1.0
            xs = sorted(set(cell.loc[~cell["baseline"], "workers"].astype(int)))
            if metric == "speedup":
                # the papers' ideal: speedup = workers, through the sequential loop's (1, 1)
                ideal = [1, *xs]
                ax.plot(ideal, ideal, color="0.55", linestyle="--", linewidth=1.0)
                ax.plot([1], [1.0], marker="o", color="black", markersize=4)
                handles.setdefault("ideal", handle("ideal (speedup = workers)", "0.55", "", "--"))
                handles.setdefault("sequential", handle("sequential loop (1 worker)", "black", "o", ""))
                top = max(top, min(float(max(xs, default=1)), 2.0 * top))
                xs = [1, *xs]
            elif not base.empty and base["median"].notna().any():
                # one dotted line per run, learner device and settings: each its own baseline (a
                # CPU and a CUDA sequential loop are two measurements; a line through both is neither)
                groups = list(base.groupby(["run_id", "device", "settings"], dropna=False, sort=True))
                for (run_id, _, _), one in groups:
                    if not one["median"].notna().any():
                        continue
                    level = one["median"].median()
                    who = learner_label(one.iloc[0])
                    colour = base_colour[who]
                    ax.axhline(level, color=colour, linestyle=":", linewidth=1.2)
                    if len(groups) > 1 or several_runs:
                        if several_runs:
                            tagged.add(str(run_id))
                        ax.annotate((f"{tags[str(run_id)]} " if several_runs else "") + "seq." + (f", {who}" if who else ""),
                                    (1.0, level), xycoords=ax.get_yaxis_transform(), fontsize=6, ha="right",
                                    va="bottom", color=colour)
                    handles.setdefault(f"sequential {who}", handle("sequential baseline" + (f" ({who} learner)" if who
                                                                                         else ""), colour, "", ":"))
            elif not base.empty:  # the baseline has rows but no value: it never reached the threshold
                ax.text(0.02, 0.02, "sequential: not reached", transform=ax.transAxes, fontsize=7)
            # one line per engine too: the engines' rates differ by design, and one line through
            # the process engine's point at 2 workers and Ray's at 3 would draw a trend that no engine has;
            # and per run: a line never joins points of two runs (the newest run per cell may differ
            # from point to point)
            group = ["run_id"] + (["variant", "K", "policy"] if several else []) + ["engine", "device", "settings",
                                                                                     "learners"]
            for key, line in cell[~cell["baseline"]].groupby(group, dropna=False, sort=True):
                line = line.sort_values("workers")
                first = line.iloc[0]
                colour = worker_colour(first["learners"], False)
                marker = (markers.get(buffer_label(first), "o") if several
                          else learner_markers.get(learner_label(first), "o"))
                fill = learner_fills.get(learner_label(first), "full")
                engine = None if pd.isna(first["engine"]) else str(first["engine"])
                n = 0 if pd.isna(first["learners"]) else int(first["learners"])
                label = (f"{n} learner{'s' * (n != 1)}" + (f" ({buffer_label(first)})" if several else "")
                         + (f", {engine} engine" if len(engines) > 1 and engine else "")
                         + (f", {learner_label(first)}" if learner_label(first) else ""))
                x = line["workers"].astype(float).to_numpy()
                reached = line["median"].notna().to_numpy()
                med = line["median"].to_numpy(float)
                ax.errorbar(x[reached], med[reached], yerr=[med[reached] - line["min"].to_numpy(float)[reached],
                                                            line["max"].to_numpy(float)[reached] - med[reached]],
                            color=colour, marker=marker, markersize=4, capsize=2, linewidth=1.4,
                            linestyle=dashes.get(engine, "-"), fillstyle=fill)
                for xi, (_, p) in zip(x, line.iterrows()):
                    if metric != "time_to_threshold_s":
                        continue
                    if p["n_reached"] == 0:  # drawn near the top edge, whatever the scale
                        ax.plot(xi, 0.92, marker="x", color=colour, transform=ax.get_xaxis_transform())
                        ax.annotate("not reached", (xi, 0.92), xycoords=ax.get_xaxis_transform(), fontsize=6,
                                    color=colour, ha="center", va="top", xytext=(0, -5), textcoords="offset points")
                    elif p["n_reached"] < p["n_seeds"]:
                        ax.annotate(f"{p['n_reached']}/{p['n_seeds']}", (xi, p["median"]), fontsize=6, color=colour,
                                    xytext=(3, 3), textcoords="offset points")
                if several_runs and reached.any():
                    tagged.add(str(first["run_id"]))
                    ax.annotate(tags[str(first["run_id"])], (x[reached][-1], med[reached][-1]), fontsize=6,
                                color=colour, xytext=(3, -3), textcoords="offset points")
                handles.setdefault(label, handle(label, colour, marker, linestyle=dashes.get(engine, "-"), fillstyle=fill))
            ax.set_xscale("log", base=2)
            if xs:
                ax.set_xticks(xs, [str(v) for v in xs])
                ax.set_xlim(min(xs) / 1.3, max(xs) * 1.3)  # room for the k/n labels
            ax.minorticks_off()
            ax.set_ylim(0, top * 1.12)
            ax.grid(alpha=0.3)
            ax.set_xlabel("workers (actor + learner processes)")
            ax.set_ylabel(ylabel)
            # the task on two lines ("dqn on CartPole-v1" over its ratio and envs): on one line the
            # longest ("..., 0.015625 updates/step, 16 envs/actor") ran into the next panel's title
            ax.set_title(task.replace(", ", "\n", 1), fontsize=9)
    left_out = unreached_tasks(data)
    # one short line: the legend's top stands beside it (the speedup's reference is in its axis label,
    # the left-out time panels in the caption and the report)
    fig.suptitle("Training at scale: median over seeds, bars = min-max", fontsize=10)
    if tagged:  # the runs behind the tags
        handles.update({f"run {tags[run]}": handle(f"{tags[run]}: {run}", "white", "", "") for run in sorted(tagged)})
    legend(fig, list(handles.values()), title="learners")
    data = data.sort_values(["task", "metric", "learners", "actors"]).reset_index(drop=True)
    return Plot(fig, data, "Speedup over the sequential loop (same run and learner device), time to the reward "
                           "threshold and env steps/s, against workers (actor + learner processes, log2), one line per "
                           "run and number of learners; dashed: the ideal speedup; dotted: each sequential baseline "
                           "(per run and learner device). updates/s (env steps/s x updates per step) is in the CSV "
                           "and the table." + (" Time-to-threshold panels are left out where no run reached the "
                                               "threshold." if left_out else ""))


def report_section(data: pd.DataFrame | None, res, drawn: Mapping[str, pd.DataFrame]) -> list[str]:
    """One row per training configuration of every task the training_scaling figure draws (a task
    is an algorithm, environment and updates-per-step ratio), each engine on its own row (a run
    may measure the same layout on several: process and ray, say); per task and buffer, its
    sequential baseline first."""
    if data is None:
        return []
    keys = ["task", "run_id", "variant", "K", "policy", "engine", "device", "settings", "actors", "learners",
            "baseline"]
    rows = []
    for key, g in data.groupby(keys, dropna=False, sort=False):
        k = dict(zip(keys, key))
        a, n = int(k["actors"]), int(k["learners"])
        K = None if pd.isna(k["K"]) else int(k["K"])
        who = "sequential" if k["baseline"] else f"{a} actor{'s' * (a != 1)}, {n} learner{'s' * (n != 1)}"
        who += f" ({learner_label(k)})" if learner_label(k) else ""
        variant = f"`{k['variant']}`" + ("" if K is None else f" K={K}")
        engine = "-" if k["engine"] is None or pd.isna(k["engine"]) else str(k["engine"])
        line = [k["task"], engine, f"{variant} {k['policy'] or ''}".strip(), who]
        for metric in ("time_to_threshold_s", "speedup", "env_steps_per_s", "updates_per_s"):
            hit = g[g["metric"] == metric]
            if hit.empty:
                line.append("-")
                continue
            h = hit.iloc[0]  # one row per configuration and metric (the figure's data)
            text = md.num(h["median"])
            if metric == "time_to_threshold_s":
                reached = f"{int(h['n_reached'])}/{int(h['n_seeds'])} seeds"
                text = f"not reached ({reached})" if h["n_reached"] == 0 else f"{text} ({reached})"
            line.append(text)
        order = (k["task"], str(k["run_id"]), str(k["variant"]), K or 0, not k["baseline"], engine, str(k["policy"]),
                 a, n, str(k["device"]), str(k["settings"]))
        rows.append((order, line))
    body = [line for _, line in sorted(rows, key=lambda r: r[0])]
    return (["## Training", "", "Per task (algorithm, environment, gradient updates per environment step) and buffer, "
             "the sequential baseline first, then each parallel configuration, one row per engine that ran it "
             "(docs/engines/); workers = actor + learner processes. Medians over seeds; time to threshold "
             "over the seeds that reached it (k/n = k of n seeds reached it); speedup over the sequential baseline "
             "of the same task and seed.", ""]
            + md.table(["task", "engine", "variant / policy", "workers", "time to threshold (s)", "speedup",
                        "env steps/s", "updates/s"], body) + [""] + left_out_line(data) + bounds_section(res))


def left_out_line(data: pd.DataFrame | None) -> list[str]:
    """One line naming the tasks whose time-to-threshold panel the figure leaves out (no run of
    theirs reached the threshold), then a blank line; ``[]`` when every panel is drawn."""
    tasks = unreached_tasks(data)
    if not tasks:
        return []
    return [f"The figure leaves out the time-to-threshold panel of {'; '.join(tasks)}: no run of "
            f"{'that task' if len(tasks) == 1 else 'those tasks'} reached the reward threshold.", ""]


#: The summary metrics of :func:`bounds_section`: (metric, the ``training_bounds`` target's key, at least?).
_BOUND_METRICS = [("bound_fraction", "bound_fraction_at_least", True),
                  ("learner_replay_inrun_over_alone", "learner_replay_inrun_over_alone_at_most", False)]


def _met(low: float, high: float, goal, at_least: bool) -> str:
    """Whether every seed (``low``..``high``) meets ``goal``: "yes", "no" (none does), "within spread"."""
    if goal is None:
        return "-"
    if at_least:
        return "**yes**" if low >= goal else "no" if high < goal else "within spread"
    return "**yes**" if high <= goal else "no" if low > goal else "within spread"


def bounds_section(res) -> list[str]:
    """The training section's second table: per configuration that states them (rows of metric
    ``bound_fraction`` and ``learner_replay_inrun_over_alone``, bench.bound and the process
    engine's replay timing), what bounds it (the kind most of its seeds name), the fraction of
    that bound reached and the learner's in-run replay over the same calls alone: medians over
    seeds with min-max, against the run's ``targets.training_bounds`` (:mod:`analysis.references`;
    met = every seed meets it); per task and buffer the sequential baseline first. ``[]`` when no
    run states a bound."""
    rows = training_rows(res.table, "summary")
    rows = rows[rows["metric"].isin([m for m, _, _ in _BOUND_METRICS]) & (rows["status"] == "ok")
                & rows["value"].notna()]
    if rows.empty:
        return []
    keys = ["task", "run_id", "variant", "K", "policy", "engine", "device", "settings", "actors", "learners",
            "baseline"]
    body = []
    for key, g in rows.groupby(keys, dropna=False, sort=False):
        k = dict(zip(keys, key))
        kinds = [contract.params_of(p).get("bound") for p in g.loc[g["metric"] == "bound_fraction", "params"]]
        kinds = [x for x in kinds if x]
        kind = max(sorted(set(kinds)), key=kinds.count) if kinds else "-"
        goals = references.recorded(res.metas.get(k["run_id"]), "targets", "training_bounds") or {}
        who = ("sequential" if k["baseline"] else
               f"{int(k['actors'])} A, {int(k['learners'])} L" + ("" if pd.isna(k["engine"]) else f" {k['engine']}"))
        who += f" ({learner_label(k)})" if learner_label(k) else ""
        line = [k["task"], f"`{k['variant']}` {k['policy'] or ''}".strip(), who,
                f"{kind} ({len(kinds)}/{g['seed'].nunique()} seeds)" if kinds else "-"]
        for metric, goal_key, at_least in _BOUND_METRICS:
            v = g.loc[g["metric"] == metric, "value"].astype(float)
            if v.empty:
                line += ["-", "-"]
                continue
            goal = goals.get(goal_key)
            text = f"{md.num(v.median())} ({md.num(v.min())}-{md.num(v.max())})"
            line += [text if goal is None else f"{text} vs {'>=' if at_least else '<='} {goal:g}",
                     _met(v.min(), v.max(), goal, at_least)]
        order = (k["task"], str(k["run_id"]), str(k["variant"]), not k["baseline"], str(k["policy"]),
                 str(k["engine"]), int(k["actors"] or 0), int(k["learners"] or 0), str(k["device"]), str(k["settings"]))
        body.append((order, line))
    body = [line for _, line in sorted(body, key=lambda r: r[0])]
    return (["What bounds each training configuration (bench.bound: the actors, the learners, or the buffer when "
             "replay is the binding role's largest busy section) and the fraction of that bound it reached; and the "
             "learner's replay seconds per update in the run over the same calls timed alone after it (sample + "
             "priority update, same buffer and batch). Medians over seeds (min-max); met = every seed meets the "
             f"run's target ({references.NOT_RECORDED} where a run has none).", ""]
            + md.table(["task", "variant / policy", "workers", "bound", "of bound", "met", "replay in-run / alone",
                        "met"], body) + [""])
