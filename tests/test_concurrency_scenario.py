"""The concurrency scenario (actors + learners at a fixed ratio), the memory-limits probe and
the scaling model: rows per op kind, per-call costs, the ratio kept, the model's bounds and
its fit to a run, the `plan` and `limits` commands."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from replaybench.bench import contract, derive, driver, limits, results, suites
from replaybench.impl.machine import usable_cores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "replaybench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


# ----------------------------------------------------------------------------- the scenario
@pytest.fixture(scope="module")
def model_run(tmp_path_factory):
    """A small run with the model's input cells and two predicted ones, threads only."""
    out = tmp_path_factory.mktemp("conc")
    suite = {**suites.load("concurrency-quick"), "name": "concurrency-model", "policies": ["lazy-writing"],
             "modes": ["threads"], "workers": [[1, 0], [0, 1], [0, 2], [1, 1], [1, 2]], "repeats": 1}
    (run,) = driver.run_suites(suite, out=str(out), progress=False, echo=lambda *a: None)
    return run


def test_concurrency_quick_rows_are_per_op_kind_with_costs_and_the_ratio_kept(tmp_path):
    """`replaybench run --suite concurrency-quick`: items/s per op kind (no aggregate), per-call
    busy / wait / hold per kind, the samples-per-insert ratio held, memory limits in meta."""
    proc = _cli("run", "--suite", "concurrency-quick", "--out", str(tmp_path), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    (run,) = tmp_path.iterdir()
    rows = results.read_rows(run)
    meta = results.read_meta(run)
    assert meta["complete"] is True and meta["samples_per_insert"] == 8
    assert {s["bytes"] for s in meta["memory_limits"]["sizes"]} == set(limits.DEFAULT_SIZES)
    assert {r["status"] for r in rows} == {"ok"}
    assert {(r["policy"], r["mode"]) for r in rows} == {(p, m) for p in ("global-lock", "lazy-writing")
                                                        for m in ("threads", "processes")}
    metrics = {(r["op"], r["metric"]) for r in rows}
    assert metrics == {("insert", "items_per_s"), ("sample", "items_per_s"), ("update", "items_per_s"),
                       *((k, m) for k in ("insert", "iteration")
                         for m in ("busy_s_per_call", "lock_wait_s_per_call", "lock_hold_s_per_call")),
                       ("all", "lock_wait_fraction"), ("all", "rate_wait_fraction"),
                       *((("all", f"line_transfer_ns_{w}") for w in ("before", "after")) if usable_cores() >= 2
                         else ())}
    for r in rows:
        assert r["actors"] == 1 and r["learners"] == 1 and r["value"] >= 0
        if r["metric"].startswith("line_transfer_ns"):  # one per cell, before and after its windows
            assert r["unit"] == "ns" and r["value"] > 0 and r["repeat"] == 0
        if r["metric"].endswith("fraction"):
            assert r["value"] <= 1
    by_window = {}
    for r in rows:
        if r["metric"] == "items_per_s":
            by_window.setdefault((r["policy"], r["mode"], r["repeat"]), {})[r["op"]] = r["value"]
    for key, w in by_window.items():
        # sampled = 8 x inserted within the limiter's slack (1 write batch x 8 + 1 sample batch) per window
        seconds = 0.2
        slack = (8 * 32 + 64) / seconds
        assert abs(w["sample"] - 8 * w["insert"]) <= slack * 1.5 + 0.05 * w["sample"], (key, w)
        assert w["update"] <= w["sample"]
    for r in rows:  # a lock is held for no longer than the calls that hold it
        if r["metric"] == "lock_hold_s_per_call":
            busy = next(x["value"] for x in rows if x["metric"] == "busy_s_per_call" and x["op"] == r["op"]
                        and (x["policy"], x["mode"], x["repeat"]) == (r["policy"], r["mode"], r["repeat"]))
            assert r["value"] <= busy * 1.001
    assert "x global-lock" in proc.stdout and "aggregate" not in proc.stdout and "line ns" in proc.stdout


@pytest.mark.slow  # 10-16 s: `make test-slow` (keeps `make test` within its 10 minutes)
def test_shared_path_states_what_binds_two_learner_threads(tmp_path, monkeypatch):
    """With ``shared_path``, meta.json holds per policy the GIL's bound and the compiled two-thread
    ratio (an error for a policy or tree without a fused learner step: every registered policy
    has one since pal-locks was fused, so pal-locks' measurement is made to refuse here),
    contract-checked, and the summary sets them beside the measured two learner threads over one."""
    from replaybench.bench import concurrency_workers

    measure = concurrency_workers.shared_gil_share

    def no_fused_step_for_pal_locks(policy, *args, **kwargs):
        if policy == "pal-locks":
            raise NotImplementedError("pal-locks: no fused learner step (this test's stand-in)")
        return measure(policy, *args, **kwargs)

    monkeypatch.setattr(concurrency_workers, "shared_gil_share", no_fused_step_for_pal_locks)
    suite = {**suites.load("concurrency-quick"), "name": "conc-shared", "policies": ["lazy-writing", "pal-locks"],
             "modes": ["threads"], "workers": [[0, 1], [0, 2], [0, 4]], "repeats": 1, "shared_path": True}
    printed = []
    (run,) = driver.run_suites(suite, out=str(tmp_path), progress=False, echo=printed.append)
    meta = results.read_meta(run)  # read through the contract's checks
    by = {e["policy"]: e for e in meta["shared_path"]}
    assert set(by) == {"lazy-writing", "pal-locks"}
    lazy = by["lazy-writing"]
    assert 1.0 <= lazy["gil_bound"] <= 2.0 and lazy["capacity"] == 4096 and lazy["batch"] == 64
    lo, hi = lazy["step_over_local_range"]
    assert 0 < lo <= lazy["step_over_local"] <= hi and lazy["step_s"] > 0 and lazy["local_step_s"] > 0
    assert 0 < lazy["kernel"]["ratio_min"] <= lazy["kernel"]["ratio"] <= lazy["kernel"]["ratio_max"]
    own = lazy["kernel_private"]
    assert 0 < own["ratio_min"] <= own["ratio"] <= own["ratio_max"] and own["retries"] == 0  # nothing to contend
    assert by["pal-locks"]["error"] == "NotImplementedError: pal-locks: no fused learner step (this test's stand-in)"
    assert "kernel" not in by["pal-locks"] and "kernel_private" not in by["pal-locks"]
    text = "\n".join(printed)
    assert "kernel 2T x 1 own buffers" in text and "kernel line ns" in text
    if usable_cores() >= 2:  # a line's trip between two cores, before and after the compiled figures
        assert len(lazy["line_transfer_ns"]) == 2 and min(lazy["line_transfer_ns"]) > 0
    own_cell = f"{own['ratio']:.2f} ({own['ratio_min']:.2f}-{own['ratio_max']:.2f})"
    pair = lazy["gil_pair"]
    assert 0 < pair["ratio_min"] <= pair["ratio"] <= pair["ratio_max"] and "gil_pair" not in by["pal-locks"]
    pair_cell = f"{pair['ratio']:.2f} ({pair['ratio_min']:.2f}-{pair['ratio_max']:.2f})"
    line = next(ln for ln in text.splitlines() if "lazy-writing" in ln and f"{lazy['gil_bound']:.2f}" in ln)
    rates = {r["learners"]: r["value"] for r in results.read_rows(run)
             if r["policy"] == "lazy-writing" and r["op"] == "sample" and r["metric"] == "items_per_s"}
    assert f"{rates[2] / rates[1]:.2f}" in line and f"{pair_cell}  {own_cell}" in line
    # past two learners: the compiled scaling at 4 threads, a buffer each and one buffer
    (four,) = lazy["kernel_scaling"]
    assert four["threads"] == 4 and four["kernel_private"]["retries"] == 0
    cells = [f"{four[k]['ratio']:.2f} ({four[k]['ratio_min']:.2f}-{four[k]['ratio_max']:.2f})"
             for k in ("kernel_private", "kernel")]
    wide = text.split("T learners over one", 1)[1]
    wide_line = next(ln for ln in wide.splitlines() if "lazy-writing" in ln).split()
    assert wide_line[3:8] == ["4", *cells[0].split(), *cells[1].split()]
    assert wide_line[8] == f"{rates[4] / rates[1]:.2f}"  # the measured 4 threads over 1, beside them
    assert "kernel_scaling" not in by["pal-locks"]
    # the report's section reads the same entries from meta.json through the results contract
    from replaybench.analysis import load
    from replaybench.analysis.plots import concurrency

    res = load.load_runs([run])
    plot = concurrency.build(res.table, res.metas)
    section = "\n".join(concurrency.report_section(plot.data, res, {}))
    assert f"What binds two learners on one buffer (run `{run.name}`)" in section
    shared_lines = section.split("What binds two learners", 1)[1].splitlines()
    row = next(ln for ln in shared_lines if "| lazy-writing |" in ln)
    step_cell = f"{lazy['step_over_local']:.2f} ({lo:.2f}-{hi:.2f})"  # the median over the paired rounds, its range
    assert f"| {step_cell} | {lazy['gil_bound']:.2f} | {pair_cell} | {own_cell} |" in row
    assert step_cell in line
    assert f"| {rates[2] / rates[1]:.2f} |" in row


def test_gil_pair_ratio_times_two_threads_against_one_and_refuses_bad_input():
    from replaybench.bench.workloads import gil_pair_ratio

    got = gil_pair_ratio(2e-6, 8e-6, calls=2, steps=50, repeats=3)
    assert got["held_s"] == 2e-6 and got["free_s"] == 8e-6 and got["calls"] == 2 and got["steps"] == 50
    assert 0 < got["ratio_min"] <= got["ratio"] <= got["ratio_max"] < float("inf")
    for kwargs, name in (({"held_s": -1e-6}, "held_s"), ({"free_s": 2.0}, "free_s"), ({"calls": 0}, "calls"),
                         ({"steps": True}, "steps"), ({"repeats": 1.5}, "repeats"), ({"threads": 1}, "threads"),
                         ({"threads": True}, "threads"), ({"threads": 3.0}, "threads")):
        args = {"held_s": 1e-6, "free_s": 1e-6, **kwargs}
        with pytest.raises(ValueError, match=name):
            gil_pair_ratio(args.pop("held_s"), args.pop("free_s"), **args)
    four = gil_pair_ratio(2e-6, 8e-6, calls=1, steps=50, repeats=2, threads=4)
    assert four["threads"] == 4 and 0 < four["ratio_min"] <= four["ratio"] <= four["ratio_max"] < float("inf")


def test_gil_pair_ratio_raises_what_the_second_thread_raised(monkeypatch):
    """A failure in the second thread reaches the caller (it once left one time in the pair and
    failed later, or waited at the barrier forever)."""
    import threading

    from replaybench.bench import workloads

    def spin(seconds, clock):
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("second thread failed")

    monkeypatch.setattr(workloads, "_nogil_spin", lambda: spin)
    with pytest.raises(RuntimeError, match="second thread failed"):
        workloads.gil_pair_ratio(1e-6, 1e-6, steps=5, repeats=2)
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="second thread failed"):  # and with more threads, none left waiting
        workloads.gil_pair_ratio(1e-6, 1e-6, steps=5, repeats=2, threads=4)
    assert threading.active_count() == before


def test_shared_kernel_scaling_runs_learner_steps_in_two_threads(monkeypatch):
    from replaybench.bench.concurrency_workers import shared_kernel_scaling
    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    attached = []
    real_attach = SharedPrioritizedBuffer.attach.__func__
    def spy(cls, handle, **kw):
        attached.append(handle)
        return real_attach(cls, handle, **kw)

    monkeypatch.setattr(SharedPrioritizedBuffer, "attach", classmethod(spy))
    got = shared_kernel_scaling("optimistic", 4096, batch=32, steps=50, repeats=2)
    assert got["steps"] == 50 and got["retries"] >= 0 and got["shared"]
    assert 0 < got["ratio_min"] <= got["ratio"] <= got["ratio_max"] < float("inf")
    assert len(attached) == 2 and attached[0] == attached[1]  # both threads on the one buffer
    attached.clear()
    own = shared_kernel_scaling("optimistic", 4096, batch=32, steps=50, repeats=2, shared=False)
    assert not own["shared"] and own["retries"] == 0 and 0 < own["ratio_min"] <= own["ratio"] <= own["ratio_max"]
    assert len(attached) == 2 and attached[0] != attached[1]  # each thread on a buffer of its own
    for policy in ("deferred", "pal-locks", "sharded", "atomic-deltas"):  # one calling convention: every policy runs in the loop
        got = shared_kernel_scaling(policy, 1024, batch=8, steps=2, repeats=1)
        assert got["steps"] == 2 and got["ratio"] > 0
    attached.clear()
    four = shared_kernel_scaling("atomic-deltas", 4096, batch=32, steps=20, repeats=2, threads=4, shared=False)
    assert four["threads"] == 4 and four["retries"] == 0 and 0 < four["ratio_min"] <= four["ratio"] <= four["ratio_max"]
    assert len(attached) == 4 and len(set(attached)) == 4  # four threads, a buffer each
    attached.clear()
    four = shared_kernel_scaling("atomic-deltas", 4096, batch=32, steps=20, repeats=2, threads=4)
    assert four["threads"] == 4 and four["shared"] and len(attached) == 4 and len(set(attached)) == 1


@pytest.mark.parametrize("threads", [1, 0, 2.0, True, "4"])
def test_shared_kernel_scaling_refuses_a_bad_thread_count_before_any_buffer(threads, monkeypatch):
    from replaybench.bench.concurrency_workers import shared_kernel_scaling
    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    def no_buffer(*args, **kwargs):
        raise AssertionError("a buffer was made before the argument was checked")

    monkeypatch.setattr(SharedPrioritizedBuffer, "create", no_buffer)
    with pytest.raises(ValueError, match=f"threads must be an integer >= 2, got {threads!r}"):
        shared_kernel_scaling("atomic-deltas", 1024, threads=threads)


def test_learner_step_measurements_run_without_the_periodic_re_sum(monkeypatch):
    """A re-sum (one O(capacity) pass per ``capacity`` leaf updates) lands in whichever timed
    phase reaches it, so the GIL share and the shared-over-local ratio are measured without it."""
    from replaybench.bench import concurrency_workers as W
    from replaybench.impl import registry
    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    seen = []
    create = SharedPrioritizedBuffer.create.__func__

    def spy_shared(cls, *args, **kwargs):
        seen.append(("shared", kwargs.get("resum_every")))
        return create(cls, *args, **kwargs)

    local_create = registry.create

    def spy_local(*args, **kwargs):
        buf = local_create(*args, **kwargs)
        seen.append(("local", buf))
        return buf

    monkeypatch.setattr(SharedPrioritizedBuffer, "create", classmethod(spy_shared))
    monkeypatch.setattr(registry, "create", spy_local)
    W.shared_gil_share("optimistic", 1024, batch=16, calls=2, repeats=1)
    assert ("shared", W.NO_RESUM) in seen
    seen.clear()
    W.step_over_local("optimistic", 1024, batch=16, calls=2, repeats=2)
    # the in-process buffer is created first (the shared one makes a private one of its own after it)
    assert seen[0][0] == "local" and seen[0][1].tree.resum_every == W.NO_RESUM and ("shared", W.NO_RESUM) in seen
    for policy in ("sharded", "atomic-deltas"):  # a policy's own kernel set, paired the same way
        seen.clear()
        got = W.step_over_local(policy, 1024, batch=8, calls=2, repeats=1)
        assert got["ratio"] > 0 and got["shared_s"] > 0 and ("shared", W.NO_RESUM) in seen


def test_auto_workers_cover_one_to_twice_the_cores():
    from replaybench.bench.scenarios.concurrency import auto_workers

    for cores in (1, 2, 16):
        splits = auto_workers(cores)
        assert [1, 0] in splits and [0, 1] in splits and [0, 2] in splits
        assert max(a + l_ for a, l_ in splits) == max(2, 2 * cores)
        assert len({tuple(s) for s in splits}) == len(splits)
    assert [[a, l_] for a, l_ in auto_workers(2) if a and l_] == [[1, 1], [1, 2], [2, 1], [1, 3], [2, 2], [3, 1]]


def test_core_workers_double_up_to_the_cores_in_three_splits():
    from replaybench.bench.scenarios.concurrency import core_workers

    assert core_workers(1) == [[0, 1], [1, 0]]
    assert core_workers(2) == [[0, 1], [1, 0], [0, 2], [2, 0], [1, 1]]
    splits = core_workers(16)
    assert sorted({a + l_ for a, l_ in splits}) == [1, 2, 4, 8, 16] and len(splits) == 14
    assert [[0, n] for n in (1, 2, 4, 8, 16)] == [s for s in splits if s[0] == 0]
    assert [[8, 8]] == [s for s in splits if sum(s) == 16 and all(s)]
    assert sorted({a + l_ for a, l_ in core_workers(12)}) == [1, 2, 4, 8, 12]  # the cores themselves at the end
    with pytest.raises(ValueError, match="cores must be a positive integer, got 0"):
        core_workers(0)


def test_cores_suite_runs_every_policy_at_the_usable_cores(monkeypatch):
    """concurrency-cores computes its splits from the usable cores when the run is planned, and
    measures every registered policy (sharded and atomic-deltas included)."""
    from replaybench.bench.scenarios import Selection
    from replaybench.bench.scenarios import concurrency as scenario
    from replaybench.impl import concurrent

    monkeypatch.setattr(scenario, "usable_cores", lambda: 16)
    cells = driver.plan(suites.load("concurrency-cores"), Selection()).cells
    assert {c.columns["policy"] for c in cells} == set(concurrent.names())
    assert {"sharded", "atomic-deltas"} <= set(concurrent.names())
    splits = {(c.columns["actors"], c.columns["learners"]) for c in cells}
    assert splits == {tuple(s) for s in scenario.core_workers(16)}
    assert len(cells) == 14 * len(concurrent.names()) and {c.columns["mode"] for c in cells} == {"processes"}


@pytest.mark.parametrize("key,value", [("samples_per_insert", 0), ("samples_per_insert", "8"), ("workers", "all"),
                                       ("shared_path", "yes")])
def test_bad_suite_values_are_refused_before_anything_runs(key, value, tmp_path):
    from replaybench.bench.scenarios import SelectionError

    suite = {**suites.load("concurrency-quick"), key: value}
    with pytest.raises(SelectionError, match=key):
        driver.run_suites(suite, out=str(tmp_path), progress=False, echo=lambda *a: None)
    assert not any(tmp_path.iterdir())


def test_rate_limiter_holds_the_ratio_and_gives_up_at_the_deadline():
    import time

    from replaybench.bench.concurrency_workers import RateLimiter

    counts = np.zeros(2, np.int64)
    lim = RateLimiter(counts, samples_per_insert=4, slack=8)
    assert lim.before_sample(8, time.perf_counter() + 1) == 0.0  # within the slack
    lim.sampled(8)
    start = time.perf_counter()
    waited = lim.before_sample(8, start + 0.05)  # 16 > 4 * 0 + 8: waits until the deadline
    assert waited >= 0.04
    lim.inserted(2)  # now 16 <= 4 * 2 + 8
    assert lim.before_sample(8, time.perf_counter() + 1) == 0.0
    assert lim.before_insert(1, time.perf_counter() + 1) == 0.0  # 4 * 3 <= 8 + 8
    assert lim.before_insert(10, time.perf_counter() + 0.01) > 0  # 4 * 12 > 16


def test_lock_hold_is_counted_per_object():
    from replaybench.impl.concurrent.locks import SharedLock

    words = np.zeros(1, np.int64)
    lock = SharedLock(words, 0, "t")
    with lock:
        pass
    first = lock.hold_seconds
    with lock:
        import time

        time.sleep(0.01)
    assert 0 <= first < 0.01 and lock.hold_seconds - first >= 0.009


# ----------------------------------------------------------------------------- the model
def _costs(**kw):
    base = dict(insert_s=100e-6, iteration_s=400e-6, insert_hold_s=10e-6, iteration_hold_s=40e-6,
                serial_fraction=0.0, write_batch=64, sample_batch=256, samples_per_insert=8.0)
    return derive.Costs(**{**base, **kw})


def test_predict_binds_the_tightest_bound():
    c = _costs()
    # one learner: 256 / 400 us = 640k samples/s; its inserts (80k/s) need 0.125 of an actor
    p = derive.predict(c, 1, 1, 2)
    assert p.bound == "learners" and p.sample_per_s == pytest.approx(640e3) and p.insert_per_s == pytest.approx(80e3)
    # lock: per sampled transition 40/256 us + 1/8 * 10/64 us = 0.15625 + 0.01953 us -> 5.69 M/s
    p = derive.predict(c, 4, 60, 64)
    assert p.bound == "tree lock" and p.sample_per_s == pytest.approx(1 / (40e-6 / 256 + 10e-6 / 64 / 8))
    # oversubscribed: 4 learners on 2 cores get half a core each
    assert derive.predict(c, 0, 4, 2).sample_per_s == pytest.approx(2 * 640e3)
    # serial fraction 0.5: Amdahl's 8 / (1 + 7 * 0.5) learners' worth on 8 cores, tending to 2
    p = derive.predict(_costs(serial_fraction=0.5, iteration_hold_s=0, insert_hold_s=0), 0, 8, 8)
    assert p.bound == "serial" and p.sample_per_s == pytest.approx(8 / 4.5 * 640e3)
    p = derive.predict(_costs(serial_fraction=0.5, iteration_hold_s=0, insert_hold_s=0), 0, 4096, 4096)
    assert p.sample_per_s == pytest.approx(2 * 640e3, rel=1e-3)
    # on 2 cores 8 learners run 2 at a time: 2 / 1.5 of one
    p = derive.predict(_costs(serial_fraction=0.5, iteration_hold_s=0, insert_hold_s=0), 0, 8, 2)
    assert p.sample_per_s == pytest.approx(2 / 1.5 * 640e3)
    # the actors' own fraction: 0 lets 4 actors insert 4 times one's; None takes the learners'
    free = _costs(serial_fraction=0.5, insert_serial_fraction=0.0, iteration_hold_s=0, insert_hold_s=0)
    assert derive.predict(free, 4, 0, 4).insert_per_s == pytest.approx(4 * 64 / 100e-6)
    same = _costs(serial_fraction=0.5, iteration_hold_s=0, insert_hold_s=0)
    assert derive.predict(same, 4, 0, 4).insert_per_s == pytest.approx(4 / 2.5 * 64 / 100e-6)
    # actors alone insert unthrottled
    p = derive.predict(c, 2, 0, 2)
    assert p.sample_per_s == 0 and p.insert_per_s == pytest.approx(2 * 64 / 100e-6)


def test_plan_picks_the_best_split_and_refuses_bad_input():
    c = _costs(insert_s=2000e-6)  # inserts dear: 8 samples per insert need 1 actor per ~2.5 learners
    best = derive.best_split(8, c)
    assert best.actors + best.learners <= 8
    every = [derive.predict(c, a, n - a, 8) for n in range(2, 9) for a in range(1, n)]
    assert best.sample_per_s == pytest.approx(max(p.sample_per_s for p in every))
    assert best.bound in derive.MODEL_BOUNDS
    with pytest.raises(ValueError, match="cores"):
        derive.best_split(1, c)
    with pytest.raises(ValueError, match="insert_s"):
        _costs(insert_s=-1.0)
    with pytest.raises(ValueError, match="serial_fraction"):
        _costs(serial_fraction=1.5)
    with pytest.raises(ValueError, match="insert_serial_fraction"):
        _costs(insert_serial_fraction=-0.1)
    with pytest.raises(ValueError, match="actors"):
        derive.predict(c, -1, 1, 2)


def test_model_fits_a_run_and_predicts_its_other_cells(model_run):
    rows = contract.read_rows(model_run)
    costs = derive.costs_from_rows(rows, policy="lazy-writing", mode="threads", transitions="cartpole", cores=2)
    assert costs.samples_per_insert == 8 and costs.write_batch == 32 and costs.sample_batch == 64
    assert costs.iteration_s > 0 and costs.insert_s > 0 and 0 <= costs.serial_fraction <= 1
    assert costs.iteration_hold_s <= costs.iteration_s
    checked = derive.validate_model(rows, costs, 2, policy="lazy-writing", mode="threads", transitions="cartpole")
    assert {(v["actors"], v["learners"]) for v in checked} == {(1, 0), (0, 1), (0, 2), (1, 1), (1, 2)}
    for v in checked:
        assert v["input"] == ((v["actors"], v["learners"]) in ((1, 0), (0, 1), (0, 2)))
        assert v["predicted"] > 0 and math.isfinite(v["error"])
    for lone in ((0, 1), (1, 0)):  # the per-call costs are these cells' own rates: reproduced exactly
        assert abs(next(v for v in checked if (v["actors"], v["learners"]) == lone)["error"]) < 1e-9
    with pytest.raises(ValueError, match="per-call costs"):
        derive.costs_from_rows(rows, policy="global-lock", mode="threads", transitions="cartpole")


def test_model_fits_amdahl_through_the_two_worker_cells_of_each_kind():
    """Rows made by the model with a serial fraction per kind are fitted back to those fractions,
    and every cell is then predicted exactly; the 2-actor cell is an input where present."""
    truth = _costs(serial_fraction=0.12, insert_serial_fraction=0.03, iteration_hold_s=0, insert_hold_s=0)
    rows = []
    for a, l_ in ((1, 0), (0, 1), (0, 2), (2, 0), (0, 16), (16, 0), (8, 8)):
        p = derive.predict(truth, a, l_, 16)
        common = dict(scenario="concurrency", status="ok", policy="atomic-deltas", mode="processes",
                      transitions="cartpole", variant="kary-aligned", actors=a, learners=l_, batch=256,
                      params={"write_batch": 64, "samples_per_insert": 8.0, "cores": 16})
        for op, rate in (("insert", p.insert_per_s), ("sample", p.sample_per_s)):
            if rate:
                rows.append({**common, "op": op, "metric": "items_per_s", "value": rate})
        for op in ("insert", "iteration"):
            rows.append({**common, "op": op, "metric": "lock_hold_s_per_call", "value": 0.0})
    where = dict(policy="atomic-deltas", mode="processes", transitions="cartpole")
    fit = derive.costs_from_rows(rows, cores=16, **where)
    assert fit.serial_fraction == pytest.approx(0.12) and fit.insert_serial_fraction == pytest.approx(0.03)
    checked = derive.validate_model(rows, fit, 16, **where)
    assert max(abs(v["error"]) for v in checked) < 1e-9
    assert {(v["actors"], v["learners"]) for v in checked if v["input"]} == {(1, 0), (0, 1), (0, 2), (2, 0)}
    # 16 learners get Amdahl's 16 / (1 + 15 * 0.12) of one, not the 2-learner rate as a cap
    one = next(v["measured"] for v in checked if (v["actors"], v["learners"]) == (0, 1))
    sixteen = next(v["predicted"] for v in checked if (v["actors"], v["learners"]) == (0, 16))
    assert sixteen / one == pytest.approx(16 / 2.8)


def test_plan_command_prints_validation_and_best_splits(model_run):
    proc = _cli("plan", "--run", str(model_run), "--cores", "4,16")
    assert proc.returncode == 0, proc.stderr
    assert "lazy-writing / threads / cartpole" in proc.stdout and "best split" in proc.stdout
    assert "1A+1L" in proc.stdout and "input" in proc.stdout
    # the one-worker serial shares and the model they set, checked against every other cell
    assert "serial shares (one worker): learner step" in proc.stdout and "actor insert" in proc.stdout
    assert "serial-share model on " in proc.stdout and "missed term" in proc.stdout
    bad = _cli("plan", "--run", str(model_run), "--cores", "1")
    assert bad.returncode == 2 and "--cores" in bad.stderr


# ----------------------------------------------------------------------------- the limits probe
def test_limits_probe_shape_and_bound_interpolation():
    lim = limits.probe([4096, 2**20], loads=2000, repeats=1)
    assert [s["bytes"] for s in lim["sizes"]] == [4096, 2**20]
    for s in lim["sizes"]:
        assert s["latency_ns"] > 0 and s["gather_ns"] > 0 and s["gather_ns_2threads"] > 0
    table = {"sizes": [{"bytes": 2**12, "latency_ns": 2.0, "gather_ns": 1.0},
                       {"bytes": 2**20, "latency_ns": 200.0, "gather_ns": 10.0}]}
    assert derive.bound_ns(table, 2**10) == {"gather_ns": 1.0, "latency_ns": 2.0}
    assert derive.bound_ns(table, 2**30) == {"gather_ns": 10.0, "latency_ns": 200.0}
    mid = derive.bound_ns(table, 2**16)  # halfway in log-log
    assert mid["gather_ns"] == pytest.approx(10**0.5) and mid["latency_ns"] == pytest.approx(20.0)
    with pytest.raises(ValueError, match="sizes"):
        limits.probe([64])
    with pytest.raises(ValueError, match="loads"):
        limits.probe([4096], loads=0)
    assert "dependent load ns" in limits.format_limits(lim) and "2 threads x 1" in limits.format_limits(lim)
    old = {**lim, "sizes": [{k: v for k, v in s.items() if k != "gather_ns_2threads"} for s in lim["sizes"]]}
    assert "-" in limits.format_limits(old).splitlines()[-1].split()  # a run from before the 2-thread probe


def test_limits_two_thread_gather_runs_long_enough_to_outweigh_starting_threads(monkeypatch):
    """Each timed two-thread pass gathers for PAIR_SECONDS at least (whole passes over its
    lines): one pass over a cached set takes tens of microseconds, as long as releasing and
    joining two threads, which made the ratio read 0.5 where the machine scales."""
    from replaybench.bench import workloads

    timed = []
    real = workloads.time_threads

    def spy(calls, loops):
        timed.append(real(calls, loops))
        return timed[-1]

    monkeypatch.setattr(workloads, "time_threads", spy)
    lim = limits.probe([4096], loads=2000, repeats=2)
    # the loops come from a calibration pass, which noise can lengthen (so a timed pass may be
    # shorter than PAIR_SECONDS): a tenth of it still tells passes from the tens of microseconds
    assert len(timed) == 2 and min(timed) >= 0.1 * limits.PAIR_SECONDS
    # ns per line over every line of the rounds: one pass of 2,000 cached lines is microseconds
    assert lim["sizes"][0]["gather_ns_2threads"] * 1e-9 * 2 * 2000 < min(timed) / 10
