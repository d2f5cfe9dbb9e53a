"""Bad input is rejected with an error that names the argument and the value, and leaves the
buffer exactly as it was (length, stored rows, tree leaves, max priority, next ring slot).

Each check is tested once, where it lives:

* the buffer classes' own checks (batches, schema, capacity, sample arguments, sampler
  parameters, the priorities of written and of dropped rows) through one variant per buffer
  class (``BUFFER_CLASS_VARIANTS``): every variant built on a class runs that same code;
* the trees' input checks (indices, priorities, overflow, ``n_valid``), which differ per tree
  (each kernel set validates its own batch), for every tree, state compared before and after;
* what a variant declares itself (unknown parameters, K, dtype, capacity through its tree's
  constructor), per variant.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from replaybench.impl import registry
from replaybench.impl.buffers import check_buffer_params
from replaybench.impl.trees import (
    AlignedKarySumTree,
    BinarySumTree,
    BlockedBinarySumTree,
    KarySumTree,
    PrefixKarySumTree,
    ReferenceSumTree,
)

from _support import (
    ALL_VARIANTS,
    BUFFER_CLASS_VARIANTS,
    DTYPES,
    PRIORITIZED,
    TREE_FACTORIES,
    TREE_IDS,
    assert_same_snapshot,
    snapshot,
    takes_param,
)

FIELDS = {
    "id": ((), "int64"),
    "obs": ((4,), "float32"),
    "done": ((), "bool"),
}
CAPACITY = 8
#: The buffer classes that sample by priority (they take alpha, beta, eps, stratified).
PRIORITIZED_CLASS_VARIANTS = [n for n in BUFFER_CLASS_VARIANTS if n in PRIORITIZED]
ARRAY_TREE_CLASSES = [BinarySumTree, BlockedBinarySumTree, KarySumTree, AlignedKarySumTree, PrefixKarySumTree]


def rows(start, n):
    ids = np.arange(start, start + n, dtype=np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 4, axis=1).astype(np.float32),
            "done": ids % 2 == 0}


def fresh(name, **params):
    """A buffer holding 5 of 8 rows with distinct priorities (prioritized variants)."""
    buf = registry.create(name, capacity=CAPACITY, fields=FIELDS, **params)
    buf.add(rows(0, 3), priorities=[0.5, 2.0, 1.0])
    buf.add(rows(3, 2))
    return buf


def expect_unchanged(name, buf, before, **params):
    """The buffer equals its snapshot, and behaves like an untouched twin afterwards."""
    assert_same_snapshot(before, snapshot(buf))
    twin = fresh(name, **params)
    assert_same_snapshot(snapshot(twin), snapshot(buf))
    np.testing.assert_array_equal(buf.add(rows(100, 4)), twin.add(rows(100, 4)))
    assert_same_snapshot(snapshot(twin), snapshot(buf))


def rejects(name, exc, pattern, call, **params):
    """``call(buf)`` on a fresh buffer raises ``exc`` matching ``pattern``; nothing changes."""
    buf = fresh(name, **params)
    before = snapshot(buf)
    with pytest.raises(exc, match=pattern):
        call(buf)
    expect_unchanged(name, buf, before, **params)


BAD_VALUES = [
    (math.nan, r"= nan is not finite"),
    (math.inf, r"= inf is not finite"),
    (-math.inf, r"= -inf is not finite"),
    (-1.0, r"= -1\.0 is negative"),
    (-1e-300, r"= -1e-300 is negative"),
]


# --------------------------------------------------------------------------------------------
# Priorities given to a buffer (the buffer class's checks; the trees' own are below)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_add_rejects_bad_priorities(name):
    for value, message in BAD_VALUES:
        rejects(name, ValueError, r"priorities\[2\] " + message,
                lambda buf: buf.add(rows(10, 3), priorities=[1.0, 2.0, value]))


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_add_rejects_bad_priorities_in_dropped_rows(name):
    """Rows beyond capacity are dropped, but their priorities are still validated."""
    for value, message in BAD_VALUES[:1] + BAD_VALUES[3:4]:
        prios = np.ones(CAPACITY + 4)
        prios[1] = value
        rejects(name, ValueError, r"priorities\[1\] " + message,
                lambda buf: buf.add(rows(10, CAPACITY + 4), priorities=prios))


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_add_rejects_malformed_priorities(name):
    rejects(name, ValueError, r"priorities must have shape \(3,\).*got \(2,\)",
            lambda buf: buf.add(rows(10, 3), priorities=[1.0, 2.0]))
    rejects(name, TypeError, r"priorities must be numbers, got dtype <U",
            lambda buf: buf.add(rows(10, 3), priorities=["1", "2", "3"]))


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_update_priorities_rejects_bad_priorities(name):
    for value, message in BAD_VALUES:
        rejects(name, ValueError, r"priorities\[1\] " + message,
                lambda buf: buf.update_priorities([0, 4, 2], [3.0, value, 3.0]))


@pytest.mark.parametrize("name", [n for n in PRIORITIZED_CLASS_VARIANTS if takes_param(n, "dtype")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_priorities_the_tree_cannot_hold_are_rejected(name, dtype):
    """A finite priority whose (p + eps) ** alpha would overflow the sums is refused, by add
    (before a row is written) and by update_priorities; every tree's bound is tested below."""
    for call in (lambda buf: buf.update_priorities([0, 4, 2], [3.0, 1e308, 3.0]),
                 lambda buf: buf.add(rows(10, 3), priorities=[1.0, 1e308, 2.0])):
        rejects(name, ValueError, r"priorities\[1\] = 1e\+308 is too large", call, alpha=1.0, dtype=dtype)


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_first_bad_entry_in_batch_order_is_reported(name):
    """A bad value before a bad index is what the error names, for every buffer alike."""
    rejects(name, ValueError, r"priorities\[1\] = nan is not finite",
            lambda buf: buf.update_priorities([0, 1, 1000], [1.0, math.nan, 1.0]))
    rejects(name, IndexError, r"indices\[1\] = 1000 is out of range",
            lambda buf: buf.update_priorities([0, 1000, 1], [1.0, 1.0, math.nan]))


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_update_priorities_rejects_indices_out_of_range(name):
    """Valid indices are 0 .. len-1 (5 rows stored), not 0 .. capacity-1."""
    for index in (5, 7, 8, 1000, -1, -8):
        rejects(name, IndexError, rf"indices\[2\] = {index} is out of range.*0 \.\. 4",
                lambda buf: buf.update_priorities([0, 1, index], [3.0, 3.0, 3.0]))


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_huge_unsigned_index_is_reported_as_given(name):
    """uint64 2**64-1 is named as such, not as the -1 an int64 cast makes of it."""
    rejects(name, IndexError, rf"indices\[1\] = {2**64 - 1} is out of range",
            lambda buf: buf.update_priorities(np.array([0, 2**64 - 1], dtype=np.uint64), [1.0, 1.0]))


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_update_priorities_on_empty_buffer(name):
    buf = registry.create(name, capacity=CAPACITY, fields=FIELDS)
    with pytest.raises(IndexError, match=r"indices\[0\] = 0 is out of range: nothing is stored"):
        buf.update_priorities([0], [1.0])
    assert len(buf) == 0


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
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


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_valid_edge_inputs_are_accepted(name):
    """Not errors: the last stored index, zero priorities, a scalar priority, no indices."""
    buf = fresh(name)
    buf.update_priorities([4], [0.0])
    buf.update_priorities([0, 1, 2], 2.5)
    buf.update_priorities(np.array([], dtype=np.int64), np.array([]))
    buf.update_priorities(np.uint8(3), [1.0])
    buf.update_priorities(np.array([4], dtype=np.uint64), [1.0])


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


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_add_rejects_bad_batches(name):
    for _, batch, exc, pattern in _bad_batches():
        rejects(name, exc, pattern, lambda buf: buf.add(batch))
        rejects(name, exc, pattern, lambda buf: buf.add(batch, priorities=[1.0, 1.0, 1.0]))


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_add_rejects_non_dict(name):
    rejects(name, TypeError, r"batch must be a dict of field arrays, got list",
            lambda buf: buf.add([rows(10, 1)]))


# --------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_sampling_an_empty_buffer(name):
    buf = registry.create(name, capacity=CAPACITY, fields=FIELDS)
    with pytest.raises(ValueError, match=r"cannot sample from an empty buffer"):
        buf.sample(4)
    assert len(buf) == 0


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_sample_rejects_bad_batch_size(name):
    for batch_size in (0, -3, 2.5, True, "4", None):
        rejects(name, ValueError, rf"batch_size must be a positive integer, got {re.escape(repr(batch_size))}",
                lambda buf: buf.sample(batch_size))


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_sample_rejects_beta_out_of_range(name):
    for beta in (-0.1, 1.5, math.nan, math.inf, "0.4", True):
        rejects(name, ValueError, rf"beta must be a number in \[0\.0, 1\.0\], got {re.escape(repr(beta))}",
                lambda buf: buf.sample(4, beta=beta))


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_sample_accepts_beta_bounds(name):
    for beta in (0, 0.0, 1, 1.0, np.float32(0.5)):
        assert fresh(name).sample(4, beta=beta)["weights"].shape == (4,)


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_sample_rejects_an_rng_that_is_not_a_generator(name):
    for rng in ("x", 3, np.random.RandomState(0)):
        rejects(name, TypeError, rf"rng must be a numpy\.random\.Generator or None, got {re.escape(repr(rng))}",
                lambda buf: buf.sample(4, rng=rng))


# --------------------------------------------------------------------------------------------
# registry.create
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_create_checks_capacity(name):
    """Per variant: a tree variant's capacity reaches its tree's constructor first."""
    for capacity in (0, -3, 2.5, "10", None, True, np.float64(4.0)):
        with pytest.raises(ValueError, match=rf"capacity must be a positive integer, got {re.escape(repr(capacity))}"):
            registry.create(name, capacity=capacity, fields=FIELDS)
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


@pytest.mark.parametrize("name", [n for n in PRIORITIZED if takes_param(n, "K")])
def test_create_rejects_k_out_of_range(name):
    for K in (1, 0, -2, 65, 128, 16.0, True, "16"):
        with pytest.raises(ValueError, match=rf"K must be an integer from 2 to \d+, got {re.escape(repr(K))}"):
            registry.create(name, capacity=CAPACITY, fields=FIELDS, K=K)


def test_create_checks_k_is_a_power_of_two_for_aligned():
    for K in (3, 6, 12, 24, 63):
        with pytest.raises(ValueError, match=rf"K must be a power of 2.*got {K}\b"):
            registry.create("kary-aligned", capacity=CAPACITY, fields=FIELDS, K=K)
        # The unaligned K-ary tree takes any K.
        assert registry.create("kary", capacity=CAPACITY, fields=FIELDS, K=K).tree.K == K
    for K in (2, 4, 32, 64):
        assert registry.create("kary-aligned", capacity=CAPACITY, fields=FIELDS, K=K).tree.K == K


@pytest.mark.parametrize("name", [n for n in PRIORITIZED if takes_param(n, "dtype")])
def test_create_rejects_bad_tree_dtype(name):
    for dtype in ("float16", "int32", "double precision", np.int64):
        with pytest.raises(ValueError, match=rf"dtype must be 'float32' or 'float64', got {re.escape(repr(dtype))}"):
            registry.create(name, capacity=CAPACITY, fields=FIELDS, dtype=dtype)


BAD_BUFFER_PARAMS = [
    ("alpha", -0.5, r"alpha must be a finite number >= 0\.0, got -0\.5"),
    ("alpha", math.nan, r"alpha must be a finite number .*got nan"),
    ("alpha", math.inf, r"alpha must be a finite number >= 0\.0, got inf"),
    ("alpha", True, r"alpha must be a finite number >= 0\.0, got True"),
    ("eps", -1e-3, r"eps must be a finite number >= 0\.0, got -0\.001"),
    ("eps", math.inf, r"eps must be a finite number >= 0\.0, got inf"),
    ("beta", 1.2, r"beta must be a number in \[0\.0, 1\.0\], got 1\.2"),
    ("beta", "0.4", r"beta must be a number .*got '0\.4'"),
    ("stratified", "no", r"stratified must be True or False, got 'no'"),
    ("stratified", 1, r"stratified must be True or False, got 1"),
    ("stratified", None, r"stratified must be True or False, got None"),
]


@pytest.mark.parametrize("name", PRIORITIZED_CLASS_VARIANTS)
def test_create_rejects_bad_buffer_parameters(name):
    """alpha and eps are finite (an infinite one leaves a buffer that takes no update); a
    boolean is a bool (``stratified="no"`` is not True)."""
    for param, value, pattern in BAD_BUFFER_PARAMS:
        with pytest.raises(ValueError, match=pattern):
            registry.create(name, capacity=CAPACITY, fields=FIELDS, **{param: value})


def test_check_buffer_params_normalises_what_it_accepts():
    """The one check every prioritized buffer uses (the shared-memory one too)."""
    good = {"alpha": np.float32(0.5), "beta": 1, "eps": 0, "stratified": np.bool_(True)}
    params = check_buffer_params(**good)
    assert params == {"alpha": 0.5, "beta": 1.0, "eps": 0.0, "stratified": True}
    assert [type(v) for v in params.values()] == [float, float, float, bool]
    for param, value, pattern in BAD_BUFFER_PARAMS:
        with pytest.raises(ValueError, match=pattern):
            check_buffer_params(**{**good, param: value})


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_create_rejects_bad_seed(name):
    for seed in ("x", -1, 1.5):
        with pytest.raises(ValueError, match=rf"seed must be .*got {re.escape(repr(seed))}"):
            registry.create(name, capacity=CAPACITY, fields=FIELDS, seed=seed)


@pytest.mark.parametrize("name", BUFFER_CLASS_VARIANTS)
def test_create_rejects_bad_fields(name):
    for fields, pattern in [
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
    ]:
        with pytest.raises(ValueError, match=pattern):
            registry.create(name, capacity=CAPACITY, fields=fields)


# --------------------------------------------------------------------------------------------
# Trees: every tree's own input checks (the trees are public too)
# --------------------------------------------------------------------------------------------


def tree_rejects(tree, exc, pattern, call):
    """``call()`` raises ``exc`` matching ``pattern`` and leaves the tree as it was."""
    before = (tree.leaves(), tree.total(), tree.min())
    with pytest.raises(exc, match=pattern):
        call()
    np.testing.assert_array_equal(tree.leaves(), before[0])
    assert (tree.total(), tree.min()) == before[1:]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factory", TREE_FACTORIES + [lambda cap, dtype: ReferenceSumTree(cap)],
                         ids=TREE_IDS + ["reference"])
def test_tree_update_rejects_bad_input(factory, dtype):
    """Every kind of bad batch, on every tree: the error names the first bad entry in batch
    order, and no leaf or inner node changes."""
    tree = factory(CAPACITY, dtype)
    tree.update([0, 1, 2, 4], [0.5, 2.0, 1.0, 3.0])
    for value, message in BAD_VALUES:
        tree_rejects(tree, ValueError, r"priorities\[1\] " + message,
                     lambda: tree.update([0, 4, 2], [3.0, value, 3.0]))
    for index in (CAPACITY, CAPACITY + 1, 1000, -1, -CAPACITY):
        tree_rejects(tree, IndexError, rf"indices\[2\] = {index} is out of range: valid indices are 0 \.\. 7",
                     lambda: tree.update([0, 1, index], [3.0, 3.0, 3.0]))
        # n_valid narrows the valid range, it never widens it past the leaves.
        tree_rejects(tree, IndexError, rf"indices\[0\] = {index} is out of range: valid indices are 0 \.\. 7",
                     lambda: tree.update([index], [1.0], n_valid=10**7))
    tree_rejects(tree, IndexError, r"indices\[1\] = 5 is out of range: valid indices are 0 \.\. 4",
                 lambda: tree.update([4, 5], [1.0, 1.0], n_valid=5))
    tree_rejects(tree, IndexError, r"indices\[0\] = 0 is out of range: nothing is stored yet",
                 lambda: tree.update([0], [1.0], n_valid=0))
    tree_rejects(tree, IndexError, rf"indices\[1\] = {2**64 - 1} is out of range",
                 lambda: tree.update(np.array([0, 2**64 - 1], dtype=np.uint64), [1.0, 1.0]))
    tree_rejects(tree, ValueError, r"priorities\[1\] = nan is not finite",
                 lambda: tree.update([0, 1, 1000], [1.0, math.nan, 1.0]))
    tree_rejects(tree, IndexError, r"indices\[1\] = 1000 is out of range",
                 lambda: tree.update([0, 1000, 1], [1.0, 1.0, math.nan]))
    # A finite priority whose (p + eps) ** alpha the sums cannot hold.
    tree_rejects(tree, ValueError, r"priorities\[1\] = 1e\+308 is too large: .*eps=0\.0, alpha=1\.0",
                 lambda: tree.update([0, 4, 2], [3.0, 1e308, 3.0], eps=0.0, alpha=1.0))
    tree_rejects(tree, TypeError, r"indices must be integers, got dtype float64",
                 lambda: tree.update(np.array([0.0, 1.0]), [1.0, 1.0]))
    tree_rejects(tree, TypeError, r"indices must be integers, got dtype bool",
                 lambda: tree.update(np.array([True, False]), [1.0, 1.0]))
    tree_rejects(tree, ValueError, r"indices must be 1-D, got shape \(1, 2\)",
                 lambda: tree.update(np.array([[0, 1]]), [1.0, 1.0]))
    tree_rejects(tree, ValueError, r"priorities must have shape \(2,\).*got \(3,\)",
                 lambda: tree.update([0, 1], [1.0, 1.0, 1.0]))
    tree_rejects(tree, TypeError, r"priorities must be numbers, got dtype <U",
                 lambda: tree.update([0, 1], ["a", "b"]))
    tree_rejects(tree, ValueError, r"nan", lambda: tree.fill(5, 2, math.nan))
    tree_rejects(tree, IndexError, r"indices\[1\] = 8\b", lambda: tree.get([0, 8]))
    tree_rejects(tree, IndexError, r"indices\[0\] = -1\b", lambda: tree.get([-1]))
    assert np.isfinite(tree.total())
    # Not errors: the last leaf, a zero, a scalar priority, an empty batch, unsigned indices.
    tree.update([7], [0.0])
    tree.update([0, 1, 2], 2.5)
    assert tree.update(np.array([], dtype=np.int64), np.array([])) == 0.0
    tree.update(np.uint8(3), [1.0])
    tree.update(np.array([6], dtype=np.uint64), [1.0])
    np.testing.assert_array_equal(tree.leaves(), [2.5, 2.5, 2.5, 1.0, 3.0, 0.0, 1.0, 0.0])


@pytest.mark.parametrize("cls", ARRAY_TREE_CLASSES + [ReferenceSumTree])
def test_tree_rejects_bad_capacity(cls):
    for capacity in (0, -1, 1.5, "8", None, False):
        with pytest.raises(ValueError, match=rf"capacity must be a positive integer, got {re.escape(repr(capacity))}"):
            cls(capacity)


@pytest.mark.parametrize("cls", ARRAY_TREE_CLASSES)
def test_tree_rejects_bad_dtype_and_resum(cls):
    with pytest.raises(ValueError, match=r"dtype must be 'float32' or 'float64', got 'float16'"):
        cls(8, dtype="float16")
    with pytest.raises(ValueError, match=r"resum_every must be >= 1, got -5"):
        cls(8, resum_every=-5)


def test_tree_k_checks():
    with pytest.raises(ValueError, match=r"K must be an integer from 2 to 64, got 1\b"):
        KarySumTree(8, K=1)
    for cls in (AlignedKarySumTree, PrefixKarySumTree):
        with pytest.raises(ValueError, match=r"K must be an integer from 2 to 64, got 65\b"):
            cls(8, K=65)
        with pytest.raises(ValueError, match=r"K must be a power of 2.*got 6\b"):
            cls(8, K=6)
    assert KarySumTree(8, K=6).K == 6


def test_training_errors_survive_pickling():
    """A worker's error crosses a process boundary (Ray sends it to the driver): its fields must
    come back, or the driver sees an UnserializableException instead of the named argument."""
    import pickle

    from replaybench.impl.rl.common.errors import ConfigError, WorkerFailed

    err = pickle.loads(pickle.dumps(ConfigError("env", "Nope-v0", "env 'Nope-v0' cannot be made")))
    assert (type(err), err.field, err.value, str(err)) == (ConfigError, "env", "Nope-v0", "env 'Nope-v0' cannot be made")
    failed = pickle.loads(pickle.dumps(WorkerFailed("actor 1", "Traceback ...", (11, 12))))
    assert (failed.worker, failed.detail, failed.pids) == ("actor 1", "Traceback ...", (11, 12))
    assert str(failed) == "worker actor 1 failed:\nTraceback ..."
