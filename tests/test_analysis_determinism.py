"""The figures and the report (REPORT.md and the host pages under analysis/report/) are a pure
function of the stored results, byte for byte: drawing them twice from the same runs gives the
same files (analysis.render.save_figure)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest
from matplotlib.figure import Figure

from replaybench.analysis import findings, headline, load, render, report
from replaybench.analysis.__main__ import main

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _figure(left: float) -> Figure:
    fig = Figure(figsize=(3, 2))
    ax = fig.add_axes((left, 0.1, 0.8, 0.8))
    ax.plot([0, 1], [0, 1])
    ax.grid(True)
    return fig


def test_a_figure_placed_one_ulp_apart_is_saved_as_the_same_bytes(tmp_path):
    """Constrained layout may place an axes one unit in the last place differently from one
    process to the next; matplotlib's SVG named the clip path by a hash of those exact
    coordinates, so the files differed where the drawing did not."""
    paths = []
    for i, left in enumerate((0.1, 0.1 + 2 ** -55)):
        png, svg = tmp_path / f"{i}.png", tmp_path / f"{i}.svg"
        with matplotlib.rc_context(render._RC):
            render.save_figure(_figure(left), png, svg)
        paths.append((png.read_bytes(), svg.read_bytes()))
    assert paths[0] == paths[1]
    assert b'<clipPath id="clip0">' in paths[0][1] and b'clip-path="url(#clip0)"' in paths[0][1]


def _render(out: Path, runs, only) -> None:
    res = load.load_runs(runs)
    parts = []
    for host, part in res.by_host():
        outcome = render.render(part, out / "figures" / host, echo=lambda *_: None, only=only)
        assert set(outcome.written) == set(only), (outcome.skipped, outcome.failed)
        parts.append((host, part, outcome))
    verdicts = findings.verdict_rows([(h, p) for h, p, _ in parts])
    drawn = headline.render_all(verdicts, {h: out / "figures" / h for h, _, _ in parts}, res.hosts())
    for path, text in report.build_pages(parts, out / "REPORT.md", verdicts, drawn).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_figures_and_report_from_stored_runs_render_twice_alike(tmp_path):
    """The LF figure (whose layout moved by an ulp between processes) and the training curves
    from their stored runs, the headline figures of the claims they answer, and the front page and
    the host page on them, twice: the same bytes."""
    runs = [RESULTS / "reference-lf", RESULTS / "reference-training"]
    only = ["lf", "training_curves"]
    for name in ("a", "b"):
        _render(tmp_path / name, runs, only)
    first, second = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert "REPORT.md" in first and any(f.startswith("report/") for f in first)
    assert any("/claims/" in f for f in first) and first == second


@pytest.mark.slow
def test_the_whole_report_renders_twice_alike(tmp_path):
    """``replaybench report`` on every stored run, twice into two folders: every figure (PNG,
    SVG, CSV; the headline figures too), REPORT.md and every host page under report/ are the same
    bytes (what `make report` regenerates)."""
    runs = [str(p) for p in load.find_runs(RESULTS)]
    for name in ("a", "b"):
        out = tmp_path / name
        argv = ["report", "--runs", *runs, "--figures", str(out / "figures"), "--out", str(out / "REPORT.md")]
        assert main(argv) == 0
    first, second = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert "REPORT.md" in first and len(first) > 30 and first == second
    assert sum(f.startswith("report/") for f in first) == len(load.load_runs(runs).by_host())
