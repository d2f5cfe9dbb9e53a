"""One module per figure; each is a pure function of the results table.

A figure module defines ``NAME`` (the file stem of its outputs), ``ORDER`` (its place in the
report), ``TITLE`` and::

    build(table: pandas.DataFrame, metas: dict) -> Plot

``table`` is :attr:`analysis.load.Results.table` (every loaded row; the module picks its own
rows), ``metas`` maps run id to meta.json. ``build`` returns a :class:`Plot`: a matplotlib
``Figure`` made without pyplot (no global state, nothing drawn on screen) and the DataFrame
of exactly the numbers drawn, which the driver (:mod:`analysis.render`) saves beside the PNG
and SVG as CSV. When the table has none of the rows a figure needs, ``build`` raises
:class:`NoRows` with a one-line reason and the figure is skipped.

A figure module may also contribute a section of analysis/REPORT.md::

    report_section(data: pandas.DataFrame | None, res: analysis.load.Results,
                   drawn: Mapping[str, pandas.DataFrame]) -> list[str]

``data`` is this figure's :attr:`Plot.data` as drawn (``None`` when the figure was skipped,
failed or not asked for), ``res`` the loaded results (``table``, ``metas``) and ``drawn`` every
drawn figure's data by ``NAME`` (for a section that sets one figure beside another's). It
returns markdown lines (headings, text, tables from :mod:`analysis.markdown`), ending with a
blank line, or ``[]`` when there is nothing to say; it must not raise on ``data=None``. The
sections stand in the report in ``REPORT_ORDER`` (``ORDER`` where the module sets none),
ties by ``NAME``; :func:`analysis.report.build` collects them, so a figure with its section is
still one file.

A figure module may name the papers' claims it bears on::

    CLAIMS = ("pal-sync", "pal-linear-scaling")   # names in analysis.claims.CLAIMS

Its section and figure then stand on each host's page (analysis/report/<host>.md) under the
first of those claims, in the claims' order; a module naming none stands under "Other
measurements" (:func:`analysis.report.build`). tests/test_analysis_pages.py checks that every
name is a registered claim.

Modules are found by scanning this folder (names starting with ``_`` are helpers) into the
figure registry (:class:`replaybench.registry.Registry`, by ``NAME``), so a new figure is one
new file.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

import pandas as pd
from matplotlib.figure import Figure

from replaybench.registry import Registry

__all__ = ["Plot", "NoRows", "FIGURES", "modules"]


@dataclass
class Plot:
    """A finished figure and the table of the numbers it shows (one row per point or bar);
    ``title``: the report's title for it where it depends on what was drawn (empty: the
    module's ``TITLE``)."""

    figure: Figure
    data: pd.DataFrame
    caption: str = ""
    title: str = ""


class NoRows(LookupError):
    """The results hold none of the rows this figure needs (the message says which)."""


def _discover() -> None:
    """Import every figure module of this folder (a module with a ``build``) into FIGURES."""
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if callable(getattr(module, "build", None)):
            FIGURES.register(module.NAME, module, origin=module.__name__)


#: Figure name -> its module.
FIGURES: Registry = Registry("figure", _discover)


def modules() -> list:
    """The figure modules in this package, in report order."""
    return sorted((m for _, m in FIGURES.items()), key=lambda m: (getattr(m, "ORDER", 100), m.NAME))
