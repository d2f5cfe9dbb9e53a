"""Suite training-cores: layouts of A actors + L learners up to the machine's cores.

``"layouts": "cores"`` expands to the sequential baseline and, at 2, 4, 8, ... workers, the
splits with 1, 2, 4, ... learners (never more learners than actors), up to ``max_workers`` or
the usable cores, whichever is more; a layout past the usable cores is an explicit skipped row
that names its workers and the cores. The machine's cores are monkeypatched here, so the test
says the same on any machine.
"""

from __future__ import annotations

import pytest

from replaybench.bench import driver, results, suites
from replaybench.bench.scenarios import Selection, SelectionError
from replaybench.bench.scenarios import training


def test_core_layouts_split_every_power_of_two_up_to_the_cores():
    assert training.core_layouts(16) == [(0, 0), (1, 1), (3, 1), (2, 2), (7, 1), (6, 2), (4, 4), (15, 1), (14, 2),
                                         (12, 4), (8, 8)]
    assert training.core_layouts(6) == [(0, 0), (1, 1), (3, 1), (2, 2), (5, 1), (4, 2)]  # the cores themselves too
    assert training.core_layouts(2) == [(0, 0), (1, 1)]
    for bad in (1, 0, 2.0, True, "16"):
        with pytest.raises(ValueError, match="max_workers"):
            training.core_layouts(bad)


@pytest.fixture
def cores(monkeypatch):
    def set_cores(n: int) -> None:
        monkeypatch.setattr("replaybench.impl.machine.usable_cores", lambda: n)

    return set_cores


def test_the_suite_lists_every_layout_to_16_and_skips_those_past_the_cores(cores):
    cores(4)
    suite = suites.load("training-cores")
    cells = training.SCENARIO.cells(suite, Selection())
    assert len(cells) == len(suite["seeds"]) * 11
    ran = [(c.spec.actors, c.spec.learners) for c in cells if not c.skip]
    assert ran == [(0, 0), (1, 1), (2, 2), (3, 1)] * len(suite["seeds"])
    skipped = [c for c in cells if c.skip]
    assert all(c.skip_status == "skipped" and c.columns["params"]["cores"] == 4 for c in skipped)
    assert "16 workers (15 actors + 1 learner) past this machine's 4 usable cores" in {c.skip for c in skipped}
    assert {c.spec.policy for c in cells if not c.spec.sequential} == {"atomic-deltas"}
    assert {c.spec.algo_config().updates_per_step for c in cells} == {1 / 64}


def test_more_cores_than_max_workers_grow_the_layouts(cores):
    cores(32)
    cells = training.SCENARIO.cells({**suites.load("training-cores"), "seeds": [0]}, Selection())
    assert not any(c.skip for c in cells) and max(c.spec.actors + c.spec.learners for c in cells) == 32


@pytest.mark.parametrize("change,match", [({"max_workers": 1}, "max_workers"),
                                          ({"max_workers": "all"}, "max_workers"),
                                          ({"layouts": [[0, 0], [1, 1]], "max_workers": 4}, "max_workers"),
                                          ({"layouts": "all"}, "layouts")])
def test_bad_layouts_are_refused_by_name(change, match):
    with pytest.raises(SelectionError, match=match):
        training.SCENARIO.cells({**suites.load("training-cores"), **change}, Selection())


@pytest.mark.slow  # ~20 s on 2 cores: the driver's run of a tiny sequential loop
def test_a_run_writes_the_skipped_layouts_as_rows(cores, tmp_path):
    """One usable core: the sequential loop runs (tiny), every parallel layout is a skipped row."""
    cores(1)
    suite = {**suites.load("training-cores"), "name": "training-cores-tiny", "steps": 300, "seeds": [0],
             "max_workers": 4,
             "overrides": {"hidden": [16, 16], "batch_size": 16, "learning_starts": 100, "buffer_capacity": 1024}}
    run_dir = driver.run(suite, out=tmp_path, progress=False, echo=lambda *_: None)
    rows = results.read_rows(run_dir)
    skipped = [r for r in rows if r["status"] == "skipped" and r["op"] == "summary" and r["actors"]]
    assert sorted((r["actors"], r["learners"]) for r in skipped) == [(1, 1), (2, 2), (3, 1)]
    assert all(r["error"].endswith("past this machine's 1 usable core") for r in skipped)
    assert {r["engine"] for r in rows if r["status"] == "ok"} == {"sequential"}
