"""Build every figure from a :class:`analysis.load.Results` and save it: PNG, SVG and the CSV.

For figure module ``NAME`` the outputs are ``<out>/NAME.png``, ``NAME.svg`` and ``NAME.csv``
(the numbers drawn, one row per point or bar). A figure whose rows are absent is skipped
with one line saying why, and its old outputs are removed so that the folder never shows a
figure the current results do not support. A figure that raises is reported and the others
are still drawn. The SVGs carry no date and use a fixed hash salt, so unchanged results give
unchanged files.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display: the figures are built without pyplot anyway

from replaybench.analysis import plots  # noqa: E402

__all__ = ["Outcome", "render", "EXTENSIONS"]

EXTENSIONS = (".png", ".svg", ".csv")
_RC = {"svg.hashsalt": "replaybench", "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9,
       "legend.fontsize": 8}


@dataclass
class Outcome:
    """What happened to each figure: ``written`` {name: [paths]}, ``skipped`` and ``failed``
    {name: one-line reason}, ``captions`` {name: caption}, ``titles`` {name: title} and
    ``data`` {name: the DataFrame saved as CSV}."""

    written: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    failed: dict = field(default_factory=dict)
    captions: dict = field(default_factory=dict)
    titles: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)


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
            with matplotlib.rc_context(_RC):
                plot = module.build(results.table, results.metas)
                paths = [out / f"{name}{ext}" for ext in EXTENSIONS]
                plot.figure.savefig(paths[0], dpi=110, metadata={"Software": None})
                plot.figure.savefig(paths[1], metadata={"Date": None})
            plot.data.to_csv(paths[2], index=False)
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
        outcome.captions[name] = plot.caption
        outcome.data[name] = plot.data
        echo(f"wrote {paths[0]} (+ .svg, .csv: {len(plot.data)} rows)")
    return outcome
