"""One headline figure per claim and host: our cells beside the paper's number.

Drawn from a verdict's points (:class:`analysis.claims.Point`, computed by the claim's rule from
one host's runs) and nothing else, so a headline shows exactly the cells its row of the findings
table sums up. Layout, for ``draw(claim, verdict, host)``:

- **cells** (points without ``x``): one column per cell label, one marker per series (ours, a
  baseline of ours ...) with its min-max range as an error bar, the value written beside it; no
  line joins two markers. Many cells, or long labels, lie along the y axis instead (rows, the
  value across). Value axis logarithmic where the values span more than :data:`LOG_SPAN`; a
  grey line at 1 on a ratio axis (parity).
- **lines** (points with ``x``, e.g. processes): one line per series and run (a line never
  joins two runs), log2 x axis.
- **the paper's number**: ``claim.mark``, or a number every point shares, as one horizontal
  red dashed line across the figure labelled "<paper>: <number>"; numbers per cell as a short red
  line over each cell, labelled with the paper and the number; numbers along a line (linear
  scaling) as a red dashed line through them. Every mark's artist has ``gid`` :data:`MARK`, so
  checks of data lines can tell it apart.

A verdict with fewer than :data:`MIN_POINTS` points gets no figure: :class:`analysis.plots.NoRows`
says why (no data: the row names the suite that would answer; one value: the row gives it with
its spread). :func:`render_all` draws every verdict of ``findings.verdict_rows`` into
``<host folder>/claims/<claim>.png`` (+ ``.svg`` and the ``.csv`` of the points), removing the
outputs of claims it no longer draws there. Output is deterministic (:func:`analysis.render.save`).
Cost: one small figure per claim and host.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from replaybench.analysis import claims as claims_mod
from replaybench.analysis import findings
from replaybench.analysis import markdown as md
from replaybench.analysis import palette
from replaybench.analysis import render
from replaybench.analysis.plots import NoRows, Plot
from replaybench.analysis.plots._common import log_x, log_y, new_figure

__all__ = ["draw", "render_all", "points_frame", "Headlines", "FOLDER", "MARK", "PARITY", "MIN_POINTS", "LOG_SPAN"]

#: The sub-folder of a host's figure folder that holds the headline figures.
FOLDER = "claims"
#: ``gid`` of every artist that draws the paper's number (not a measured line).
MARK = "paper-mark"
#: ``gid`` of the line at 1 on a ratio axis (parity, not a measurement).
PARITY = "parity"
#: Fewer points than this: no figure (the findings row already gives the one value).
MIN_POINTS = 2
#: Values spanning more than this factor go on a logarithmic axis.
LOG_SPAN = 20.0

_PAPER_COLOUR = "#C00000"
#: Series colours in order of appearance: ours first (PAL blue), then greys and other hues.
_SERIES_COLOURS = ["#0072B2", "#7F7F7F", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000"]
_COLUMNS = ["claim", "host", "series", "label", "x", "value", "low", "high", "run_id", "paper"]


def points_frame(claim, verdict, host: str) -> pd.DataFrame:
    """The verdict's points as the CSV beside the figure: one row per point, columns
    :data:`_COLUMNS` (``paper``: the paper's number for the cell, ``claim.mark`` where the claim
    gives one number for all)."""
    rows = [{"claim": claim.name, "host": host, "series": p.series, "label": p.label, "x": p.x, "value": p.value,
             "low": p.low, "high": p.high, "run_id": p.run_id,
             "paper": p.paper if p.paper is not None else claim.mark} for p in verdict.points]
    return pd.DataFrame(rows, columns=_COLUMNS)


def _colour(series: str, i: int) -> str:
    """A series named after a policy or variant ("global-lock (learners)", "binary (ours)") keeps
    its colour of every other figure (:mod:`analysis.palette`); others take the i-th colour."""
    word = series.split(" ")[0]
    if word in palette.POLICY_COLOURS:
        return palette.policy_colour(word)
    if word in palette.VARIANT_COLOURS:
        return palette.variant_colour(word)
    return _SERIES_COLOURS[i % len(_SERIES_COLOURS)]


def _why_not(claim, verdict) -> str | None:
    """Why the verdict gets no figure, or None when it gets one."""
    if verdict.verdict == claims_mod.NO_DATA or not verdict.points:
        return "no data: no figure (the row names what would answer it)"
    if len(verdict.points) < MIN_POINTS:
        p = verdict.points[0]
        return f"one value ({md.num(p.value)}, range {md.num(p.low)}-{md.num(p.high)}): the row gives it"
    return None


def _shared_mark(claim, data: pd.DataFrame) -> float | None:
    """The one paper number drawn across the figure: ``claim.mark``, or the number every point shares."""
    if claim.mark is not None:
        return float(claim.mark)
    papers = set(data["paper"].dropna())
    return float(papers.pop()) if len(papers) == 1 and data["paper"].notna().all() else None


def _scale(ax, data: pd.DataFrame, mark: float | None, ratio: bool, horizontal: bool = False) -> None:
    """The value axis (x when ``horizontal``): logarithmic where the values and marks span more
    than :data:`LOG_SPAN`, else from 0; a line at 1 (:data:`PARITY`) on a ratio axis."""
    values = [*data["low"], *data["high"], *data["paper"].dropna()] + ([mark] if mark is not None else [])
    values = [v for v in values if v is not None and np.isfinite(v) and v > 0]
    logarithmic = bool(values) and max(values) / min(values) > LOG_SPAN
    # the same axis either way: x for horizontal cells (more room for the value labels), else y
    set_lim, log_axis, parity = ((ax.set_xlim, log_x, ax.axvline) if horizontal
                                 else (ax.set_ylim, log_y, ax.axhline))
    if logarithmic:
        log_axis(ax)
        set_lim(min(values) / 1.6, max(values) * (2.2 if horizontal else 1.8))
    else:
        set_lim(0, max(values, default=1.0) * (1.22 if horizontal else 1.18))
    if ratio:
        parity(1.0, color="0.45", linewidth=0.8, zorder=0, gid=PARITY)


def _horizontal(data: pd.DataFrame) -> bool:
    """Cells laid out along y (labels readable) where there are many or their labels are long."""
    labels = list(dict.fromkeys(data["label"]))
    return data["x"].isna().all() and (len(labels) > 5 or max((len(lb) for lb in labels), default=0) > 24)


def _cells(ax, claim, data: pd.DataFrame, series: list[str], colours: dict, horizontal: bool = False) -> None:
    labels = list(dict.fromkeys(data["label"]))
    # side by side within a cell: only the series that cell has (a cell of one series sits centred)
    present = {lb: [s for s in series if ((data["label"] == lb) & (data["series"] == s)).any()] for lb in labels}
    for s in series:
        part = data[data["series"] == s]
        pos = np.array([labels.index(lb) - 0.35 + 0.7 / len(present[lb]) * (present[lb].index(s) + 0.5)
                        for lb in part["label"]], float)
        v = part["value"].to_numpy(float)
        err = np.clip(np.vstack([v - part["low"].to_numpy(float), part["high"].to_numpy(float) - v]), 0, None)
        if horizontal:
            ax.errorbar(v, pos, xerr=err, fmt="o", linestyle="none", color=colours[s], markersize=5, capsize=2.5,
                        elinewidth=1.1, label=s)
        else:
            ax.errorbar(pos, v, yerr=err, fmt="o", linestyle="none", color=colours[s], markersize=6, capsize=3,
                        elinewidth=1.1, label=s)
        for pi, vi in zip(pos, v):
            ax.annotate(md.num(vi), (vi, pi) if horizontal else (pi, vi), xytext=(0, 5) if horizontal else (5, 0),
                        textcoords="offset points", fontsize=7, ha="center" if horizontal else "left",
                        va="bottom" if horizontal else "center", color=colours[s])
    per_cell = data.dropna(subset=["paper"]).drop_duplicates(subset=["label"])
    if _shared_mark(claim, data) is None:
        for _, p in per_cell.iterrows():
            i = labels.index(p["label"])
            text = f"{claim.paper} {md.num(p['paper'])}"
            if horizontal:
                ax.vlines(p["paper"], i - 0.42, i + 0.42, colors=_PAPER_COLOUR, linestyles="--", linewidth=1.6,
                          gid=MARK)
                ax.annotate(text, (p["paper"], i + 0.42), xytext=(2, -2), textcoords="offset points", fontsize=7,
                            color=_PAPER_COLOUR, ha="left", va="bottom", gid=MARK)
            else:
                ax.hlines(p["paper"], i - 0.42, i + 0.42, colors=_PAPER_COLOUR, linestyles="--", linewidth=1.6,
                          gid=MARK)
                ax.annotate(text, (i + 0.42, p["paper"]), xytext=(2, 2), textcoords="offset points", fontsize=7,
                            color=_PAPER_COLOUR, ha="right", va="bottom", gid=MARK)
    if horizontal:
        ax.set_yticks(range(len(labels)), [textwrap.fill(lb, 40) for lb in labels], fontsize=7.5)
        ax.set_ylim(len(labels) - 0.4, -0.6)  # the first cell on top
        return
    long = max((len(lb) for lb in labels), default=0) > 12
    ax.set_xticks(range(len(labels)), [textwrap.fill(lb, 22) for lb in labels], rotation=20 if long else 0,
                  ha="right" if long else "center", fontsize=8)
    ax.set_xlim(-0.6, len(labels) - 0.4)


def _lines(ax, claim, data: pd.DataFrame, series: list[str], colours: dict) -> None:
    several_runs = data["run_id"].nunique() > 1
    drawn_paper = False
    for s in series:
        for run_id, line in data[data["series"] == s].groupby("run_id", sort=True):  # one run per line
            line = line.sort_values("x")
            v = line["value"].to_numpy(float)
            err = np.clip(np.vstack([v - line["low"].to_numpy(float), line["high"].to_numpy(float) - v]), 0, None)
            ax.errorbar(line["x"].to_numpy(float), v, yerr=err, color=colours[s], marker="o", markersize=4,
                        capsize=2.5, linewidth=1.4, label=s + (f" ({run_id})" if several_runs else ""))
            paper = line.dropna(subset=["paper"])
            if len(paper) >= 2 and not drawn_paper:  # the paper's line (one: every series shares it)
                ax.plot(paper["x"].to_numpy(float), paper["paper"].to_numpy(float), color=_PAPER_COLOUR,
                        linestyle="--", linewidth=1.4, gid=MARK, label=f"{claim.paper}: {claim.number}")
                drawn_paper = True
    xs = sorted(set(data["x"].astype(float)))
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.minorticks_off()


def draw(claim, verdict, host: str) -> Plot:
    """The headline figure of ``claim`` on ``host`` from ``verdict.points``; raises
    :class:`analysis.plots.NoRows` with the reason where it gets none (see the module docstring)."""
    why = _why_not(claim, verdict)
    if why:
        raise NoRows(why)
    data = points_frame(claim, verdict, host)
    series = list(dict.fromkeys(data["series"]))
    colours = {s: _colour(s, i) for i, s in enumerate(series)}
    lines = bool(data["x"].notna().all())
    horizontal = _horizontal(data)
    cells = data["label"].nunique()
    fig, axes = new_figure(1, 1, panel=(6.2, max(3.6, 0.42 * cells + 1.0) if horizontal else 3.6))
    ax = axes[0, 0]
    mark = _shared_mark(claim, data)
    if lines:
        _lines(ax, claim, data, series, colours)
    else:
        _cells(ax, claim, data, series, colours, horizontal)
    if mark is not None:
        label = f"{claim.paper}: {claim.number}" + ("" if mark == claim.mark and lines else f" (line at {md.num(mark)})")
        (ax.axvline if horizontal else ax.axhline)(mark, color=_PAPER_COLOUR, linestyle="--", linewidth=1.4, gid=MARK,
                                                    label=label)
    _scale(ax, data, mark, claim.axis.endswith("(x)"), horizontal)
    (ax.set_xlabel if horizontal else ax.set_ylabel)(textwrap.fill(claim.axis, 60 if horizontal else 34))
    if lines:
        ax.set_xlabel("processes")
    ax.grid(alpha=0.3, axis="x" if horizontal else "y")
    ax.set_title(textwrap.fill(f"{claim.paper}: {claim.claim}", 70) + f"\nhost {host}; verdict: {verdict.verdict}",
                 fontsize=9.5)
    if mark is None and not lines and data["paper"].notna().any():  # per-cell marks: say what the red lines are
        ax.plot([], [], color=_PAPER_COLOUR, linestyle="--", gid=MARK, label=f"{claim.paper}'s number per cell")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5, frameon=False)
    caption = (f"{claim.claim} ({claim.paper}: {claim.number}) on host {host}: {claim.metric}; markers are our "
               "medians (or ratios of medians from one run) with their min-max ranges; red dashed: the paper's "
               "number.")
    return Plot(fig, data, caption)


@dataclass
class Headlines:
    """What :func:`render_all` did per ``(claim name, host)``: ``written`` -> [png, svg, csv]
    paths, ``left_out`` -> the one-line reason."""

    written: dict = field(default_factory=dict)
    left_out: dict = field(default_factory=dict)


def render_all(verdicts: list[dict], folders: dict, hosts_of_runs: dict | None = None) -> Headlines:
    """Draw every verdict row with a host (``findings.verdict_rows``) into
    ``folders[host] / FOLDER``; ``hosts_of_runs`` ({run id: host}, optional) refuses a point of
    another host's run (:class:`analysis.findings.PooledHosts`). Old outputs in those folders
    that this call does not write again are removed, so no headline outlives its data."""
    out = Headlines()
    keep: dict[Path, set] = {}
    for row in verdicts:
        claim, verdict, host = row["claim"], row["verdict"], row["host"]
        if host not in folders:
            continue
        folder = Path(folders[host]) / FOLDER
        keep.setdefault(folder, set())
        if hosts_of_runs is not None:
            others = sorted({hosts_of_runs.get(r, "?") for p in verdict.points for r in p.run_id.split(", ")} - {host})
            if others:
                raise findings.PooledHosts(f"claim {claim.name!r}: points of host {host} from runs of "
                                           f"{', '.join(others)}")
        try:
            plot, paths = render.save(lambda: draw(claim, verdict, host), folder, claim.name)
        except NoRows as why:
            out.left_out[(claim.name, host)] = str(why)
            continue
        keep[folder].add(claim.name)
        out.written[(claim.name, host)] = paths
    for folder, names in keep.items():
        if folder.is_dir():
            for stale in sorted(folder.iterdir()):
                if stale.is_file() and stale.suffix in render.EXTENSIONS and stale.stem not in names:
                    stale.unlink()
    return out
