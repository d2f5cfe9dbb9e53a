"""Replay-buffer behaviour of every registered variant: ring writes, FIFO eviction, data
round trips, new-item priorities and priority updates, at awkward capacities.

What only the buffer class does (slots returned by add, same-kind casts, empty batches, field
shapes) is tested once per buffer class (``BUFFER_CLASS_VARIANTS``); what goes through a
variant's tree (reachability of every slot after wrap-around, priorities) per variant."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from replaybench.impl import registry

from conftest import CARTPOLE_FIELDS, make_batch
from _support import ALL_VARIANTS, BUFFER_CLASS_VARIANTS, TREE_VARIANTS, dtype_kw, prioritized_with_dtypes, takes_param

ID_FIELDS = {"id": ((), "int64"), "obs": ((3,), "float32")}


def id_batch(start, n):
    ids = np.arange(start, start + n, dtype=np.int64)
    return {"id": ids, "obs": np.stack([ids, -ids, ids * 0.5], axis=1).astype(np.float32)}


def check_sample(out, buf, fields, batch_size):
    """Structure of a sample: every field with the schema's shape and dtype, int64 indices
    inside the stored range, float32 weights in (0, 1]."""
    assert set(out) == set(fields) | {"indices", "weights"}
    for name, (shape, dtype) in fields.items():
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        assert out[name].shape == (batch_size, *shape), name
        assert out[name].dtype == np.dtype(dtype), name
    assert out["indices"].dtype == np.int64 and out["indices"].shape == (batch_size,)
    assert ((out["indices"] >= 0) & (out["indices"] < len(buf))).all()
    assert out["weights"].dtype == np.float32 and out["weights"].shape == (batch_size,)
    assert ((out["weights"] > 0) & (out["weights"] <= 1.0 + 1e-6)).all()


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_registry_create_basics(name):
    buf = registry.create(name, capacity=10, fields=CARTPOLE_FIELDS)
    assert len(buf) == 0
    assert buf.capacity == 10


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_sampled_data_matches_stored_rows(name, rng):
    capacity = 100
    buf = registry.create(name, capacity=capacity, fields=CARTPOLE_FIELDS)
    stored = {k: [] for k in CARTPOLE_FIELDS}
    for n in (7, 30, 1, 62):  # 100 rows in four uneven batches
        batch = make_batch(n, rng)
        buf.add(batch)
        for k in batch:
            stored[k].append(batch[k])
    stored = {k: np.concatenate(v) for k, v in stored.items()}
    assert len(buf) == capacity
    out = buf.sample(500, rng=rng)
    check_sample(out, buf, CARTPOLE_FIELDS, 500)
    for k in CARTPOLE_FIELDS:
        np.testing.assert_array_equal(out[k], stored[k][out["indices"]], err_msg=k)
    # The sample is a copy: writing to it does not change the buffer.
    before = buf.sample(5, rng=np.random.default_rng(1))
    before["obs"][:] = 1e9
    again = buf.sample(5, rng=np.random.default_rng(1))
    assert (again["obs"] != 1e9).all()


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_add_returns_ring_slots_and_casts_same_kind(name):
    buf = registry.create(name, capacity=5, fields=ID_FIELDS)
    np.testing.assert_array_equal(buf.add(id_batch(0, 3)), [0, 1, 2])
    np.testing.assert_array_equal(buf.add(id_batch(3, 4)), [3, 4, 0, 1])
    # float64 observations are stored as float32, int32 ids as int64 (same-kind casts).
    batch = {"id": np.array([7], dtype=np.int32), "obs": np.array([[0.1, 0.2, 0.3]], dtype=np.float64)}
    np.testing.assert_array_equal(buf.add(batch), [2])
    out = buf.sample(200, rng=np.random.default_rng(0))
    row = out["indices"] == 2
    assert row.any()
    np.testing.assert_array_equal(out["id"][row], 7)
    np.testing.assert_array_equal(out["obs"][row], np.float32([[0.1, 0.2, 0.3]]).repeat(row.sum(), 0))


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_capacity_one(name):
    buf = registry.create(name, capacity=1, fields=ID_FIELDS)
    buf.add(id_batch(0, 1))
    out = buf.sample(5, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(out["indices"], 0)
    np.testing.assert_array_equal(out["id"], 0)
    np.testing.assert_array_equal(out["weights"], 1.0)
    buf.add(id_batch(1, 1))
    assert len(buf) == 1
    np.testing.assert_array_equal(buf.sample(5, rng=np.random.default_rng(0))["id"], 1)
    buf.add(id_batch(2, 3))  # more rows than capacity: the last one stays
    np.testing.assert_array_equal(buf.sample(5, rng=np.random.default_rng(0))["id"], 4)
    buf.update_priorities([0], [3.0])
    np.testing.assert_array_equal(buf.sample(5, rng=np.random.default_rng(0))["id"], 4)


def _capacities(name):
    """Capacities that are not powers of the variant's K (and a few that are K**D +- 1)."""
    caps = [3, 17, 100, 257]
    K = registry.get(name).params.get("K")
    if K:
        caps += [K + 1, K * K - 1, K * K + 1]
    return sorted(set(caps))


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_capacities_that_are_not_powers_of_k(name):
    for capacity in _capacities(name):
        buf = registry.create(name, capacity=capacity, fields=ID_FIELDS)
        buf.add(id_batch(0, capacity + 5))  # wraps by 5
        assert len(buf) == capacity
        out = buf.sample(20 * capacity, rng=np.random.default_rng(capacity))
        assert out["indices"].max() < capacity
        # Every stored row is reachable, including the ones in the last, partial leaf group.
        assert set(out["id"].tolist()) == set(range(5, capacity + 5)), capacity
        np.testing.assert_array_equal(out["id"] % capacity, out["indices"])


@pytest.mark.parametrize("K", [2, 3, 5, 16, 64])
@pytest.mark.parametrize("name", [n for n in TREE_VARIANTS if takes_param(n, "K")])
def test_k_parameter(name, K):
    try:
        buf = registry.create(name, capacity=70, fields=ID_FIELDS, K=K)
    except ValueError as err:  # a layout may refuse some K, saying which and why
        assert "K must be" in str(err) and repr(K) in str(err)
        return
    assert buf.tree.K == K
    buf2 = registry.create(name, capacity=70, fields=ID_FIELDS, K=K, eps=0.0, alpha=1.0)
    buf2.add(id_batch(0, 70), priorities=np.arange(70.0))  # id 0 has priority 0
    out = buf2.sample(5000, rng=np.random.default_rng(K))
    assert 0 not in out["id"]
    assert set(out["id"].tolist()) >= {1, 69}
    np.testing.assert_array_equal(out["id"], out["indices"])


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_batch_larger_than_stored_items(name):
    buf = registry.create(name, capacity=50, fields=ID_FIELDS)
    buf.add(id_batch(0, 3))
    out = buf.sample(1000, rng=np.random.default_rng(3))
    check_sample(out, buf, ID_FIELDS, 1000)
    assert set(out["indices"].tolist()) == {0, 1, 2}  # with replacement, each item seen
    np.testing.assert_array_equal(out["id"], out["indices"])


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_wraparound_evicts_oldest_first(name):
    capacity = 10
    buf = registry.create(name, capacity=capacity, fields=ID_FIELDS)
    added = 0
    for n in (4, 3, 5, 1, 9, 2, 6):  # crosses the end of the ring several times
        slots = buf.add(id_batch(added, n))
        np.testing.assert_array_equal(slots, (added + np.arange(n)) % capacity)
        added += n
        assert len(buf) == min(added, capacity)
        out = buf.sample(3000, rng=np.random.default_rng(added))
        want = set(range(max(0, added - capacity), added))  # the newest `capacity` ids
        assert set(out["id"].tolist()) == want, (added, sorted(set(out["id"].tolist())))
        np.testing.assert_array_equal(out["id"] % capacity, out["indices"])
        np.testing.assert_array_equal(out["obs"][:, 1], -out["id"].astype(np.float32))
    # Storage holds id k at slot k % capacity.
    col = buf.storage.columns["id"]
    np.testing.assert_array_equal(np.sort(col), np.arange(added - capacity, added))
    np.testing.assert_array_equal(col % capacity, np.arange(capacity))


@pytest.mark.parametrize("start", [0, 3])
@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_add_larger_than_capacity_keeps_last_rows(name, start):
    capacity = 10
    buf = registry.create(name, capacity=capacity, fields=ID_FIELDS)
    if start:
        buf.add(id_batch(0, start))
    slots = buf.add(id_batch(start, 25))  # ids start .. start+24: keep the last ten
    assert len(buf) == capacity
    total = start + 25
    np.testing.assert_array_equal(slots, (np.arange(total - capacity, total)) % capacity)
    out = buf.sample(3000, rng=np.random.default_rng(1))
    assert set(out["id"].tolist()) == set(range(total - capacity, total))
    np.testing.assert_array_equal(out["id"] % capacity, out["indices"])
    # As if added one by one: the next add evicts the oldest kept row first.
    buf.add(id_batch(total, 1))
    out = buf.sample(3000, rng=np.random.default_rng(2))
    assert set(out["id"].tolist()) == set(range(total - capacity + 1, total + 1))


@pytest.mark.parametrize("name,dtype", prioritized_with_dtypes(TREE_VARIANTS))
def test_add_larger_than_capacity_keeps_last_priorities(name, dtype):
    capacity = 10
    buf = registry.create(name, capacity=capacity, fields=ID_FIELDS, alpha=1.0, eps=0.0, **dtype_kw(dtype))
    buf.add(id_batch(0, 3), priorities=np.ones(3))
    prios = np.arange(1.0, 26.0)  # id k (k = 3 .. 27) gets priority k - 2
    slots = buf.add(id_batch(3, 25), priorities=prios)
    np.testing.assert_array_equal(buf.tree.get(slots), prios[-capacity:])
    leaves = buf.tree.leaves()[:capacity]
    ids = buf.storage.columns["id"]
    np.testing.assert_array_equal(leaves, ids - 2.0)
    # Whether dropped rows count towards the max priority is not specified; kept ones do.
    assert buf.max_priority >= prios[-1]


@pytest.mark.parametrize("name,dtype", prioritized_with_dtypes(TREE_VARIANTS))
def test_new_items_get_max_priority(name, dtype):
    alpha, eps = 0.5, 0.01
    buf = registry.create(name, capacity=8, fields=ID_FIELDS, alpha=alpha, eps=eps, **dtype_kw(dtype))
    rtol = 1e-6 if buf.tree.dtype == np.float32 else 1e-12

    def leaf(slot):
        return buf.tree.get([slot])[0]

    buf.add(id_batch(0, 1))  # nothing seen yet: priority 1
    assert leaf(0) == 1.0
    buf.add(id_batch(1, 3), priorities=[1.0, 5.0, 2.0])
    p5 = (5.0 + eps) ** alpha
    assert leaf(2) == pytest.approx(p5, rel=rtol)
    buf.add(id_batch(4, 1))  # no priority given: the largest seen
    assert leaf(4) == pytest.approx(p5, rel=rtol)
    buf.update_priorities([0], [10.0])
    buf.add(id_batch(5, 1))
    p10 = (10.0 + eps) ** alpha
    assert leaf(5) == pytest.approx(p10, rel=rtol)
    # Lowering priorities does not lower the priority of new items (largest ever set).
    buf.update_priorities(np.arange(6), np.full(6, 0.1))
    buf.add(id_batch(6, 2))
    assert leaf(6) == pytest.approx(p10, rel=rtol) and leaf(7) == pytest.approx(p10, rel=rtol)
    # Wrap-around: overwritten slots get the max priority too, not their old value.
    buf.update_priorities([0], [0.0])
    buf.add(id_batch(8, 1))
    assert leaf(0) == pytest.approx(p10, rel=rtol)


@pytest.mark.parametrize("name", TREE_VARIANTS)
def test_update_priorities_from_td_errors(name):
    capacity = 20
    buf = registry.create(name, capacity=capacity, fields=ID_FIELDS, alpha=0.6, eps=1e-6)
    buf.add(id_batch(0, capacity))
    rng = np.random.default_rng(8)
    counts = np.bincount(buf.sample(20000, rng=rng)["indices"], minlength=capacity)
    assert chisquare(counts).pvalue > 1e-3  # all new items share the max priority
    td = rng.normal(0, 1, capacity)
    td[5] = 8.0  # a large TD error
    td[9] = 0.0  # a perfectly predicted transition keeps only eps
    buf.update_priorities(np.arange(capacity), np.abs(td))
    want = (np.abs(td) + 1e-6) ** 0.6
    np.testing.assert_allclose(buf.tree.leaves()[:capacity], want, rtol=1e-6)
    out = buf.sample(20000, rng=rng)
    counts = np.bincount(out["indices"], minlength=capacity)
    assert counts.argmax() == 5
    assert counts[9] < 20  # P(9) ~ 4e-5
    assert chisquare(counts, want / want.sum() * counts.sum()).pvalue > 1e-3
    # Updating a subset with duplicates: the last value wins.
    buf.update_priorities([3, 3, 4], [100.0, 0.5, 0.5])
    np.testing.assert_allclose(buf.tree.get([3, 4]), (0.5 + 1e-6) ** 0.6, rtol=1e-6)


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_update_priorities_accepts_sampled_indices(name):
    """The usual learner loop: sample, compute TD errors, write them back."""
    buf = registry.create(name, capacity=64, fields=CARTPOLE_FIELDS)
    rng = np.random.default_rng(0)
    for _ in range(5):
        buf.add(make_batch(20, rng))
        out = buf.sample(32, rng=rng)
        buf.update_priorities(out["indices"], rng.random(32))
    assert len(buf) == 64


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_seeded_buffers_are_reproducible(name):
    def run():
        buf = registry.create(name, capacity=30, fields=ID_FIELDS, seed=5)
        buf.add(id_batch(0, 30))
        return buf.sample(50)["indices"]

    np.testing.assert_array_equal(run(), run())


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_scalar_and_empty_fields(name):
    fields = {"a": ((), "float64"), "b": ((2, 3), "int16"), "flag": ((), "bool"), "nothing": ((0,), "float32")}
    buf = registry.create(name, capacity=6, fields=fields)
    rng = np.random.default_rng(0)
    batch = make_batch(9, rng, fields)
    buf.add(batch)
    out = buf.sample(40, rng=rng)
    check_sample(out, buf, fields, 40)
    for k in ("a", "b", "flag"):
        np.testing.assert_array_equal(out[k], batch[k][3:][(out["indices"] - 3) % 6], err_msg=k)


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_empty_batch_is_a_no_op(name):
    buf = registry.create(name, capacity=4, fields=ID_FIELDS)
    buf.add(id_batch(0, 2))
    slots = buf.add(id_batch(2, 0))
    assert slots.size == 0 and len(buf) == 2
    np.testing.assert_array_equal(buf.add(id_batch(2, 1)), [2])


@pytest.mark.parametrize("name,dtype", prioritized_with_dtypes(TREE_VARIANTS))
def test_scalar_priority_and_list_input(name, dtype):
    """A scalar priority applies to every row; fields may be given as nested lists."""
    buf = registry.create(name, capacity=6, fields=ID_FIELDS, alpha=1.0, eps=0.0, **dtype_kw(dtype))
    slots = buf.add({"id": [1, 2, 3], "obs": [[0, 0, 0], [1, 1, 1], [2, 2, 2]]}, priorities=2.5)
    np.testing.assert_array_equal(buf.tree.get(slots), 2.5)
    out = buf.sample(50, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(out["obs"][:, 0], out["id"] - 1)


@pytest.mark.parametrize("variant", ["kary-aligned", "uniform"])
def test_add_staged_stores_what_add_stores(variant):
    """add_staging / add_staged (rows kept across calls, filled in place): the same storage,
    priorities, ring position and length as add with the same rows, wrapping included; a staging
    of another buffer is refused, naming the argument."""
    from replaybench.impl import registry

    fields = {"obs": ((3,), np.float32), "action": ((), np.int64)}
    a, b = (registry.create(variant, capacity=5, fields=fields, seed=0) for _ in range(2))
    staging = b.add_staging(2)
    for i in range(4):   # 8 rows into 5 slots: wraps
        rows = {"obs": np.full((2, 3), i, np.float32), "action": np.array([i, -i])}
        a.add(rows)
        staging.arrays["obs"][...] = rows["obs"]
        staging.arrays["action"][...] = rows["action"]
        assert b.add_staged(staging) == (2 * i) % 5
    assert np.array_equal(a.storage.arena, b.storage.arena) and len(a) == len(b) == 5 and a._next == b._next
    if variant != "uniform":
        assert np.array_equal(a.tree.leaves(), b.tree.leaves())
    with pytest.raises(ValueError, match="staging must come from this buffer's add_staging"):
        a.add_staged(staging)
    with pytest.raises(ValueError, match="n must be a positive integer, got 0"):
        a.add_staging(0)


def test_plain_rows_is_what_the_checks_and_as_bytes_give():
    """Storage.plain_rows (add's one-pass path) returns for a plain batch exactly the bytes of
    check_batch + as_bytes, and None for every other form, so add's checks still see those
    (and raise their errors)."""
    from replaybench.impl.storage import make_storage, random_batch

    fields = {"obs": ((4,), "float32"), "action": ((), "int64"), "done": ((), "bool"), "none": ((0,), "float32")}
    rng = np.random.default_rng(0)
    for layout in ("columns", "rows"):
        st = make_storage(layout, 16, fields)
        batch = random_batch(fields, 3, rng)
        rows, n = st.plain_rows(batch)
        arrays, want_n = st.check_batch(batch)
        want = st.as_bytes(arrays, 0, want_n)
        assert n == want_n == 3 and len(rows) == len(want)
        for got_field, want_field in zip(rows, want):
            assert got_field.dtype == np.uint8
            np.testing.assert_array_equal(got_field, want_field)
        read_only = {k: v.copy() for k, v in batch.items()}
        read_only["obs"].flags.writeable = False
        others = [
            [batch],  # not a dict
            {**batch, "extra": batch["done"]},
            {k: v for k, v in batch.items() if k != "done"},
            {**batch, "obs": batch["obs"].astype(np.float64)},  # castable, not the dtype
            {**batch, "action": batch["action"].tolist()},  # not an array
            {**batch, "obs": np.asfortranarray(np.ones((3, 4), np.float32))[:, ::1][::-1]},  # not contiguous
            read_only,
            {**batch, "done": batch["done"][:2]},  # rows differ
            {**batch, "action": np.int64(1)},  # 0-d
            {**batch, "obs": batch["obs"].reshape(3, 2, 2)},
            random_batch(fields, 0, rng),  # no rows: the general path's no-op
        ]
        for other in others:
            assert st.plain_rows(other) is None, other


def test_small_rows_lie_in_one_cache_line_each():
    """Rows storage pads a row that fits in a line to a power of two (row_stride), so every
    row of a line-aligned arena lies in one line and a gather misses one line per row; longer
    rows are padded to their largest item only. The stored values are unchanged."""
    from replaybench.impl.storage import make_storage, random_batch, row_stride

    assert [row_stride(n, 1) for n in (1, 3, 33, 45, 64, 65, 100)] == [1, 4, 64, 64, 64, 65, 100]
    assert row_stride(45, 8) == 64 and row_stride(12, 4) == 16 and row_stride(72, 8) == 72 and row_stride(70, 8) == 72
    packed = make_storage("rows-packed", 16, CARTPOLE_FIELDS)
    assert set(packed.table[:, 1]) == {48}  # 45 bytes to a multiple of 8 only: what the padding is measured against
    st = make_storage("rows", 64, CARTPOLE_FIELDS)
    assert set(st.table[:, 1]) == {64} and st.arena.ctypes.data % 64 == 0
    ends = st.table[:, 0] + st.table[:, 2]
    assert ends.max() <= 64  # every field of row i within bytes 64 i .. 64 i + 63
    batch = random_batch(CARTPOLE_FIELDS, 64, np.random.default_rng(1))
    st.write(0, st.check_batch(batch)[0], 64)
    got = st.gather(np.arange(63, -1, -1))
    for name, column in batch.items():
        np.testing.assert_array_equal(got[name], column[::-1])


def test_hugepages_are_granted_where_the_kernel_offers_them():
    """hugepages=True really puts the arena on transparent huge pages where THP is not
    ``never``: the mapping must be private (an anonymous shared mapping is shmem, whose huge
    pages follow shmem_enabled, ``never`` on most machines, so the advice did nothing)."""
    import re
    from pathlib import Path

    from replaybench.impl.trees.layouts import aligned_empty

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[never]" in thp.read_text():
        pytest.skip("no transparent huge pages on this machine")
    arr = aligned_empty(8 << 20, np.uint8, 1, hugepages=True)  # 8 MiB, every page written
    start = arr.ctypes.data
    assert start % (2 << 20) == 0
    huge_kb = 0
    text = Path("/proc/self/smaps").read_text()
    for head, body in re.findall(r"^([0-9a-f]+-[0-9a-f]+) .*?\n((?:[A-Z][^\n]*\n)+)", text, re.M):
        lo, hi = (int(x, 16) for x in head.split("-"))
        if lo <= start < hi:
            huge_kb = int(re.search(r"AnonHugePages:\s+(\d+) kB", body).group(1))
    assert huge_kb >= 2048, f"no huge page in the arena's mapping ({huge_kb} kB)"
