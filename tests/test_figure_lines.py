"""No figure joins points of two runs in one line (issue 38: "a test fails if a figure's line
mixes runs"), checked for every registered figure at once, from the drawn artists.

Method: every synthetic run of tests/test_analysis.py (one per scenario, one made-up machine) is
copied under a second run id, written later, with every value scaled by :data:`FACTOR`, so no
point of the copy equals a point of the original. Each figure is drawn three times: from the
originals alone, from the copies alone, and from both. A line (a matplotlib ``Line2D`` with two
points or more: what joins points; markers alone, bars and text are not lines) of the figure
drawn from both must be a line of one of the single-run drawings, point for point: a line that
took a point from each run, or a median over both runs' values, is in neither and fails the
test, naming the figure and the line. A figure that draws nothing from the synthetic runs is
reported as skipped by the renderer and has no lines to check. Machines: the analysis draws
each machine's runs apart (:meth:`analysis.load.Results.by_machine`), so a line that holds one
run holds one machine; the last test checks that split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replaybench.analysis import load
from replaybench.analysis.plots import NoRows, modules
from replaybench.bench import contract, results

from test_analysis import synthetic  # noqa: F401 - the module's fixture: one run per scenario

FACTOR = 1.37


def _copy(run: Path, root: Path, factor: float) -> Path:
    """``run`` written again under ``root`` by the harness's writer, its id's time an hour
    later and every value times ``factor``."""
    meta = contract.read_meta(run)
    run_id = meta["run_id"]
    new_id = run_id.replace("T0", "T1", 1)
    assert new_id != run_id
    rows = []
    for r in contract.read_rows(run):
        r = {k: v for k, v in r.items() if v is not None}
        r["run_id"] = new_id
        if isinstance(r.get("value"), float) and r.get("status") == "ok":
            r["value"] = r["value"] * factor
        rows.append(r)
    keep = {k: v for k, v in meta.items() if k in ("scenario", "suite", "selection", "variants", "machine", "git_sha",
                                                    "dirty", "paper", "targets", "shared_path", "memory_limits")}
    writer = results.RunWriter(root, new_id, keep, compact=False)
    writer.append(rows)
    writer.finish(True)
    return writer.dir


def _lines(figure) -> set[tuple]:
    """Every drawn polyline of ``figure`` (Line2D with >= 2 finite points), as rounded points."""
    out = set()
    for ax in figure.axes:
        for line in ax.get_lines():
            xy = np.asarray(line.get_xydata(), float)
            xy = xy[np.isfinite(xy).all(axis=1)] if xy.ndim == 2 else xy
            if xy.ndim != 2 or len(xy) < 2:
                continue
            out.add(tuple(float(f"{v:.9g}") for v in xy.ravel()))
    return out


def _draw_all(run_dirs) -> dict[str, set]:
    """Each figure's polylines from these runs (figures without rows left out)."""
    res = load.load_runs(run_dirs)
    out = {}
    for module in modules():
        try:
            plot = module.build(res.table, res.metas)
        except NoRows:  # nothing of this figure among the synthetic runs: no line to check
            continue
        out[module.NAME] = _lines(plot.figure)
    return out


@pytest.fixture(scope="module")
def three_drawings(synthetic, tmp_path_factory):  # noqa: F811
    originals = load.find_runs(synthetic)
    root = tmp_path_factory.mktemp("copies")
    copies = [_copy(run, root, FACTOR) for run in originals]
    return _draw_all(originals), _draw_all(copies), _draw_all([*originals, *copies])


@pytest.mark.slow  # three drawings of every figure: about 20 s of CPU, a minute or more on a busy 2-core VM
def test_no_figure_line_joins_points_of_two_runs(three_drawings):
    alone_a, alone_b, both = three_drawings
    checked = [name for name in both if both[name]]
    assert {"concurrency", "capacity", "training_scaling"} <= set(checked)  # line figures are drawn at all
    mixed = {}
    for name, lines in both.items():
        foreign = lines - alone_a.get(name, set()) - alone_b.get(name, set())
        if foreign:
            mixed[name] = sorted(foreign)[0][:8]
    assert not mixed, f"figures whose lines mix runs (first points of one such line each): {mixed}"


@pytest.mark.slow
def test_the_check_sees_a_line_that_mixes_runs(three_drawings):
    """The comparison fails for a figure that joins one run's point to another's: a line made of
    the first point of one drawn line and the second point of the copy's line is in neither."""
    alone_a, alone_b, _ = three_drawings
    line_a = sorted(alone_a["concurrency"])[0]
    line_b = next(b for b in sorted(alone_b["concurrency"]) if len(b) == len(line_a) and b[:2] != line_a[:2])
    joined = line_a[:2] + line_b[2:4] + line_a[4:]
    assert joined not in alone_a["concurrency"] | alone_b["concurrency"]


def test_each_machine_is_drawn_from_its_own_runs(synthetic, tmp_path_factory):  # noqa: F811
    """The renderer's split: runs of two machines give two Results, each holding one machine's runs."""
    originals = load.find_runs(synthetic)
    root = tmp_path_factory.mktemp("other-machine")
    meta = contract.read_meta(originals[0])
    other = _copy(originals[0], root, FACTOR)
    text = (other / "meta.json").read_text().replace('"machine": {', '"machine_label": "other-box", "machine": {', 1)
    (other / "meta.json").write_text(text)
    res = load.load_runs([*originals, other])
    parts = dict(res.by_machine())
    assert set(parts["other-box"].table["run_id"]) == {contract.read_meta(other)["run_id"]}
    assert meta["run_id"] not in set(parts["other-box"].table["run_id"])
    machines = res.machines()
    for machine, part in parts.items():  # every part: runs of its machine only
        assert {machines[r] for r in part.metas} == {machine}
