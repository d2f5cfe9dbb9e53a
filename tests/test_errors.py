"""Bad input is rejected with an error that names the argument and the value, and leaves the
buffer exactly as it was (length, stored rows, tree leaves, max priority, next ring slot)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from replaybench.impl import registry
from replaybench.impl.trees import AlignedKarySumTree, BinarySumTree, BlockedBinarySumTree, KarySumTree, ReferenceSumTree

from _support import ALL_VARIANTS, PRIORITIZED, assert_same_snapshot, snapshot, takes_param

FIELDS = {
    "id": ((), "int64"),
    "obs": ((4,), "float32"),
    "done": ((), "bool"),
}
CAPACITY = 8


def rows(start, n):
    ids = np.arange(start, start + n, dtype=np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 4, axis=1).astype(np.float32),
            "done": ids % 2 == 0}


def fresh(name):
    """A buffer holding 5 of 8 rows with distinct priorities (prioritized variants)."""
    buf = registry.create(name, capacity=CAPACITY, fields=FIELDS)
    buf.add(rows(0, 3), priorities=[0.5, 2.0, 1.0])
    buf.add(rows(3, 2))
    return buf


def expect_unchanged(name, buf, before):
    """The buffer equals its snapshot, and behaves like an untouched twin afterwards."""
    assert_same_snapshot(before, snapshot(buf))
    twin = fresh(name)
    assert_same_snapshot(snapshot(twin), snapshot(buf))
    np.testing.assert_array_equal(buf.add(rows(100, 4)), twin.add(rows(100, 4)))
    assert_same_snapshot(snapshot(twin), snapshot(buf))


def rejects(name, exc, pattern, call):
    """``call(buf)`` on a fresh buffer raises ``exc`` matching ``pattern``; nothing changes."""
    buf = fresh(name)
    before = snapshot(buf)
    with pytest.raises(exc, match=pattern):
        call(buf)
    expect_unchanged(name, buf, before)


BAD_VALUES = [
    (math.nan, r"= nan is not finite"),
    (math.inf, r"= inf is not finite"),
    (-math.inf, r"= -inf is not finite"),
    (-1.0, r"= -1\.0 is negative"),
    (-1e-300, r"= -1e-300 is negative"),
]


# --------------------------------------------------------------------------------------------
# Priorities
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,message", BAD_VALUES)
@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_add_rejects_bad_priorities(name, value, message):
    rejects(name, ValueError, r"priorities\[2\] " + message,
            lambda buf: buf.add(rows(10, 3), priorities=[1.0, 2.0, value]))


@pytest.mark.parametrize("value,message", BAD_VALUES[:1] + BAD_VALUES[3:4])
@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_add_rejects_bad_priorities_in_dropped_rows(name, value, message):
    """Rows beyond capacity are dropped, but their priorities are still validated."""
    prios = np.ones(CAPACITY + 4)
    prios[1] = value
    rejects(name, ValueError, r"priorities\[1\] " + message,
            lambda buf: buf.add(rows(10, CAPACITY + 4), priorities=prios))


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_add_rejects_malformed_priorities(name):
    rejects(name, ValueError, r"priorities must have shape \(3,\).*got \(2,\)",
            lambda buf: buf.add(rows(10, 3), priorities=[1.0, 2.0]))
    rejects(name, TypeError, r"priorities must be numbers, got dtype <U",
            lambda buf: buf.add(rows(10, 3), priorities=["1", "2", "3"]))


@pytest.mark.parametrize("value,message", BAD_VALUES)
@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_update_priorities_rejects_bad_priorities(name, value, message):
    rejects(name, ValueError, r"priorities\[1\] " + message,
            lambda buf: buf.update_priorities([0, 4, 2], [3.0, value, 3.0]))


@pytest.mark.parametrize("name", [n for n in PRIORITIZED if takes_param(n, "dtype")])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_priorities_the_tree_cannot_hold_are_rejected(name, dtype):
    """A finite priority whose (p + eps) ** alpha would overflow the sums is refused."""
    def make():
        buf = registry.create(name, capacity=CAPACITY, fields=FIELDS, alpha=1.0, dtype=dtype)
        buf.add(rows(0, 5))
        return buf

    for call in (lambda buf: buf.update_priorities([0, 4, 2], [3.0, 1e308, 3.0]),
                 lambda buf: buf.add(rows(10, 3), priorities=[1.0, 1e308, 2.0])):
        buf = make()
        before = snapshot(buf)
        with pytest.raises(ValueError, match=r"priorities\[1\] = 1e\+308 is too large"):
            call(buf)
        assert_same_snapshot(before, snapshot(buf))
        assert np.isfinite(buf.tree.total())


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_first_bad_entry_in_batch_order_is_reported(name):
    """A bad value before a bad index is what the error names, for every variant alike."""
    rejects(name, ValueError, r"priorities\[1\] = nan is not finite",
            lambda buf: buf.update_priorities([0, 1, 1000], [1.0, math.nan, 1.0]))
    rejects(name, IndexError, r"indices\[1\] = 1000 is out of range",
            lambda buf: buf.update_priorities([0, 1000, 1], [1.0, 1.0, math.nan]))


@pytest.mark.parametrize("index", [5, 7, 8, 1000, -1, -8])
@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_update_priorities_rejects_indices_out_of_range(name, index):
    """Valid indices are 0 .. len-1 (5 rows stored), not 0 .. capacity-1."""
    rejects(name, IndexError, rf"indices\[2\] = {index} is out of range.*0 \.\. 4",
            lambda buf: buf.update_priorities([0, 1, index], [3.0, 3.0, 3.0]))


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_update_priorities_on_empty_buffer(name):
    buf = registry.create(name, capacity=CAPACITY, fields=FIELDS)
    with pytest.raises(IndexError, match=r"indices\[0\] = 0 is out of range: nothing is stored"):
        buf.update_priorities([0], [1.0])
    assert len(buf) == 0


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_update_priorities_rejects_malformed_input(name):
    rejects(name, TypeError, r"indices must be integers, got dtype float64",
            lambda buf: buf.update_priorities(np.array([0.0, 1.0]), [1.0, 1.0]))
    rejects(name, TypeError, r"indices must be integers, got dtype bool",
            lambda buf: buf.update_priorities(np.array([True, False]), [1.0, 1.0]))
    rejects(name, ValueError, r"indices must be 1-D, got shape \(1, 2\)",
            lambda buf: buf.update_priorities(np.array([[0, 1]]), [1.0, 1.0]))
    rejects(name, ValueError, r"priorities must have shape \(2,\).*got \(3,\)",
            lambda buf: buf.update_priorities([0, 1], [1.0, 1.0, 1.0]))
    rejects(name, TypeError, r"priorities must be numbers, got dtype <U",
            lambda buf: buf.update_priorities([0, 1], ["a", "b"]))


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_valid_edge_inputs_are_accepted(name):
    """Not errors: the last stored index, zero priorities, a scalar priority, no indices."""
    buf = fresh(name)
    buf.update_priorities([4], [0.0])
    buf.update_priorities([0, 1, 2], 2.5)
    buf.update_priorities(np.array([], dtype=np.int64), np.array([]))
    buf.update_priorities(np.uint8(3), [1.0])


# --------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------


def _bad_batches():
    def without(key):
        b = rows(10, 3)
        del b[key]
        return b

    def with_(**kw):
        b = rows(10, 3)
        b.update(kw)
        return b

    return [
        ("missing", without("done"), KeyError, r"missing \['done'\], unknown \[\]"),
        ("extra", with_(reward=np.zeros(3)), KeyError, r"missing \[\], unknown \['reward'\]"),
        ("renamed", {**without("obs"), "observation": np.zeros((3, 4))}, KeyError,
         r"missing \['obs'\], unknown \['observation'\]"),
        ("shape", with_(obs=np.zeros((3, 5), np.float32)), ValueError,
         r"batch\['obs'\] has shape \(3, 5\); expected \(n, \*\(4,\)\)"),
        ("no-batch-axis", with_(id=np.int64(3)), ValueError, r"batch\['id'\] has shape \(\)"),
        ("extra-axis", with_(done=np.zeros((3, 1), bool)), ValueError, r"batch\['done'\] has shape \(3, 1\)"),
        ("rows", with_(done=np.zeros(2, bool)), ValueError, r"batch\['done'\] has 2 rows but other fields have 3"),
        ("float-into-int", with_(id=np.array([1.0, 2.0, 3.0])), TypeError,
         r"batch\['id'\] has dtype float64, which cannot be stored as int64"),
        ("strings", with_(obs=np.full((3, 4), "x")), TypeError,
         r"batch\['obs'\] has dtype <U1, which cannot be stored as float32"),
        ("complex", with_(obs=np.zeros((3, 4), complex)), TypeError,
         r"batch\['obs'\] has dtype complex128, which cannot be stored as float32"),
        ("int-into-bool", with_(done=np.array([0, 1, 0])), TypeError,
         r"batch\['done'\] has dtype int64, which cannot be stored as bool"),
        ("objects", with_(id=np.array([1, "a", None], dtype=object)), TypeError, r"batch\['id'\] has dtype object"),
    ]


BAD_BATCHES = _bad_batches()


@pytest.mark.parametrize("case", BAD_BATCHES, ids=[c[0] for c in BAD_BATCHES])
@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_add_rejects_bad_batches(name, case):
    _, batch, exc, pattern = case
    rejects(name, exc, pattern, lambda buf: buf.add(batch))
    rejects(name, exc, pattern, lambda buf: buf.add(batch, priorities=[1.0, 1.0, 1.0]))


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_add_rejects_non_dict(name):
    rejects(name, TypeError, r"batch must be a dict of field arrays, got list",
            lambda buf: buf.add([rows(10, 1)]))


# --------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_sampling_an_empty_buffer(name):
    buf = registry.create(name, capacity=CAPACITY, fields=FIELDS)
    with pytest.raises(ValueError, match=r"cannot sample from an empty buffer"):
        buf.sample(4)
    assert len(buf) == 0


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, True, "4", None])
@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_sample_rejects_bad_batch_size(name, batch_size):
    rejects(name, ValueError, rf"batch_size must be a positive integer, got {re.escape(repr(batch_size))}",
            lambda buf: buf.sample(batch_size))


@pytest.mark.parametrize("beta", [-0.1, 1.5, math.nan, math.inf, "0.4", True])
@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_sample_rejects_beta_out_of_range(name, beta):
    rejects(name, ValueError, rf"beta must be a number in \[0\.0, 1\.0\], got {re.escape(repr(beta))}",
            lambda buf: buf.sample(4, beta=beta))


@pytest.mark.parametrize("beta", [0, 0.0, 1, 1.0, np.float32(0.5)])
@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_sample_accepts_beta_bounds(name, beta):
    assert fresh(name).sample(4, beta=beta)["weights"].shape == (4,)


# --------------------------------------------------------------------------------------------
# registry.create
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [0, -3, 2.5, "10", None, True, np.float64(4.0)])
@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_create_rejects_bad_capacity(name, capacity):
    with pytest.raises(ValueError, match=rf"capacity must be a positive integer, got {re.escape(repr(capacity))}"):
        registry.create(name, capacity=capacity, fields=FIELDS)


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_create_accepts_numpy_integer_capacity(name):
    assert registry.create(name, capacity=np.int64(5), fields=FIELDS).capacity == 5


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_create_rejects_unknown_parameter(name):
    with pytest.raises(TypeError, match=r"foo"):
        registry.create(name, capacity=CAPACITY, fields=FIELDS, foo=1)


@pytest.mark.parametrize("name", [n for n in PRIORITIZED if not takes_param(n, "K")])
def test_create_rejects_k_for_variants_without_it(name):
    with pytest.raises(TypeError, match=rf"variant '{name}' does not take parameter\(s\) \['K'\]"):
        registry.create(name, capacity=CAPACITY, fields=FIELDS, K=4)


def test_create_rejects_unknown_variant():
    with pytest.raises(KeyError, match=r"unknown variant 'no-such-variant'.*binary"):
        registry.create("no-such-variant", capacity=CAPACITY, fields=FIELDS)


@pytest.mark.parametrize("K", [1, 0, -2, 65, 128, 16.0, True, "16"])
@pytest.mark.parametrize("name", [n for n in PRIORITIZED if takes_param(n, "K")])
def test_create_rejects_k_out_of_range(name, K):
    with pytest.raises(ValueError, match=rf"K must be an integer from 2 to \d+, got {re.escape(repr(K))}"):
        registry.create(name, capacity=CAPACITY, fields=FIELDS, K=K)


@pytest.mark.parametrize("K", [3, 6, 12, 24, 63])
def test_create_rejects_k_not_power_of_two_for_aligned(K):
    with pytest.raises(ValueError, match=rf"K must be a power of 2.*got {K}\b"):
        registry.create("kary-aligned", capacity=CAPACITY, fields=FIELDS, K=K)
    # The unaligned K-ary tree takes any K.
    assert registry.create("kary", capacity=CAPACITY, fields=FIELDS, K=K).tree.K == K


@pytest.mark.parametrize("K", [2, 4, 32, 64])
def test_create_accepts_power_of_two_k_for_aligned(K):
    assert registry.create("kary-aligned", capacity=CAPACITY, fields=FIELDS, K=K).tree.K == K


@pytest.mark.parametrize("dtype", ["float16", "int32", "double precision", np.int64])
@pytest.mark.parametrize("name", [n for n in PRIORITIZED if takes_param(n, "dtype")])
def test_create_rejects_bad_tree_dtype(name, dtype):
    with pytest.raises(ValueError, match=rf"dtype must be 'float32' or 'float64', got {re.escape(repr(dtype))}"):
        registry.create(name, capacity=CAPACITY, fields=FIELDS, dtype=dtype)


@pytest.mark.parametrize("param,value,pattern", [
    ("alpha", -0.5, r"alpha must be a number in \[0\.0, inf\], got -0\.5"),
    ("alpha", math.nan, r"alpha must be a number .*got nan"),
    ("eps", -1e-3, r"eps must be a number in \[0\.0, inf\], got -0\.001"),
    ("beta", 1.2, r"beta must be a number in \[0\.0, 1\.0\], got 1\.2"),
    ("beta", "0.4", r"beta must be a number .*got '0\.4'"),
])
@pytest.mark.parametrize("name", PRIORITIZED)
def test_create_rejects_bad_buffer_parameters(name, param, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        registry.create(name, capacity=CAPACITY, fields=FIELDS, **{param: value})


@pytest.mark.parametrize("fields,pattern", [
    ({}, r"fields must be a non-empty dict"),
    ([("obs", ((4,), "float32"))], r"fields must be a non-empty dict"),
    ({"indices": ((), "int64")}, r"field name 'indices' is reserved"),
    ({"weights": ((), "float32")}, r"field name 'weights' is reserved"),
    ({"not an id": ((), "int64")}, r"field name must be an identifier string, got 'not an id'"),
    ({"obs": "float32"}, r"fields\['obs'\] must be \(shape, dtype\)"),
    ({"obs": ((4,), "no-such-dtype")}, r"fields\['obs'\] must be \(shape, dtype\)"),
    ({"obs": ((4,), "U5")}, r"fields\['obs'\] = .*dtype numeric or bool"),
    ({"obs": ((4,), object)}, r"fields\['obs'\] = .*dtype numeric or bool"),
    ({"obs": ((-1,), "float32")}, r"fields\['obs'\] = .*shape must be non-negative"),
])
@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_create_rejects_bad_fields(name, fields, pattern):
    with pytest.raises(ValueError, match=pattern):
        registry.create(name, capacity=CAPACITY, fields=fields)


# --------------------------------------------------------------------------------------------
# Tree constructors (the trees are public too)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [BinarySumTree, BlockedBinarySumTree, KarySumTree, AlignedKarySumTree,
                                 ReferenceSumTree])
@pytest.mark.parametrize("capacity", [0, -1, 1.5, "8", None, False])
def test_tree_rejects_bad_capacity(cls, capacity):
    with pytest.raises(ValueError, match=rf"capacity must be a positive integer, got {re.escape(repr(capacity))}"):
        cls(capacity)


@pytest.mark.parametrize("cls", [BinarySumTree, BlockedBinarySumTree, KarySumTree, AlignedKarySumTree])
def test_tree_rejects_bad_dtype_and_resum(cls):
    with pytest.raises(ValueError, match=r"dtype must be 'float32' or 'float64', got 'float16'"):
        cls(8, dtype="float16")
    with pytest.raises(ValueError, match=r"resum_every must be >= 1, got -5"):
        cls(8, resum_every=-5)


def test_tree_k_checks():
    with pytest.raises(ValueError, match=r"K must be an integer from 2 to 64, got 1\b"):
        KarySumTree(8, K=1)
    with pytest.raises(ValueError, match=r"K must be an integer from 2 to 64, got 65\b"):
        AlignedKarySumTree(8, K=65)
    with pytest.raises(ValueError, match=r"K must be a power of 2.*got 6\b"):
        AlignedKarySumTree(8, K=6)
    assert KarySumTree(8, K=6).K == 6
