"""Build every figure from a :class:`analysis.load.Results` and save it: PNG, SVG and the CSV.

For figure module ``NAME`` the outputs are ``<out>/NAME.png``, ``NAME.svg`` and ``NAME.csv``
(the numbers drawn, one row per point or bar). A figure whose rows are absent is skipped
with one line saying why, and its old outputs are removed so that the folder never shows a
figure the current results do not support. A figure that raises is reported and the others
are still drawn.

Unchanged results give byte-identical files (:func:`save_figure`): no date or software version
in the SVG and PNG metadata, a fixed hash salt for the SVG's ids, and the clip-path ids
renumbered in order of definition. The last is needed because matplotlib names a clip path by
a hash of its rectangle's coordinates at full precision, and constrained layout's solver
(kiwisolver) can place an axes one unit in the last place differently from one process to the
next (its sums run in an order set by object addresses): the drawn coordinates, rounded, are
equal, but the ids were not.
"""

from __future__ import annotations

import io
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display: the figures are built without pyplot anyway

from replaybench.analysis import plots  # noqa: E402

__all__ = ["Outcome", "render", "save", "save_figure", "EXTENSIONS"]

EXTENSIONS = (".png", ".svg", ".csv")
_RC = {"svg.hashsalt": "replaybench", "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9,
       "legend.fontsize": 8}


@dataclass
class Outcome:
    """What happened to each figure: ``written`` {name: [paths]}, ``skipped`` and ``failed``
    {name: one-line reason}, ``captions`` {name: caption}, ``titles`` {name: title: the
    plot's own where it gives one, else the module's ``TITLE``} and ``data`` {name: the
    DataFrame saved as CSV}."""

    written: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    failed: dict = field(default_factory=dict)
    captions: dict = field(default_factory=dict)
    titles: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)


#: A clip path's definition in matplotlib's SVG: ``<clipPath id="p0123456789">``.
_CLIP_DEF = re.compile(r'<clipPath id="(p[0-9a-f]{10})">')


def _stable_clip_ids(svg: str) -> str:
    """``svg`` with each clip-path id replaced by ``clip<n>``, n its place among the definitions
    (ids are only referenced inside the file, so the drawing is unchanged). Cost: O(len(svg))."""
    names = {old: f"clip{i}" for i, old in enumerate(dict.fromkeys(_CLIP_DEF.findall(svg)))}
    if not names:
        return svg
    return re.sub(r"\b(" + "|".join(names) + r")\b", lambda m: names[m.group(1)], svg)


def save_figure(figure, png: Path, svg: Path) -> None:
    """Write ``figure`` as PNG and SVG, both the same bytes whenever the figure is drawn alike
    (see the module docstring); call it inside :data:`_RC` (the SVG hash salt)."""
    figure.savefig(png, dpi=110, metadata={"Software": None})
    text = io.StringIO()
    figure.savefig(text, format="svg", metadata={"Date": None})
    Path(svg).write_text(_stable_clip_ids(text.getvalue()), encoding="utf-8")


def save(make, out: Path, name: str) -> tuple:
    """``make()`` (-> :class:`analysis.plots.Plot`) drawn inside the house style and saved as
    ``out/name`` .png, .svg and .csv (the plot's data); ``(plot, [png, svg, csv])``. Whatever
    ``make`` raises propagates and nothing is written."""
    out = Path(out)
    with matplotlib.rc_context(_RC):
        plot = make()
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / f"{name}{ext}" for ext in EXTENSIONS]
        save_figure(plot.figure, paths[0], paths[1])
    plot.data.to_csv(paths[2], index=False)
    return plot, paths


def _remove(out: Path, name: str) -> None:
    for ext in EXTENSIONS:
        (out / f"{name}{ext}").unlink(missing_ok=True)


def render(results, out_dir, echo=print, only=None) -> Outcome:
    """Draw every figure module (or those named in ``only``) into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    outcome = Outcome()
    for module in plots.modules():
        name = module.NAME
        if only and name not in only:
            continue
        outcome.titles[name] = module.TITLE
        try:
            plot, paths = save(lambda: module.build(results.table, results.metas), out, name)
        except plots.NoRows as why:
            _remove(out, name)
            outcome.skipped[name] = str(why)
            echo(f"skipped {name}: {why}")
            continue
        except Exception as err:  # noqa: BLE001 - one broken figure must not hide the others
            _remove(out, name)
            outcome.failed[name] = f"{type(err).__name__}: {err}"
            echo(f"FAILED {name}: {type(err).__name__}: {err}\n{traceback.format_exc()}")
            continue
        outcome.written[name] = paths
        outcome.titles[name] = plot.title or module.TITLE  # a figure may name what it drew (the sides it has)
        outcome.captions[name] = plot.caption
        outcome.data[name] = plot.data
        echo(f"wrote {paths[0]} (+ .svg, .csv: {len(plot.data)} rows)")
    return outcome
