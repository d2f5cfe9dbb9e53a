"""Issue 58's checks that fail the report's build: the front page and the host pages
(analysis.report.build_pages), the headline figure per claim (analysis.headline), and that each
table agrees with the figure beside it.

- a table and its figure never show different values for the same cell: the CSV written beside a
  figure is compared with the table of the same cells on the host page (the headline figures'
  points, the cache-miss tables, the K sweep);
- a figure line never joins two runs (the headline's lines; tests/test_figure_lines.py checks the
  figure modules);
- a claim added to the registry gets its row, its headline figure and the link from its row; a
  claim with one value gets no figure and the row says why;
- every claim a figure module names is a registered claim;
- the pages are written byte for byte alike from the same runs.

Synthetic runs (tests/test_analysis.py's writer) keep these to seconds: only the figures a check
needs are drawn.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaybench.analysis import claims, findings, headline, load, plots, render, report
from replaybench.analysis import markdown as md

from test_analysis import cache_rows, micro_rows, sweep_rows, write_run


def _table_after(text: str, heading: str) -> list[dict]:
    """The first markdown table after ``heading`` (a line of ``text``) as dicts by column."""
    lines = text.splitlines()
    start = lines.index(heading)
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    header = [c.strip() for c in lines[first].strip("|").split("|")]
    rows = []
    for line in lines[first + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("|").split("|")))))
    return rows


@pytest.fixture(scope="module")
def host_pages(tmp_path_factory):
    """One host's runs (micro with a peer, a K sweep, cache misses), its figures, its headline
    figures and its pages: (Results, verdict rows, Headlines, {page: text}, figure folder)."""
    root = tmp_path_factory.mktemp("results")
    rng = np.random.default_rng(11)
    runs = [write_run(root, "20300101T000000Z-micro", "micro", "micro", micro_rows(rng)),
            write_run(root, "20300101T000100Z-sweep-k", "micro-sweep-k", "micro", sweep_rows(rng),
                      grid={"K": [2, 3, 4, 16]}),
            write_run(root, "20300101T000200Z-cache", "cache", "cache", cache_rows())]
    out = tmp_path_factory.mktemp("out")
    res = load.load_runs(runs)
    (host, part), = res.by_host()
    folder = out / "figures" / host
    outcome = render.render(part, folder, echo=lambda *_: None, only={"cache_misses", "k_sweep", "capacity"})
    verdicts = findings.verdict_rows([(host, part)])
    drawn = headline.render_all(verdicts, {host: folder}, res.hosts())
    pages = report.build_pages([(host, part, outcome)], out / "REPORT.md", verdicts, drawn)
    return res, verdicts, drawn, pages, folder


def test_each_headline_figure_draws_the_points_of_its_table(host_pages):
    """The CSV beside every headline figure holds the numbers of the points table under it on the
    host page (the same cells, the same values as written), and the front page's row links it."""
    _, verdicts, drawn, pages, _ = host_pages
    assert drawn.written, "no headline figure drawn from runs that answer claims"
    front, page = (text for path, text in sorted(pages.items(), key=lambda kv: kv[0].name != "REPORT.md"))
    for (name, host), (png, _, csv) in drawn.written.items():
        claim = next(r["claim"] for r in verdicts if r["claim"].name == name)
        shown = _table_after(page, report.claim_heading(claim))
        data = pd.read_csv(csv)
        assert len(shown) == len(data), name
        for row, (_, point) in zip(shown, data.iterrows()):
            assert (row["cell"], row["series"], row["run"]) == (point["label"], point["series"], f"`{point['run_id']}`")
            assert row["ours"] == md.num(point["value"]), (name, row)
            assert row["min-max"] == f"{md.num(point['low'])}-{md.num(point['high'])}", (name, row)
            assert row[claim.paper] == md.num(point["paper"]), (name, row)
        line = next(ln for ln in front.splitlines() if f"(`{name}`)" in ln and f"`{host}`" in ln)
        assert f"[figure](figures/{host}/claims/{name}.png)" in line
        assert f"#{md.anchor(report.claim_heading(claim))})" in line


def test_the_cache_miss_tables_show_the_values_the_figure_draws(host_pages):
    """Issue 58: the cache-miss table and figure disagreed (binary-blocked L1d 2.14 against 2.68):
    every cell of every table on the page is the CSV's value for that method, stream, variant,
    capacity, op and level, and the page names the cache geometry the model simulated."""
    _, _, _, pages, folder = host_pages
    page = next(text for path, text in pages.items() if path.name != "REPORT.md")
    data = pd.read_csv(folder / "cache_misses.csv")
    checked = 0
    for (method, stream), part in data.groupby(["method", "stream"]):
        for row in _table_after(page, f"#### {method}, {stream}"):
            cap = 2 ** int(row["capacity"].removeprefix("2^"))
            for column, text in row.items():
                if column in ("variant", "capacity") or not text:
                    continue
                op, level = column.split(" ")
                hit = part[(part["variant"] == row["variant"].strip("`")) & (part["capacity"] == cap)
                           & (part["op"] == op) & (part["level"] == level)].iloc[0]
                if hit["status"] == "ok":
                    assert text == f"{hit['misses_per_transition']:.3g}", (method, stream, row["variant"], column)
                    checked += 1
    assert checked > 10
    assert "simulate the caches of the host that ran them" in page and "L1d" in page


def test_the_k_sweep_table_shows_the_medians_the_figure_draws(host_pages):
    """Each median of the fan-out table is the CSV's median for that capacity, op, variant and K,
    and the padded K it names are those whose tree has more leaf slots than the capacity."""
    _, _, _, pages, folder = host_pages
    page = next(text for path, text in pages.items() if path.name != "REPORT.md")
    data = pd.read_csv(folder / "k_sweep.csv")
    rows = _table_after(page, "### Fan-out K")
    assert rows
    for row in rows:
        cap = 2 ** int(row["capacity"].removeprefix("2^"))
        part = data[(data["capacity"] == cap) & (data["op"] == row["op"]) & (data["variant"] == row["variant"].strip("`"))]
        scale = 1e6 if row["unit"].startswith("M ") else 1.0
        want = ", ".join(f"{int(k)}: {md.num(m / scale)}" for k, m in zip(part["K"], part["median"]))
        assert row["median by K"] == want
        padded = part[part["padding"] > 1]
        assert row["padded K"] == (", ".join(f"{int(k)}: x{p:.3g}" for k, p in zip(padded["K"], padded["padding"]))
                                   or "none")
    assert set(data.loc[data["K"] == 3, "padding"].round(3)) == {round(3 ** 11 / 2**16, 3)}  # 3^11 slots over 2^16


def test_the_pages_are_written_alike_from_the_same_runs(host_pages, tmp_path):
    """The headline figures and every page twice from the same runs: the same bytes."""
    res, verdicts, _, pages, _ = host_pages
    (host, part), = res.by_host()
    again = []
    for name in ("a", "b"):
        folder = tmp_path / name / "figures" / host
        outcome = render.render(part, folder, echo=lambda *_: None, only={"cache_misses"})
        drawn = headline.render_all(verdicts, {host: folder})
        texts = report.build_pages([(host, part, outcome)], tmp_path / name / "REPORT.md", verdicts, drawn)
        files = {p.relative_to(tmp_path / name).as_posix(): p.read_bytes()
                 for p in sorted((tmp_path / name).rglob("*")) if p.is_file()}
        again.append(({p.relative_to(tmp_path / name).as_posix(): t for p, t in texts.items()}, files))
    assert again[0] == again[1] and any("/claims/" in f for f in again[0][1])


# ---------------------------------------------------------------------------------------------
# headline figures


def _claim(**fields) -> claims.Claim:
    return claims.Claim(**{"name": "made-up", "paper": "TEST", "claim": "a made-up claim", "number": "3x",
                           "metric": "m", "suites": ("micro",), "cells": "c", **fields})


def test_a_headline_line_never_joins_two_runs():
    """Points with an x (processes) are one line per series and run: two runs' points of one
    series are two lines, each holding its own run's values; the paper's line is a mark."""
    points = tuple(claims.Point(str(x), v, v * 0.9, v * 1.1, run, "policy-a", x=float(x), paper=float(x))
                   for run, scale in (("run-1", 1.0), ("run-2", 1.7)) for x, v in ((1, 1.0 * scale), (2, 1.8 * scale),
                                                                                    (4, 3.1 * scale)))
    plot = headline.draw(_claim(), claims.Verdict(claims.PARTLY, points=points), "host-a")
    (ax,) = plot.figure.axes
    # what joins points: drawn lines of two points or more (an error bar's caps are markers, not a line)
    data = [ln for ln in ax.get_lines() if ln.get_gid() not in (headline.MARK, headline.PARITY)
            and len(ln.get_xdata()) >= 2
            and ln.get_linestyle() not in ("None", "none", "")]
    by_run = {run: sorted((p.x, p.value) for p in points if p.run_id == run) for run in ("run-1", "run-2")}
    joined = [sorted(zip(map(float, ln.get_xdata()), map(float, ln.get_ydata()))) for ln in data]
    assert sorted(joined) == sorted(by_run.values())  # one line per run, each its own run's points
    marks = [ln for ln in ax.get_lines() if ln.get_gid() == headline.MARK]
    assert marks and all(list(m.get_xdata()) == list(m.get_ydata()) for m in marks if len(m.get_xdata()) > 1)
    assert set(plot.data["run_id"]) == {"run-1", "run-2"} and len(plot.data) == 6


def test_the_paper_number_is_drawn_and_labelled():
    """A claim's ``mark`` is one horizontal line across the figure, labelled with the paper and
    its number; numbers per cell are short lines over each cell, labelled each."""
    points = (claims.Point("sample", 4.0, 3.5, 4.4, "r"), claims.Point("update", 1.5, 1.2, 1.9, "r"))
    plot = headline.draw(_claim(mark=3.0), claims.Verdict(claims.PARTLY, points=points), "h")
    ax = plot.figure.axes[0]
    lines = [ln for ln in ax.get_lines() if ln.get_gid() == headline.MARK]
    assert any(set(ln.get_ydata()) == {3.0} for ln in lines)
    assert "TEST: 3x" in [t.get_text() for t in ax.get_legend().get_texts()][0]
    per_cell = tuple(claims.Point(p.label, p.value, p.low, p.high, p.run_id, paper=v) for p, v in zip(points, (2.0, 1.2)))
    plot = headline.draw(_claim(), claims.Verdict(claims.PARTLY, points=per_cell), "h")
    texts = [t.get_text() for t in plot.figure.axes[0].texts if t.get_gid() == headline.MARK]
    assert texts == ["TEST 2", "TEST 1.2"]


def test_a_single_point_or_no_data_gets_no_figure_and_says_why():
    one = claims.Verdict(claims.REPRODUCES, points=(claims.Point("cell", 2.5, 2.0, 3.0, "r"),))
    with pytest.raises(plots.NoRows, match=r"one value \(2.5, range 2-3\)"):
        headline.draw(_claim(), one, "h")
    with pytest.raises(plots.NoRows, match="no data"):
        headline.draw(_claim(), claims.Verdict(claims.NO_DATA, why="w"), "h")


def test_a_claim_added_to_the_registry_gets_its_row_figure_and_link(tmp_path):
    """One registry entry: its row on the front page, its headline figure under the host's
    folder, linked from the row, and its section on the host page; a second claim with one value
    gets its row and the reason it has no figure."""
    rng = np.random.default_rng(3)
    run = write_run(tmp_path / "results", "20300101T000000Z-micro", "micro", "micro", micro_rows(rng))
    res = load.load_runs([run])
    (host, part), = res.by_host()
    registry = claims.CLAIMS.copy()
    two = (claims.Point("a", 5.0, 4.0, 6.0, run.name), claims.Point("b", 2.0, 1.5, 2.5, run.name))
    registry.register("made-up", _claim(rule=lambda r: claims.Verdict(claims.PARTLY, "5x and 2x", "2 cells",
                                                                       tuple(r.metas), "why", two), mark=3.0))
    registry.register("single", _claim(name="single", claim="a one-cell claim",
                                       rule=lambda r: claims.Verdict(claims.REPRODUCES, "7x", "1 cell", tuple(r.metas),
                                                                     "why", two[:1])))
    folder = tmp_path / "figures" / host
    outcome = render.render(part, folder, echo=lambda *_: None, only={"capacity"})
    verdicts = findings.verdict_rows([(host, part)], registry)
    drawn = headline.render_all(verdicts, {host: folder}, res.hosts())
    pages = report.build_pages([(host, part, outcome)], tmp_path / "REPORT.md", verdicts, drawn)
    front = pages[tmp_path / "REPORT.md"]
    row = next(ln for ln in front.splitlines() if "(`made-up`)" in ln)
    assert f"[figure](figures/{host}/claims/made-up.png)" in row and "**partly**" in row
    assert (folder / "claims" / "made-up.png").read_bytes()[:4] == b"\x89PNG"
    single = next(ln for ln in front.splitlines() if "(`single`)" in ln)
    assert "none: one value (5, range 4-6)" in single and not (folder / "claims" / "single.png").exists()
    page = pages[tmp_path / "report" / f"{host}.md"]
    assert report.claim_heading(registry.get("made-up")) in page and "](../figures/" in page
    assert "made-up" not in claims.CLAIMS


def test_a_claim_whose_runs_are_removed_reads_no_data_on_the_front_page(tmp_path):
    """Without the runs of a claim's suite, its one row says *no data* and names the suite; its
    figure cell is empty."""
    rng = np.random.default_rng(4)
    run = write_run(tmp_path / "results", "20300101T000000Z-micro", "micro", "micro", micro_rows(rng))
    res = load.load_runs([run])
    (host, part), = res.by_host()
    outcome = render.render(part, tmp_path / "figures" / host, echo=lambda *_: None, only={"capacity"})
    front = report.build_pages([(host, part, outcome)], tmp_path / "REPORT.md")[tmp_path / "REPORT.md"]
    row = next(ln for ln in front.splitlines() if "(`lf-gym`)" in ln)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == "**no data**" and cells[5] == "-" and "no stored run of suite `lf`" in cells[-1]


def test_every_claim_a_figure_module_names_is_registered():
    names = set(claims.CLAIMS.names())
    for module in plots.modules():
        unknown = set(getattr(module, "CLAIMS", ())) - names
        assert not unknown, f"{module.NAME} names claims that are not registered: {unknown}"


def test_the_committed_front_page_is_a_front_page():
    """analysis/REPORT.md as `make report` wrote it: the findings under about 200 lines, one page
    per host linked from it, each page's figure links resolving from the page."""
    repo = Path(__file__).resolve().parent.parent
    front = repo / "analysis" / "REPORT.md"
    text = front.read_text()
    assert len(text.splitlines()) < 200 and "## Findings" in text
    pages = re.findall(r"\]\((report/[^)#]+\.md)\)", text)
    assert pages
    for page in sorted(set(pages)):
        path = front.parent / page
        body = path.read_text()
        for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", body):
            assert (path.parent / link).resolve().is_file(), f"{page}: {link}"
