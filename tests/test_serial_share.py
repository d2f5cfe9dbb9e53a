"""The serial share (issue 42 item 3): the one-worker accounts of a call sum to the call's time
within bench.serial_share.ACCOUNT_TOLERANCE, the share and Amdahl's bound follow from them,
and the model they set predicts rows it made itself and names the account a missed cell moved.

The first test measures: one actor and one learner thread per policy on a real shared buffer,
through the concurrency scenario's own cells and rows (about 3 s with warm numba caches).
"""

from __future__ import annotations

import math

import pytest

from replaybench.bench import serial_share as ss

# --------------------------------------------------------------------------- measured accounts


@pytest.mark.parametrize("policy", ["global-lock", "lazy-writing", "optimistic"])
def test_measured_accounts_sum_to_the_calls_time_within_the_stated_tolerance(policy):
    """Exclusive sections and lock waits (the kernels' clock, inside the call) never pass the
    call's wall time (perf_counter around it) beyond the tolerance, per window; a policy whose
    every call takes the tree lock exclusively (global-lock: sample, update and insert) shows
    a positive exclusive time; the share and Amdahl's bound are what the accounts say."""
    from replaybench.bench.scenarios import Selection
    from replaybench.bench.scenarios.concurrency import SCENARIO

    suite = {"name": "serial-share-test", "scenario": "concurrency", "variants": ["kary-aligned"],
             "policies": [policy], "modes": ["threads"], "workers": [[1, 0], [0, 1]], "repeats": 2,
             "window_s": 0.15, "transitions": {"cartpole": {"capacity": 4096, "write_batch": 64, "sample_batch": 64}}}
    rows = []
    for cell in SCENARIO.cells(suite, Selection()):
        rows += [{**r, "scenario": "concurrency"} for r in SCENARIO.measure(cell, None)]  # as the driver writes them
    by = {}
    for r in rows:
        if r["op"] in ss.OPS and r["status"] == "ok":
            by.setdefault((r["op"], r["repeat"]), {})[r["metric"]] = r["value"]
    assert {k for k in by} == {(op, w) for op in ss.OPS for w in (0, 1)}
    for (op, w), m in by.items():
        call, hold, wait = m["busy_s_per_call"], m["lock_hold_s_per_call"], m["lock_wait_s_per_call"]
        assert call > 0 and hold >= 0 and wait >= 0
        assert ss.account_error(call, hold, wait) <= 0, (op, w, m)
        if policy == "global-lock":
            assert hold > 0, (op, w, m)
    shares = {e["op"]: e for e in ss.one_worker_shares(rows)}
    assert set(shares) == set(ss.OPS)
    for e in shares.values():
        assert e["windows"] == 2 and 0 <= e["share"] <= 1
        assert e["parallel_s"] == pytest.approx(e["call_s"] - e["exclusive_s"] - e["wait_s"])
        assert e["parallel_s"] >= -ss.ACCOUNT_TOLERANCE[0] * e["call_s"] - ss.ACCOUNT_TOLERANCE[1]
        assert e["amdahl"] == pytest.approx(1 / (e["share"] + (1 - e["share"]) / 16))
        assert e["rate"] > 0


def test_stored_runs_accounts_sum_to_their_calls_in_every_cell():
    """Every window of every cell of the stored concurrency runs (any machine, any number of
    workers) keeps exclusive + wait within the call's time; at least the 16-core runs have them."""
    from pathlib import Path

    from replaybench.bench import contract

    checked = {}
    for run in sorted(Path(__file__).resolve().parent.parent.joinpath("results").iterdir()):
        if run.is_dir() and (run / "meta.json").exists() and contract.read_meta(run).get("scenario") == "concurrency":
            checked[run.name] = ss.check_accounts(contract.read_rows(run))
    if not checked:
        pytest.skip("no stored concurrency runs")
    assert sum(checked.values()) > 0, checked
    bad = _cell_rows(0, 2, 1e6, {"iteration": (100e-6, 80e-6, 30e-6)})
    with pytest.raises(ValueError, match=r"'learners': 2.* op iteration window 0"):
        ss.check_accounts(bad)


# --------------------------------------------------------------------------- synthetic rows
CONFIG = dict(variant="kary-aligned", policy="global-lock", mode="processes", transitions="cartpole")
SB, WB, SPI = 256, 64, 8.0
#: one-worker accounts: (call, exclusive, wait) seconds per call, and the loop's extra seconds per call
ONE = {"iteration": (200e-6, 50e-6, 0.0, 20e-6), "insert": (30e-6, 6e-6, 0.0, 10e-6)}


def _cell_rows(actors, learners, rate, accounts, windows=2, rate_wait=0.0):
    common = dict(scenario="concurrency", status="ok", **CONFIG, batch=SB, actors=actors, learners=learners,
                  params={"write_batch": WB, **({"samples_per_insert": SPI} if actors and learners else {})})
    rows = []
    for w in range(windows):
        rows.append({**common, "op": "sample" if learners else "insert", "metric": "items_per_s", "value": rate,
                     "repeat": w})
        for op, (call, excl, wait) in accounts.items():
            for metric, value in (("busy_s_per_call", call), ("lock_hold_s_per_call", excl),
                                  ("lock_wait_s_per_call", wait)):
                rows.append({**common, "op": op, "metric": metric, "value": value, "repeat": w})
        rows.append({**common, "op": "all", "metric": "rate_wait_fraction", "value": rate_wait, "repeat": w})
    return rows


def _model_rows(splits, cores):
    """Rows whose rates and waits are exactly the model's (see bench.serial_share)."""
    (cl, el, _, xl), (ca, ea, _, xa) = ONE["iteration"], ONE["insert"]
    loop_l, loop_a = cl + xl, ca + xa
    rows = []
    for a, l_ in splits:
        share = min(1.0, cores / (a + l_))
        t_l = loop_l + (l_ - 1) * el + a * ea if l_ else math.inf
        t_a = loop_a + (a - 1) * ea + l_ * el if a else math.inf
        learn, act = (l_ * SB / t_l * share if l_ else 0.0), (a * WB / t_a * share if a else 0.0)
        rate = min(learn, SPI * act) if a and l_ else (learn if l_ else act)
        accounts = {}
        if l_:
            accounts["iteration"] = (cl + t_l - loop_l, el, t_l - loop_l)
        if a:
            accounts["insert"] = (ca + t_a - loop_a, ea, t_a - loop_a)
        rows += _cell_rows(a, l_, rate, accounts)
    return rows


def test_amdahl_bound_and_its_checks():
    assert ss.amdahl(0.0, 16) == pytest.approx(16)
    assert ss.amdahl(1.0, 16) == pytest.approx(1)
    assert ss.amdahl(0.06, 16) == pytest.approx(1 / (0.06 + 0.94 / 16)) and ss.amdahl(0.06, 16) >= 8  # issue 42's 6%
    for share, n, name in ((-0.1, 4, "share"), (1.5, 4, "share"), (True, 4, "share"), (0.1, 0, "n"), (0.1, 2.0, "n")):
        with pytest.raises(ValueError, match=name):
            ss.amdahl(share, n)


def test_one_worker_shares_from_rows():
    rows = _model_rows([(1, 0), (0, 1), (0, 2)], cores=2)
    got = {e["op"]: e for e in ss.one_worker_shares(rows)}
    it = got["iteration"]
    assert it["call_s"] == pytest.approx(200e-6) and it["exclusive_s"] == pytest.approx(50e-6)
    assert it["parallel_s"] == pytest.approx(150e-6) and it["share"] == pytest.approx(0.25)
    assert it["amdahl"] == pytest.approx(1 / (0.25 + 0.75 / 16)) and it["at"] == 16
    assert got["insert"]["share"] == pytest.approx(0.2)
    assert ss.one_worker_shares([r for r in rows if r["metric"] != "lock_hold_s_per_call"]) == []  # older runs


def test_accounts_that_pass_the_call_beyond_the_tolerance_are_refused():
    rel, absolute = ss.ACCOUNT_TOLERANCE
    call = 100e-6
    inside = _cell_rows(0, 1, 1e6, {"iteration": (call, call * (1 + rel / 2), 0.0)})
    assert ss.one_worker_shares(inside)[0]["share"] == 1.0  # within the tolerance: clipped to the call
    for excl, wait in ((call * (1 + 2 * rel), 0.0), (0.6 * call, 0.6 * call)):
        rows = _cell_rows(0, 1, 1e6, {"iteration": (call, excl, wait)})
        with pytest.raises(ValueError, match=r"op iteration window 0: .* do not sum to the call"):
            ss.one_worker_shares(rows)
    assert ss.account_error(call, call, 0.0) < 0 < ss.account_error(call, call + 2 * absolute + rel * call, 0.0)


def test_the_model_predicts_the_rows_it_made_and_names_no_term():
    splits = [(1, 0), (0, 1), (0, 2), (1, 1), (2, 0), (0, 4), (2, 2), (4, 0), (0, 8), (4, 4), (8, 8)]
    rows = _model_rows(splits, cores=8)
    got = ss.predict_cells(rows, 8, **CONFIG)
    assert [(c["actors"], c["learners"]) for c in got] == sorted(splits, key=lambda s: (sum(s), s))
    for c in got:
        assert c["error"] == pytest.approx(0.0, abs=1e-9) and c["term"] == ""
        assert c["input"] == ((c["actors"], c["learners"]) in ((1, 0), (0, 1)))


@pytest.mark.parametrize("moved, term", [("exclusive", "exclusive"), ("parallel", "parallel"), ("wait", "wait")])
def test_a_missed_cell_names_the_account_that_moved(moved, term):
    rows = _model_rows([(1, 0), (0, 1)], cores=16)
    cl, el, _, _ = ONE["iteration"]
    n = 8
    model_wait = (n - 1) * el
    excl, par, wait = el, cl - el, model_wait
    if moved == "exclusive":
        excl *= 4  # each section 4x longer: the call's own and the ones it waits for
        wait = model_wait * 4
    elif moved == "parallel":
        par *= 6  # the unlocked work slowed (shared caches, bandwidth)
    else:
        wait = model_wait * 5  # queueing beyond one section per other worker
    call = excl + par + wait
    rows += _cell_rows(0, n, n * SB / (call + 20e-6), {"iteration": (call, excl, wait)})
    (cell,) = [c for c in ss.predict_cells(rows, 16, **CONFIG) if c["learners"] == n]
    assert cell["error"] > ss.MISS and cell["term"] == term


def test_predict_cells_refuses_what_it_cannot_model():
    rows = _model_rows([(0, 1), (0, 2)], cores=2)  # no one-actor cell
    with pytest.raises(ValueError, match="one-worker accounts"):
        ss.predict_cells(rows, 2, **CONFIG)
    with pytest.raises(ValueError, match="cores"):
        ss.predict_cells(_model_rows([(1, 0), (0, 1)], cores=2), 0, **CONFIG)
