"""The core-to-core line transfer probe (bench.line_transfer) and where runs show it: the
hand-off alternates exactly, no thread is left behind, one usable core gives no figure, bad
input is refused by name, and the summary and report read the cells' rows."""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest

from replaybench.bench import line_transfer
from replaybench.bench.scenarios.concurrency import line_ns
from replaybench.impl.machine import usable_cores

two_cores = pytest.mark.skipif(usable_cores() < 2, reason="the probe needs two usable cores")


@two_cores
def test_probe_times_hand_offs_and_leaves_no_thread_running():
    before = threading.active_count()
    got = line_transfer.probe(seconds=0.005, repeats=3)
    assert set(got) == {"ns", "ns_median", "repeats", "seconds"} and got["repeats"] == 3
    assert 0 < got["ns"] <= got["ns_median"]  # its size is the machine's: benchmarks show it, not tests
    assert threading.active_count() == before


@two_cores
def test_the_two_players_alternate_turn_for_turn():
    """Each player increments the count once per turn of its own: when the turns alternate,
    each made exactly half of the hand-offs the round ended at. A lost or doubled turn (both
    players acting on one count, or one acting out of turn) breaks that; the leader ends the
    round at one of its own turns (an even count) and the follower sees the end."""
    volley = line_transfer._volley()
    word = line_transfer._own_line()
    assert word.ctypes.data % 64 == 0 and word.shape == (8,) and not word.any()
    got = []
    follower = threading.Thread(target=lambda: got.append(volley(word, 1, 0.01, np.zeros(2, np.int64))))
    follower.start()
    handed, led = volley(word, 0, 0.01, np.zeros(2, np.int64))
    follower.join(10)
    assert not follower.is_alive() and word[0] == -1
    (seen, followed), = got
    assert seen == -1 and handed > 0 and handed % 2 == 0
    assert led == followed == handed // 2


def test_one_usable_core_gives_no_figure_and_starts_no_thread(monkeypatch):
    from replaybench.impl import machine

    monkeypatch.setattr(machine, "usable_cores", lambda: 1)
    before = threading.active_count()
    assert line_transfer.probe() is None
    assert threading.active_count() == before


@pytest.mark.parametrize("kwargs,name", [({"seconds": 0}, "seconds"), ({"seconds": -1.0}, "seconds"),
                                         ({"seconds": float("nan")}, "seconds"), ({"seconds": True}, "seconds"),
                                         ({"seconds": "0.1"}, "seconds"), ({"repeats": 0}, "repeats"),
                                         ({"repeats": 1.5}, "repeats"), ({"repeats": True}, "repeats")])
def test_bad_input_is_refused_by_name_before_any_thread(kwargs, name):
    before = threading.active_count()
    with pytest.raises(ValueError, match=name):
        line_transfer.probe(**kwargs)
    assert threading.active_count() == before


def test_summary_cell_shows_before_and_after():
    assert line_ns(24.6, 210.2) == "25/210"
    assert line_ns(None, None) == "-"
    assert line_ns(30.0, None) == "30/-"


def test_report_names_the_cells_next_to_a_slow_trip():
    from replaybench.analysis.plots.concurrency import line_transfer_section

    def row(run, policy, metric, value, mode="processes"):
        return {"run_id": run, "scenario": "concurrency", "status": "ok", "policy": policy, "mode": mode,
                "transitions": "cartpole", "actors": 0, "learners": 2, "metric": metric, "value": value}

    table = pd.DataFrame([row("r1", "global-lock", "line_transfer_ns_before", 25.0),
                          row("r1", "global-lock", "line_transfer_ns_after", 27.0),
                          row("r1", "atomic-deltas", "line_transfer_ns_before", 26.0),
                          row("r1", "atomic-deltas", "line_transfer_ns_after", 205.0),
                          row("r2", "global-lock", "line_transfer_ns_before", 30.0),
                          row("r2", "global-lock", "line_transfer_ns_after", 31.0),
                          row("r2", "global-lock", "items_per_s", 1e6)])
    r1, _, r2, _ = line_transfer_section(table)
    assert "`r1`" in r1 and "25-205 ns" in r1 and "1 of 2 cells" in r1
    assert "cartpole atomic-deltas processes 0A+2L (205)" in r1
    assert "global-lock" not in r1
    assert "`r2`" in r2 and "30-31 ns" in r2 and "no cell next to a trip over twice the fastest" in r2
    assert line_transfer_section(table[table["metric"] == "items_per_s"]) == []
