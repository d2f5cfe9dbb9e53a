"""The one-call buffer operations (impl.fused_ops) against the oracle, for every variant, storage
layout and speed parameter.

The sampling distributions themselves are checked by tests/test_sampling.py (chi-square,
weights) on the default storage; here every other layout and parameter must give exactly the
same samples as the default, and the fused sample must equal the Python composition it
replaces (draws -> tree.find -> weights -> gather), so those checks cover them all.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from scipy.stats import kstest

from replaybench.impl import fused_ops as fused
from replaybench.impl import registry, working_set
from replaybench.impl.storage import make_storage, random_batch

from _support import ALL_VARIANTS, PRIORITIZED, takes_param

FIELDS = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"), "done": ((), "bool"),
          "pair": ((2,), "uint8"), "empty": ((0,), "float64")}
#: Atari-sized rows: 4 stacked 84x84 frames, 28 KB a transition.
ATARI = {"obs": ((4, 84, 84), "uint8"), "action": ((), "int64"), "reward": ((), "float32"), "done": ((), "bool")}
CAPACITY = 300  # not a power of any K; filled past capacity so the ring wraps

#: Parameter settings that must not change any result (speed only); the default is "auto".
SPEED_SETTINGS = [{"storage": "rows"}, {"prefetch": True}, {"hugepages": True},
                  {"storage": "rows", "prefetch": True, "hugepages": True},
                  {"storage": "columns", "prefetch": False}, {"storage": "auto", "prefetch": "auto"}]


def filled(name, fields=FIELDS, capacity=CAPACITY, seed=0, **params):
    buf = registry.create(name, capacity, fields, seed=seed, **params)
    rng = np.random.default_rng(seed)
    batches = [random_batch(fields, n, rng, int_high=100) for n in (capacity // 2, capacity // 2, 37)]
    for b in batches:
        buf.add(b, priorities=None if name == "uniform" else rng.random(len(b["done"])) * 3)
    return buf


def assert_same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def stored_rows(buf, indices):
    return {k: col[indices] for k, col in buf.storage.columns.items()}


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_speed_parameters_change_no_result(name, cache):
    """Rows instead of columns, touch passes, huge pages, "auto": the same samples, weights and
    state (with a tiny cache, "auto" resolves to rows and every touch pass)."""
    base = filled(name)
    # A device buffer's storage is one tensor per field, whatever the host's caches
    # (impl.device_buffer): "auto" has nothing to choose there.
    if cache == "tiny-cache" and "device" not in base.resolved_params:
        assert {k: base.resolved_params[k] for k in ("storage", "prefetch")} == {"storage": "rows", "prefetch": True}
    kernels = [{"kernel": k} for k in ("generic", "specialised", "auto")] if takes_param(name, "kernel") else []
    for params in SPEED_SETTINGS + kernels:
        other = filled(name, **params)
        for stratified_seed in (1, 2):
            assert_same(base.sample(64, rng=np.random.default_rng(stratified_seed)),
                        other.sample(64, rng=np.random.default_rng(stratified_seed)))
        idx = np.arange(0, CAPACITY, 7)
        base.update_priorities(idx, np.linspace(0, 2, idx.size))
        other.update_priorities(idx, np.linspace(0, 2, idx.size))
        assert_same(base.sample(64, rng=np.random.default_rng(3)), other.sample(64, rng=np.random.default_rng(3)))
        base = filled(name)


@pytest.mark.parametrize("storage", ["columns", "rows"])
@pytest.mark.parametrize("name", PRIORITIZED)
def test_fused_sample_equals_the_python_composition(name, storage):
    """Indices = tree.find of the documented SplitMix64 draws; weights = (p / p_min) ** -beta in
    float64 rounded to float32; fields = the stored rows at those indices."""
    for stratified in (False, True):
        buf = filled(name, storage=storage, stratified=stratified)
        n, beta = 100, 0.7
        gen = np.random.default_rng(11)
        key = np.random.default_rng(11).bit_generator.random_raw() >> 1
        out = buf.sample(n, beta=beta, rng=gen)
        v = np.array([fused.uniform01(key, b) for b in range(n)])
        total = buf.tree.total()
        us = (np.arange(n) + v) * (total / n) if stratified else v * total
        idx, prio = buf.tree.find(us)
        assert (idx >= 0).all()  # no redraw happened, so the composition is exact
        np.testing.assert_array_equal(out["indices"], idx)
        np.testing.assert_array_equal(out["weights"], np.power(prio / buf.tree.min(), -beta).astype(np.float32))
        assert_same({k: out[k] for k in FIELDS}, stored_rows(buf, idx))



@pytest.mark.parametrize("storage", ["columns", "rows"])
def test_uniform_kernel_equals_the_uniform_branch_of_sample(storage):
    """fused.sample_uniform (what the uniform buffer calls: no stand-in tree arguments) draws
    and gathers exactly what fused.sample's UNIFORM branch does, and the buffer's sample is it."""
    buf = filled("uniform", storage=storage)
    n = 100
    key = np.random.default_rng(3).bit_generator.random_raw() >> 1
    got = buf.sample(n, rng=np.random.default_rng(3))
    want = buf.sample_out(n)
    assert fused.sample(*fused.uniform_tree_args(), len(buf), key, False, 0.0, buf.storage.arena, *want.tail) == 0
    again = buf.sample_out(n)
    assert fused.sample_uniform(len(buf), key, buf.storage.arena, *again.tail) == 0
    for k in want:
        np.testing.assert_array_equal(again[k], want[k], err_msg=k)
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert (want["weights"] == 1.0).all()

@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_reused_out_equals_fresh_arrays(name):
    buf, twin = filled(name), filled(name)
    out = buf.sample_out(50)
    first = None
    for i in range(4):
        got = buf.sample(50, rng=np.random.default_rng(i), out=out)
        assert got is out
        fresh = twin.sample(50, rng=np.random.default_rng(i))
        assert_same(dict(got), fresh)
        if first is None:
            first = {k: v.copy() for k, v in got.items()}
        buf.add(random_batch(FIELDS, 5, np.random.default_rng(100 + i)))
        twin.add(random_batch(FIELDS, 5, np.random.default_rng(100 + i)))
    assert any(not np.array_equal(first[k], out[k]) for k in ("indices",)), "out was not refilled"


def test_out_is_checked():
    buf, other = filled("binary"), filled("binary")
    with pytest.raises(ValueError, match=r"out must come from this buffer's sample_out\(8\)"):
        buf.sample(8, out=other.sample_out(8))
    with pytest.raises(ValueError, match="for batch_size 9"):
        buf.sample(8, out=buf.sample_out(9))
    with pytest.raises(ValueError, match="got dict"):
        buf.sample(8, out={"indices": np.empty(8, np.int64)})
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        buf.sample_out(0)


@pytest.mark.parametrize("name", ["binary", "kary-prefix", "uniform"])
def test_concurrent_samples_on_one_buffer(name):
    """Threads sampling one buffer at once (no writer) get exactly what each seed gives alone:
    no shared scratch, no torn output, draws independent of the thread that makes them."""
    buf = filled(name, capacity=4096)
    seeds, calls = range(6), 40
    expected = {}
    for s in seeds:
        gen = np.random.default_rng(s)
        expected[s] = [buf.sample(128, rng=gen) for _ in range(calls)]
    got, errors = {}, []
    start = threading.Barrier(len(seeds))

    def worker(s):
        try:
            gen, out = np.random.default_rng(s), buf.sample_out(128)
            start.wait()
            got[s] = [{k: v.copy() for k, v in buf.sample(128, rng=gen, out=out).items()} for _ in range(calls)]
        except BaseException as err:  # reported below: a thread's exception is otherwise lost
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    for s in seeds:
        for a, b in zip(expected[s], got[s]):
            assert_same(a, b)


@pytest.mark.parametrize("storage", ["columns", "rows"])
def test_atari_sized_rows(storage):
    buf = filled("kary-aligned", fields=ATARI, capacity=40, storage=storage)
    out = buf.sample(16, rng=np.random.default_rng(1))
    assert out["obs"].shape == (16, 4, 84, 84)
    assert_same({k: out[k] for k in ATARI}, stored_rows(buf, out["indices"]))


@pytest.mark.parametrize("storage", ["columns", "rows", "rows-packed"])
def test_storage_layouts_write_and_gather_exact_rows(storage):
    st = make_storage(storage, 10, FIELDS)
    rng = np.random.default_rng(3)
    batch = random_batch(FIELDS, 7, rng, int_high=100)
    arrays, n = st.check_batch(batch)
    st.write(6, arrays, n)  # wraps: slots 6..9, 0..2
    got = st.gather(np.array([6, 9, 0, 2]))
    assert_same(got, {k: v[[0, 3, 4, 6]] for k, v in batch.items()})
    if storage != "columns":
        assert len(set(st.table[:, 1].tolist())) == 1  # one row stride: a transition is contiguous
        # 16 + 8 + 4 + 1 + 2 bytes, padded to a multiple of 8, and "rows" to a power of two
        assert st.table[0, 1] == 32
        for f, spec in enumerate(st.specs.values()):
            assert st.table[f, 0] % spec.dtype.itemsize == 0  # every field aligned


#: Fields whose copies take each path of the gather (impl.storage._gather_field): 1, 2, 4 words,
#: the loop over any other count (3 and 5 words), and byte-sized odd widths.
WIDTHS = {"one": ((), "int64"), "two": ((4,), "float32"), "four": ((4,), "float64"), "three": ((24,), "uint8"),
          "five": ((5,), "float64"), "odd": ((3,), "uint8"), "flag": ((), "bool"), "half": ((2,), "int16")}


@pytest.mark.parametrize("storage", ["columns", "rows", "rows-packed"])
def test_gather_copies_every_field_width_exactly(storage):
    st = make_storage(storage, 64, WIDTHS)
    rng = np.random.default_rng(4)
    batch = random_batch(WIDTHS, 64, rng, int_high=1000)
    arrays, n = st.check_batch(batch)
    st.write(0, arrays, n)
    idx = rng.integers(0, 64, 300)
    assert_same(st.gather(idx), {k: v[idx] for k, v in batch.items()})


@pytest.mark.parametrize("storage", ["columns", "rows", "rows-packed"])
def test_touch_rows_loads_first_and_last_byte_of_each_field_of_the_stored_rows(storage):
    """The touch pass's sum is what it loaded: each field's first and last byte of every row
    in ``0 .. size - 1``; indices outside (negative, or past the stored rows) are skipped."""
    from replaybench.impl.storage import touch_rows
    st = make_storage(storage, 64, WIDTHS)
    batch = random_batch(WIDTHS, 64, np.random.default_rng(5), int_high=1000)
    arrays, n = st.check_batch(batch)
    st.write(0, arrays, n)
    idx = np.array([3, -1, 40, 63, 50, 7, -64, 3])
    size = 48
    want = 0
    for i in idx[(idx >= 0) & (idx < size)]:
        for base, stride, width in st.table.tolist():
            if width:
                want += int(st.arena[base + i * stride]) + int(st.arena[base + i * stride + width - 1])
    assert touch_rows(st.arena, st.table, idx, size) == want


def test_speed_parameters_are_checked():
    with pytest.raises(ValueError, match="storage must be one of .*got 'packed'"):
        registry.create("binary", 8, FIELDS, storage="packed")
    with pytest.raises(ValueError, match="prefetch must be True, False or 'auto', got 'yes'"):
        registry.create("kary", 8, FIELDS, prefetch="yes")
    with pytest.raises(ValueError, match="prefetch must be True, False or 'auto', got 'yes'"):
        registry.create("uniform", 8, FIELDS, prefetch="yes")
    with pytest.raises(ValueError, match="storage must be one of .*got 'Auto'"):
        registry.create("kary-prefix", 8, FIELDS, storage="Auto")
    with pytest.raises(ValueError, match="hugepages must be True or False, got 1"):
        registry.create("uniform", 8, FIELDS, hugepages=1)
    with pytest.raises(ValueError, match="kernel='specialised' is the K=16 descent; got K=4"):
        registry.create("kary-prefix", 8, FIELDS, K=4, kernel="specialised")
    with pytest.raises(ValueError, match="kernel must be one of .*'auto'.*got 'fast'"):
        registry.create("kary-prefix", 8, FIELDS, kernel="fast")
    # "auto": the specialised descent where K = 16, else the generic one; recorded
    assert registry.create("kary-prefix", 8, FIELDS).resolved_params["kernel"] == "specialised"
    assert registry.create("kary-prefix", 8, FIELDS, K=4).resolved_params["kernel"] == "generic"
    assert "kernel" not in registry.create("kary-aligned", 8, FIELDS).resolved_params


@pytest.mark.parametrize("name", ["uniform", "binary"])
def test_auto_settings_follow_the_working_set(name, monkeypatch):
    """storage="auto" picks rows once the storage leaves the private cache (and a packed row
    touches fewer lines than its fields apart), prefetch="auto" turns the touch passes on once tree + storage do; both are
    what the buffer (and its tree) then run with, recorded in resolved_params; explicit
    settings are kept."""
    monkeypatch.setattr(working_set, "private_cache_bytes", lambda: 4096)
    small, large = registry.create(name, 16, FIELDS), registry.create(name, 1024, FIELDS)
    assert small.resolved_params == {"storage": "columns", "prefetch": False}
    assert large.resolved_params == {"storage": "rows", "prefetch": True}  # binary: no kernel choice
    assert registry.create(name, 1024, {"x": ((), "float32")}).resolved_params["storage"] == "columns"
    # wide fields (Atari-like frames) touch as many lines packed as apart: columns, which the
    # micro-sweep-storage suite measured faster for them
    wide = {"obs": ((84, 84, 4), "uint8"), "action": ((), "int64"), "next_obs": ((84, 84, 4), "uint8")}
    assert registry.create(name, 8, wide).resolved_params["storage"] == "columns"
    explicit = registry.create(name, 1024, FIELDS, storage="columns", prefetch=False)
    assert explicit.resolved_params == {"storage": "columns", "prefetch": False}
    if name != "uniform":
        assert large.tree.prefetch and not small.tree.prefetch and not explicit.tree.prefetch


def test_auto_storage_counts_the_lines_a_gathered_transition_touches(monkeypatch):
    """Rows exactly when the row (one line where it fits in one, being padded to lie in one;
    else its lines plus a possible straddled one) touches at most ROW_LINE_SHARE of the lines
    of its fields stored apart, and only beyond the private cache."""
    monkeypatch.setattr(working_set, "private_cache_bytes", lambda: 4096)
    choose = working_set.choose_storage
    assert choose("auto", 1024, [16, 8, 4, 16, 1]) == "rows"  # CartPole: 1 line against 5
    assert choose("auto", 1024, [32, 32]) == "rows"  # one line against 2
    assert choose("auto", 1024, [40, 32]) == "columns"  # 72 bytes: up to 3 lines against 2
    assert choose("auto", 8, [16, 8, 4, 16, 1]) == "columns"  # fits the private cache
    assert choose("auto", 1024, [8]) == "columns"  # one field: nothing to pack
    assert choose("auto", 1024, [64, 64]) == "columns"  # 3 lines packed against 2 apart
    assert choose("auto", 1024, [28224, 8, 4, 28224, 1]) == "columns"  # Atari: 884 against 885
    assert choose("rows", 8, [8]) == "rows" and choose("columns", 1 << 20, [16, 16]) == "columns"


def test_cache_sizes_are_read_from_sysfs_with_a_fallback(tmp_path):
    for index, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"),
                                                 (2, "Unified", "2048K"), (3, "Unified", "96M")]):
        d = tmp_path / f"index{index}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert working_set.cache_sizes(str(tmp_path)) == {1: 48 << 10, 2: 2 << 20, 3: 96 << 20}
    # no sysfs: os.sysconf's values (this platform's), never an error
    assert isinstance(working_set.cache_sizes(str(tmp_path / "missing")), dict)
    assert working_set.private_cache_bytes() > 0


def test_draws_are_uniform_and_keyed():
    """SplitMix64 draws: uniform on [0, 1) (KS test), different keys give different streams."""
    v = np.array([fused.uniform01(12345, c) for c in range(20000)])
    assert 0.0 <= v.min() and v.max() < 1.0
    assert kstest(v, "uniform").pvalue > 1e-3
    w = np.array([fused.uniform01(12346, c) for c in range(100)])
    assert not np.array_equal(v[:100], w)


def test_add_errors_leave_the_buffer_unchanged():
    buf = filled("kary-prefix", storage="rows")
    before = ({k: v.copy() for k, v in buf.storage.columns.items()}, buf.tree.leaves(), len(buf))
    bad = random_batch(FIELDS, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"priorities\[2\] = nan is not finite"):
        buf.add(bad, priorities=[1.0, 2.0, np.nan, 1.0])
    assert_same(before[0], buf.storage.columns)
    np.testing.assert_array_equal(before[1], buf.tree.leaves())
    assert len(buf) == before[2]


@pytest.mark.parametrize("name", ["kary-prefix", "uniform"])
def test_indices_and_weights_only(name):
    """sample_out(n, fields=False): the same indices and weights as a full sample, no field."""
    buf = filled(name)
    out = buf.sample_out(32, fields=False)
    got = buf.sample(32, rng=np.random.default_rng(4), out=out)
    assert set(got) == {"indices", "weights"}
    full = buf.sample(32, rng=np.random.default_rng(4))
    assert_same(dict(got), {k: full[k] for k in ("indices", "weights")})
    with pytest.raises(ValueError, match="fields must be True or False, got 'no'"):
        buf.sample_out(32, fields="no")


def test_sample_indices_workload_uses_reused_outputs():
    from replaybench.bench import derive, workloads

    call = workloads.warmed_call("sample_indices", "kary-prefix", capacity=256, fields=derive.SCHEMAS["cartpole"],
                                 batch=16)
    call(1)
    target = workloads.variant_target("binary", 64, FIELDS, np.random.default_rng(0), batch=8)
    workloads.fill(target, 64, FIELDS, np.random.default_rng(1))
    first = target.sample(8)
    assert target.sample(8) is first  # the same SampleOut, refilled
    assert set(target.sample_indices(8)) == {"indices", "weights"}
    with pytest.raises(ValueError, match="needs a buffer that samples without fields"):
        no_indices_only = workloads.Target(target.buffer, target.add, target.sample, target.update, "indices",
                                           target.fill_add)  # as a peer's target: no sample_indices
        workloads.make_call("sample_indices", no_indices_only, capacity=64, fields=FIELDS, batch=8, mixed_adds=1,
                            rng=np.random.default_rng(0))



def test_workload_sample_draws_what_the_buffer_draws():
    """The micro workload's sample (a positional call into reused outputs) returns what
    ``buffer.sample(n, rng=..., out=...)`` returns from the same seed, fields and indices-only."""
    from replaybench.bench import workloads

    target = workloads.variant_target("kary-prefix", 64, FIELDS, np.random.default_rng(5), batch=8)
    workloads.fill(target, 64, FIELDS, np.random.default_rng(1))
    buf, rng = target.buffer, np.random.default_rng(5)
    for draw, fields in ((target.sample, True), (target.sample_indices, False), (target.sample, True)):
        got = {k: v.copy() for k, v in draw(8).items()}
        want = buf.sample(8, rng=rng, out=buf.sample_out(8, fields=fields))
        assert got.keys() == want.keys()
        for key in got:
            np.testing.assert_array_equal(got[key], want[key])

@pytest.mark.slow
def test_gil_share_method_measures_a_share():
    """bench.workloads.gil_share: both timings positive, the kernel alone not slower than the
    whole call by more than noise, the share in [0, 1] (compiles a loop: slow)."""
    from replaybench.bench.workloads import gil_share

    r = gil_share("kary-prefix", 1024, batch=64, calls=50, repeats=3, prefetch=True)
    assert r["call_s"] > 0 and r["kernel_s"] > 0
    assert 0.0 <= r["gil_share"] <= 1.0
    assert r["params"] == {"prefetch": True}


def test_time_threads_runs_every_call_in_its_own_thread_and_raises_their_errors():
    from replaybench.bench.workloads import time_threads

    seen = {}

    def recorder(name):
        def call(i):
            seen.setdefault(name, []).append((i, threading.get_ident()))
        return call

    assert time_threads([recorder("a"), recorder("b")], 5) >= 0.0
    assert [i for i, _ in seen["a"]] == [0, 1, 2, 3, 4] == [i for i, _ in seen["b"]]
    assert seen["a"][0][1] != seen["b"][0][1] != threading.get_ident()

    def failing(i):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        time_threads([recorder("c"), failing], 3)
    assert len(seen["c"]) == 3  # the other thread ran to its end first
