"""Drawing helpers shared by the figure modules (axes, legends, notes); no data logic."""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

__all__ = ["new_figure", "pow2", "capacity_axis", "draw_median", "note", "legend", "handle", "log_y", "log_x"]


def new_figure(nrows: int, ncols: int, panel=(4.4, 3.3), sharex=False, sharey=False):
    """A constrained-layout Figure and a 2-D array of its axes (``panel`` = inches per panel)."""
    fig = Figure(figsize=(panel[0] * ncols + 1.8, panel[1] * nrows + 0.9), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex, sharey=sharey)
    return fig, axes


def pow2(n) -> str:
    """``65536`` -> ``"$2^{16}$"``; other numbers as they are."""
    n = int(n)
    e = n.bit_length() - 1
    return f"$2^{{{e}}}$" if n > 0 and 1 << e == n else f"{n:,}"


def capacity_axis(ax, capacities, label="capacity (transitions)") -> None:
    """Log2 x axis with a tick at every capacity, labelled as powers of two."""
    caps = sorted({int(c) for c in capacities})
    ax.set_xscale("log", base=2)
    ax.set_xticks(caps, [pow2(c) for c in caps])
    ax.minorticks_off()
    if len(caps) == 1:
        ax.set_xlim(caps[0] / 2, caps[0] * 2)
    ax.set_xlabel(label)


def draw_median(ax, x, median, low, high, colour, label=None, marker="o", linestyle="-", **kw):
    """A median line with min-max error bars."""
    x, median = np.asarray(x, float), np.asarray(median, float)
    err = np.vstack([median - np.asarray(low, float), np.asarray(high, float) - median])
    ax.errorbar(x, median, yerr=np.clip(err, 0, None), color=colour, label=label, marker=marker, markersize=4,
                linestyle=linestyle, capsize=2.5, linewidth=1.4, elinewidth=0.9, **kw)


def log_y(ax) -> None:
    """Log y axis with ticks at 1, 2, 5 x 10^n written as plain numbers (no 4x10^1)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def log_x(ax) -> None:
    """:func:`log_y` for the x axis."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def note(ax, text: str, width: int = 40, **kw) -> None:
    """Grey text across the middle of a panel (for panels with nothing measurable), wrapped to
    ``width`` characters per line and left out of the layout so it cannot squeeze the panels."""
    lines = [part for para in str(text).splitlines() for part in (textwrap.wrap(para, width) or [""])]
    ax.text(0.5, 0.5, "\n".join(lines), transform=ax.transAxes, ha="center", va="center", fontsize=7.5,
            color="0.35", in_layout=False, clip_on=True, **kw)


def handle(label: str, colour: str, marker="o", linestyle="-", fillstyle="full") -> Line2D:
    """A legend entry (``fillstyle``: matplotlib's, "none" for a hollow marker)."""
    return Line2D([], [], color=colour, marker=marker, linestyle=linestyle, markersize=5, label=label,
                  fillstyle=fillstyle)


def legend(fig, handles, title=None) -> None:
    """One legend for the whole figure, right of the panels."""
    if handles:
        fig.legend(handles=handles, loc="outside right upper", title=title, fontsize=8, title_fontsize=8,
                   frameon=False)
