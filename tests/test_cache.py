"""replaybench.bench.cache: the LRU model on hand-computed cases, traces against the real trees, the
meters' "unsupported" paths, the entry point's rows, and one real cachegrind differential."""

import shutil
import types

import numpy as np
import pytest

from replaybench.bench import cache
from replaybench.bench.cache import meters
from replaybench.bench.cache.model import CacheLevel, CacheModel, simulate
from replaybench.bench.cache.traces import TreeTracer, data_gather, trace_support, tree_of
from replaybench.impl import registry
from replaybench.impl.trees import kernels
from replaybench.impl.trees.array_trees import (AlignedKarySumTree, BinarySumTree, BlockedBinarySumTree, KarySumTree,
                                                PrefixKarySumTree)

L1 = CacheLevel(48 * 1024, 12, 64)
L2 = CacheLevel(2 * 1024 * 1024, 16, 64)


# --------------------------------------------------------------------------------- the model

def test_sequential_scan_misses_once_per_line():
    n = 1 << 20
    for step in (1, 4, 64):
        c = simulate(np.arange(0, n, step), L1)
        assert c["L1d"] == n // 64
        assert c["accesses"] == n // step


def test_stride_equal_to_cache_size_thrashes():
    # direct-mapped 4 KiB: 0 and 4096 share set 0 and evict each other every time
    dm = CacheLevel(4096, 1, 64)
    assert simulate(np.array([0, 4096] * 100), dm)["L1d"] == 200
    # 2-way 8 KiB (64 sets): three lines at stride = cache size all map to set 0; cycling
    # through three with LRU and two ways misses every time ...
    two = CacheLevel(8192, 2, 64)
    assert simulate(np.array([0, 8192, 16384] * 50), two)["L1d"] == 150
    # ... while two of them fit in the set's two ways: only the two cold misses
    assert simulate(np.array([0, 8192] * 50), two)["L1d"] == 2
    # the real L1d (12 ways): 13 lines at stride 48 KiB thrash, 12 fit
    assert simulate(np.tile(np.arange(13) * L1.size, 20), L1)["L1d"] == 13 * 20
    assert simulate(np.tile(np.arange(12) * L1.size, 20), L1)["L1d"] == 12


def test_working_set_that_fits_has_only_cold_misses():
    ws = np.arange(0, 32 * 1024, 8)
    c = simulate(np.tile(ws, 10), L1, L2)
    assert c["L1d"] == 32 * 1024 // 64 and c["LL"] == 32 * 1024 // 64
    # a warm-up pass makes even those go away
    assert simulate(ws, L1, L2, warm=ws)["L1d"] == 0


def test_second_level_sees_only_first_level_misses():
    ws = np.arange(0, 512 * 1024, 64)  # 512 KiB: misses L1 every pass, fits L2
    c = simulate(np.tile(ws, 3), L1, L2)
    assert c["L1d"] == 3 * ws.size
    assert c["LL"] == ws.size


def test_lru_eviction_order_in_one_set():
    m = CacheModel(CacheLevel(8192, 2, 64))  # 64 sets; A, B, C all map to set 0
    A, B, C = 0, 8192, 16384
    seq = [(A, 1), (B, 1), (A, 0), (C, 1),  # C evicts B, the least recently used
           (A, 0), (B, 1),                  # A stayed; B comes back and evicts C
           (C, 1), (B, 0), (A, 1)]          # C evicts A (B was just used); then A evicts C
    for addr, miss in seq:
        before = m.misses1
        m.access([addr])
        assert m.misses1 - before == miss, (addr, miss)


def test_cache_level_validation_and_non_power_of_two_sets():
    with pytest.raises(ValueError):
        CacheLevel(1000, 3, 64)
    with pytest.raises(ValueError):
        CacheLevel(4096, 1, 48)
    lv = CacheLevel(3 * 64 * 4, 4, 64)  # 3 sets
    assert lv.sets == 3
    assert simulate(np.arange(0, 3 * 64 * 4, 64), lv)["L1d"] == 12


def test_random_accesses_over_a_large_region_hit_as_often_as_capacity_predicts():
    """10**6 uniform random lines of a 1 GiB region: a line is resident with probability
    (cache lines / region lines), so L1d hits ~ 10**6 * 768 / 2**24 ~ 46 and L2 hits ~ 1950."""
    a = np.random.default_rng(0).integers(0, 1 << 30, 10**6)
    counts = simulate(a, L1, L2)
    assert counts["accesses"] == 10**6
    l1_hits, l2_hits = 10**6 - counts["L1d"], counts["L1d"] - counts["LL"]
    assert 10 <= l1_hits <= 150
    assert 1000 <= l2_hits <= 3000


# ------------------------------------------------------------------------------- the traces

TREES = {
    "binary": lambda c: BinarySumTree(c),
    "kary": lambda c: KarySumTree(c, 16),
    "kary5": lambda c: KarySumTree(c, 5),
    "kary-aligned": lambda c: AlignedKarySumTree(c, 16),
    "kary-aligned-f64": lambda c: AlignedKarySumTree(c, 8, dtype="float64"),
    "binary-blocked": lambda c: BlockedBinarySumTree(c),
    "kary-prefix": lambda c: PrefixKarySumTree(c, 16),
}


def _cartpole():
    from replaybench.bench.derive import SCHEMAS

    return SCHEMAS["cartpole"]


def _variant_tree(name, cap):
    """The tree of registered variant ``name`` (None: it samples without one)."""
    return tree_of(registry.create(name, cap, _cartpole()))


#: Every registered variant's own tree, plus parameters the defaults do not reach (K = 5: no
#: shift for the parent; float64 with K = 8: another item size).
TRACE_CASES = {**{f"variant:{n}": (lambda c, n=n: _variant_tree(n, c)) for n in registry.names()},
               "kary K=5": TREES["kary5"], "kary-aligned K=8 float64": TREES["kary-aligned-f64"]}


def _fill(t, rng):
    t.resum_every = 10**12  # no rebuild between the traced and the real update
    t.update(np.arange(t.capacity), rng.random(t.capacity))
    return t


def _filled(make, cap, rng):
    return _fill(make(cap), rng)


def _span(arr):
    return arr.ctypes.data, arr.ctypes.data + arr.nbytes


@pytest.mark.parametrize("name", sorted(TRACE_CASES))
@pytest.mark.parametrize("cap", [1000, 4096, 70000])
def test_traces_follow_the_real_kernels(name, cap, rng):
    """The trace guard: for every registered variant, the replay reaches the leaves the real
    kernels find and leaves the arrays exactly where the real update does; a variant with no
    sum tree or no replay is reported as such by the model meter, never traced."""
    tree = TRACE_CASES[name](cap)
    if tree is None or not trace_support(tree)[0]:
        from replaybench.bench.cache._driver import build

        res = meters.measure_model(build(name.removeprefix("variant:"), cap), warm_calls=1, calls=1, l1=L1, l2=L2)
        expected = "skipped" if tree is None else "unsupported"
        assert res[("update", "tree")]["status"] == expected and res[("sample", "tree")]["status"] == expected
        return
    t = _fill(tree, rng)
    tr = TreeTracer(t)
    (s_lo, s_hi), (m_lo, m_hi) = _span(t.sums), _span(t.mins)
    for _ in range(3):
        us = rng.random(256) * t.total()
        addrs, leaves = tr.sample(us)
        idx, _ = t.find(us)
        np.testing.assert_array_equal(leaves, idx)  # the traced descent reaches find's leaf
        assert ((addrs >= s_lo) & (addrs < s_hi)).all()
        i = rng.integers(0, cap, 256)
        v = rng.random(256)
        v[::9] = 0.0  # zero leaves exercise the +inf minima and the rescans
        i[:4] = i[0]  # repeats
        ua = tr.update(i, v)
        t.update(i, v)
        assert ((ua >= min(s_lo, m_lo)) & (ua < max(s_hi, m_hi))).all()
        # the copies went exactly where the real kernel took the tree
        np.testing.assert_array_equal(tr.mins, t.mins)
        np.testing.assert_array_equal(tr.sums, t.sums)


def test_a_tree_with_code_of_its_own_is_unsupported_not_mis_traced(monkeypatch):
    """A tree whose kernel set has no replay, or which overrides the methods that call its
    kernels, gets no tracer: the model meter and the cache scenario say ``unsupported``."""
    own = types.ModuleType("own_kernels")  # the same functions, but a kernel set the tracer does not know
    for fn in ("update", "fill", "get", "rebuild"):
        setattr(own, fn, getattr(kernels, fn))

    class OwnKernels(AlignedKarySumTree):
        kernels = own

    class OwnFind(AlignedKarySumTree):
        def find(self, us):
            return super().find(us)

    for cls, reason in ((OwnKernels, "no replay"), (OwnFind, "overrides ArraySumTree.find")):
        tree = cls(1024)
        ok, why = trace_support(tree)
        assert not ok and reason in why
        with pytest.raises(ValueError, match="cannot be traced"):
            TreeTracer(tree)
    monkeypatch.setattr(registry, "_variants", registry._variants.copy())  # registrations end with the test
    registry.register_tree("own-kernels", OwnKernels, structure="kary-aligned", params={"K": 16})
    rows = []
    cache.run({"name": "t", "scenario": "cache", "variants": ["own-kernels"], "capacities": [1024], "batch": 16,
               "methods": {"model": {"capacities": [1024], "warm_calls": 1, "calls": 2}}}, None, rows.extend,
              progress=False)
    assert {(r["op"], r["stream"]) for r in rows} == {("sample", "tree"), ("sample", "tree+data"), ("update", "tree")}
    assert all(r["status"] == "unsupported" and r["value"] is None and "no replay" in r["error"] for r in rows)


def _level_lines(tree, u):
    tr = TreeTracer(tree)
    addrs, _ = tr.sample(np.array([u]))
    per = addrs[:-1].reshape(tr.D, -1)  # K - 1 reads per level (+ the leaf)
    return [np.unique(row // 64).size for row in per]


def test_aligned_k16_float32_descent_touches_one_line_per_level(rng):
    t = _filled(TREES["kary-aligned"], 2**16, rng)
    for u in rng.random(200) * t.total():
        assert _level_lines(t, u) == [1] * t.depth
    # Unpadded K=16 level order: every sibling group starts at slot 1 mod 16, so the group
    # straddles two lines, but the K - 1 = 15 slots the scan reads are slots 1..15 of one line.
    unaligned = _filled(TREES["kary"], 2**16, rng)
    assert all(_level_lines(unaligned, u) == [1] * unaligned.depth for u in rng.random(50) * unaligned.total())
    assert all(unaligned.layout[d, 0] % 16 == 1 for d in range(1, unaligned.depth + 1))
    # with K = 5 (a 20-byte group) groups fall anywhere in a line, and some scans cross one
    k8 = _filled(lambda c: KarySumTree(c, 5), 5**7, rng)
    assert max(max(_level_lines(k8, u)) for u in rng.random(200) * k8.total()) == 2


def test_prefix_sample_reads_group_slots_and_raw_leaf(rng):
    t = _filled(TREES["kary-prefix"], 4096, rng)
    tr = TreeTracer(t)
    addrs, leaves = tr.sample(np.array([t.total() * 0.5]))
    assert addrs[-1] == t.sums.ctypes.data + (t.layout[-1, 0] + leaves[0]) * 4  # the raw leaf row
    assert tr.D * 15 <= addrs.size - 1 <= tr.D * 16


def test_data_gather_addresses(rng):
    from replaybench.bench.derive import SCHEMAS
    from replaybench.impl.storage import ColumnarStorage

    st = ColumnarStorage(1000, SCHEMAS["cartpole"])
    idx = rng.integers(0, 1000, 64)
    a = data_gather(st.columns, idx)
    assert a.size >= 5 * 64  # one address per field and row, two where a row crosses a line
    for col in st.columns.values():
        inside = (a >= col.ctypes.data) & (a < col.ctypes.data + col.nbytes)
        assert inside.sum() >= idx.size


def test_model_meter_orders_layouts_as_designed():
    from replaybench.bench.cache._driver import build

    res = {v: meters.measure_model(build(v, 2**16), warm_calls=32, calls=64, l1=L1, l2=L2)
           for v in ("binary", "kary-aligned")}
    for key in (("sample", "tree"), ("update", "tree"), ("sample", "tree+data")):
        assert res["kary-aligned"][key]["status"] == "ok"
        assert res["kary-aligned"][key]["misses_per_op"]["L1d"] < res["binary"][key]["misses_per_op"]["L1d"]


# -------------------------------------------------------------------------------- the meters

def test_machine_caches_fallback(monkeypatch):
    monkeypatch.setattr(meters, "_from_sysfs", lambda: (_ for _ in ()).throw(OSError("no sysfs")))
    monkeypatch.setattr(meters, "_from_lscpu", lambda: {})
    c = meters.machine_caches()
    assert c["source"] == "fallback"
    assert (c["L1d"], c["L2"]) == (CacheLevel(48 * 1024, 12, 64), CacheLevel(2 * 1024 * 1024, 16, 64))


def test_absent_perf_and_valgrind_are_unsupported(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    for fn in (meters.measure_perf, meters.measure_cachegrind):
        res = fn("binary", 1024)
        assert res and all(r["status"] == "unsupported" and r["misses_per_op"] is None and r["error"]
                           for r in res.values())
    rows = []
    info = cache.run({"name": "t", "scenario": "cache", "variants": ["binary"], "capacities": [1024],
                      "ops": ["sample", "update"], "batch": 64,
                      "methods": {"cachegrind": {"capacities": [1024]}, "perf": {"capacities": [1024]}}},
                     None, rows.extend, progress=False)
    assert "not found" in info["methods"]["perf"] and "not found" in info["methods"]["cachegrind"]
    assert rows and all(r["status"] == "unsupported" and r["value"] is None for r in rows)
    assert {r["method"] for r in rows} == {"perf", "cachegrind"}


def test_perf_without_counters_is_unsupported_not_zero():
    ok, why = meters.perf_support()
    if ok:
        pytest.skip("this machine has hardware counters")
    res = meters.measure_perf("binary", 1024)
    assert all(r["status"] == "unsupported" and r["misses_per_op"] is None for r in res.values())


def test_parse_cachegrind(tmp_path):
    f = tmp_path / "cg.out"
    f.write_text("desc: I1 cache: 65536 B, 64 B, 16-way associative\ncmd: python\n"
                 "events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw\nfl=x\n"
                 "summary: 100 1 1 50 7 3 20 2 1\n")
    t = meters.parse_cachegrind(f)
    assert meters._cg_levels(t) == {"L1d": 9, "LL": 4}
    f.write_text("nothing\n")
    with pytest.raises(ValueError):
        meters.parse_cachegrind(f)


def test_cachegrind_calls_clamped():
    assert meters.cachegrind_calls(1e-4, seconds=3) == 500
    assert meters.cachegrind_calls(1.0) == 16
    assert meters.cachegrind_calls(1e-9) == 2000


def test_run_entry_point_rows():
    suite = cache.load_suite("cache")
    suite = {**suite, "methods": {"model": {"capacities": [1024], "warm_calls": 4, "calls": 8}}}
    rows = []
    info = cache.run(suite, ["binary", "kary-aligned", "uniform"], rows.extend, progress=False)
    assert info["methods"]["model"] == "ok" and "L1d" in info["caches"]
    need = {"scenario", "variant", "structure", "K", "dtype", "capacity", "batch", "op", "metric", "level",
            "method", "unit", "value", "status", "error", "stream"}
    assert all(need <= r.keys() for r in rows)
    assert {r["scenario"] for r in rows} == {"cache"} and {r["metric"] for r in rows} == {"misses_per_op"}
    ok = [r for r in rows if r["status"] == "ok"]
    assert {(r["variant"], r["op"], r["stream"]) for r in ok} == {
        (v, op, s) for v in ("binary", "kary-aligned") for op, s in
        (("sample", "tree"), ("sample", "tree+data"), ("update", "tree"))} | {("uniform", "sample", "tree+data")}
    assert all(r["value"] >= 0 and r["level"] in ("L1d", "LL") for r in ok)
    assert all(r["status"] == "skipped" for r in rows if r["variant"] == "uniform" and r["stream"] == "tree")
    assert "binary" in cache.format_table(rows)
    with pytest.raises(KeyError):
        cache.run(suite, ["no-such-variant"], rows.extend, progress=False)


def test_differential_within_its_resolution_is_a_bound_never_a_negative_count():
    # (M, 2M, 3M) totals 1000, 980, 960 with M = 40: -0.5 misses per call, the issue's case
    value, res = meters.differential(1000, 980, 960, 40)
    assert value == -0.5 and res == 0.5  # a negative mean is noise at least that large
    assert meters.reading(value, res) == (meters.BELOW_RESOLUTION, 0.5)
    # a clear signal: 2 per call both times, resolution = one miss in the counted region
    assert meters.differential(1000, 1080, 1160, 40) == (2.0, 1 / 40)
    assert meters.reading(2.0, 1 / 40) == ("ok", 2.0)
    # differentials that disagree: the spread is the resolution; a value inside it is a bound
    value, res = meters.differential(1000, 1040, 1044, 40)  # 1.0 then 0.1 per call
    assert (value, res) == pytest.approx((0.55, 0.9))
    assert meters.reading(value, res) == (meters.BELOW_RESOLUTION, pytest.approx(1.45))
    assert meters.reading(0.0, 1 / 40) == (meters.BELOW_RESOLUTION, 1 / 40)  # never a silent 0


def _fake_valgrind(totals):
    """A stand-in for ``subprocess.run`` of valgrind: writes a cachegrind output file whose
    totals are ``totals(counts)`` for the run's ``--count op=N`` arguments."""
    import subprocess

    def run(cmd, **kwargs):
        counts = dict(cmd[i + 1].split("=") for i, a in enumerate(cmd) if a == "--count")
        out = next(a.split("=", 1)[1] for a in cmd if a.startswith("--cachegrind-out-file="))
        l1, ll = totals({k: int(v) for k, v in counts.items()})
        with open(out, "w") as fh:
            fh.write(f"events: Dr D1mr DLmr Dw D1mw DLmw\nsummary: 0 {l1} {ll} 0 0 0\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def test_cachegrind_meter_reports_a_negative_differential_below_resolution(monkeypatch, tmp_path):
    """LL misses that fall as sample calls are added (noise at a near-empty level) must come
    out as ``below-resolution`` with a bound >= 0, never as a negative count."""
    monkeypatch.setattr(meters, "cachegrind_support", lambda: (True, "valgrind"))
    monkeypatch.setattr(meters, "warm_numba_cache", lambda variant, timeout=600: None)
    monkeypatch.setattr(meters.subprocess, "run", _fake_valgrind(
        lambda n: (1000 + 300 * n["sample"] + 500 * n["update"], 5000 - n["sample"] // 2 + 2 * n["update"])))
    res = meters.measure_cachegrind("kary-aligned", 4096, calls=40, warm_calls=4, workdir=tmp_path, caches={
        "L1i": L1, "L1d": L1, "L2": L2})
    sample, update = res[("sample", "tree")], res[("update", "tree")]
    assert sample["misses_per_op"] == {"L1d": 300.0, "LL": 0.5} and sample["below_resolution"] == ("LL",)
    assert update["misses_per_op"] == {"L1d": 500.0, "LL": 2.0} and update["below_resolution"] == ()
    info = {"variant": "kary-aligned", "structure": "kary-aligned", "policy": "none", "K": 16, "dtype": "float32",
            "params": {}}
    rows = cache.rows_for(info, {"batch": 256}, 4096, res)
    by = {(r["op"], r["level"]): r for r in rows}
    assert by["sample", "LL"]["status"] == "below-resolution" and by["sample", "LL"]["value"] == 0.5
    assert "measured -0.5" in by["sample", "LL"]["error"]
    assert all(r["value"] >= 0 for r in rows)
    assert {by[k]["status"] for k in by if k != ("sample", "LL")} == {"ok"}
    assert "< 0.5" in cache.format_table(rows)


@pytest.mark.slow
def test_cachegrind_differential_runs(tmp_path):
    ok, why = meters.cachegrind_support()
    if not ok:
        pytest.skip(why)
    res = meters.measure_cachegrind("kary-aligned", 4096, calls=40, warm_calls=4, workdir=tmp_path)
    for key in (("sample", "tree"), ("update", "tree")):
        r = res[key]
        assert r["status"] == "ok", r
        # At 2**12 the tree fits in the L2 and the spread between the 2M and 3M differentials
        # (what else varies between runs) can be as large as the op's own misses: either level
        # may come out as a bound. Whatever it is, it is never a negative count.
        for lv in meters.LEVELS:
            assert r["misses_per_op"][lv] >= 0 and r["resolution"][lv] >= 1 / 40, r
            if lv in r["below_resolution"]:
                assert r["misses_per_op"][lv] == max(r["measured"][lv], 0) + r["resolution"][lv], r
            else:
                assert r["misses_per_op"][lv] == r["measured"][lv] > r["resolution"][lv], r
        # Where measured above resolution: 256 descents of depth 3 touch hundreds of L1d lines, not
        # millions, and the last level misses no more than L1d does (within both resolutions).
        res_ = r["resolution"]
        if "L1d" not in r["below_resolution"]:
            assert 0 < r["measured"]["L1d"] < 20000, r
            if "LL" not in r["below_resolution"]:
                assert r["measured"]["LL"] <= r["measured"]["L1d"] + res_["L1d"] + res_["LL"], r


def test_cache_suite_runs_through_the_harness(tmp_path):
    """`replaybench run --suite <cache-shaped json>` writes a complete run with model rows."""
    import json
    import subprocess
    import sys

    from replaybench.bench import results

    suite = cache.load_suite("cache")
    suite = {**suite, "name": "cache-smoke", "variants": ["binary", "kary-aligned"],
             "methods": {"model": {"capacities": [1024], "warm_calls": 4, "calls": 8},
                         "perf": {"capacities": [1024], "variants": ["binary"], "calls": 8, "warm_calls": 2}}}
    path = tmp_path / "cache-smoke.json"
    path.write_text(json.dumps(suite))
    proc = subprocess.run([sys.executable, "-m", "replaybench.bench", "run", "--suite", str(path), "--out", str(tmp_path / "r"),
                           "--no-progress"], cwd=results.REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run_dir,) = (tmp_path / "r").iterdir()
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["complete"] is True and meta["cache_miss_method"]["model"] == "ok"
    rows = results.read_rows(run_dir)
    model = [r for r in rows if r["method"] == "model"]
    assert model and all(r["status"] == "ok" and r["metric"] == "misses_per_op" and r["value"] >= 0 for r in model)
    assert {r["variant"] for r in model} == {"binary", "kary-aligned"}
    perf = [r for r in rows if r["method"] == "perf"]
    assert perf and all(r["status"] in ("ok", "unsupported", "skipped") or r["error"] for r in perf)
    assert "misses per call" in proc.stdout


def test_figure_and_report_show_a_below_resolution_cell_as_a_bound(tmp_path):
    """A below-resolution row reaches the figure's CSV as a bound (no count) and the report's
    cache table as ``< bound``; a negative or zero count appears nowhere."""
    import pandas as pd

    from replaybench.analysis import load, render
    from replaybench.analysis.plots import cache_misses
    from replaybench.bench import results

    info = {"variant": "kary-aligned", "structure": "kary-aligned", "policy": "none", "K": 16, "dtype": "float32",
            "params": {}}
    suite = {"batch": 256, "transitions": "cartpole"}
    cg = meters.differential_record("cachegrind", {"base": {"L1d": 1000, "LL": 5000},
                                                   "samplex2": {"L1d": 13000, "LL": 4980},
                                                   "samplex3": {"L1d": 25000, "LL": 4960}}, "sample", 40)
    model = meters.record("model", "ok", {"L1d": 250.0, "LL": 0.0})
    rows = (cache.rows_for(info, suite, 4096, {("sample", "tree"): cg})
            + cache.rows_for(info, suite, 4096, {("sample", "tree"): model}))
    writer = results.RunWriter(tmp_path / "runs", "20300101T000000Z-cache", {
        "scenario": "cache", "suite": {"name": "cache", "batch": 256}, "machine": {"cpu_model": "test"}})
    writer.append([{**r, "run_id": writer.run_id, "schema_version": results.SCHEMA_VERSION} for r in rows])
    writer.finish(True)
    res = load.load_runs([writer.dir])
    outcome = render.render(res, tmp_path / "figs", echo=lambda _: None,
                            only={"cache_misses"})
    assert set(outcome.written) == {"cache_misses"}, outcome.failed
    got = pd.read_csv(tmp_path / "figs" / "cache_misses.csv")
    cell = got[(got["method"] == "cachegrind") & (got["level"] == "LL")].iloc[0]
    assert cell["status"] == "below-resolution" and pd.isna(cell["misses_per_transition"])
    assert cell["bound_per_transition"] == pytest.approx(0.5 / 256)
    assert (got["misses_per_transition"].dropna() >= 0).all()
    text = "\n".join(cache_misses.report_section(outcome.data["cache_misses"], res, outcome.data))
    assert "< 0.002" in text and "-0." not in text
