"""Every array-backed sum tree against the O(N) oracle, plus layout unit tests.

The parity test is a hypothesis state machine: batches of updates (zeros, duplicates, bad
entries) and rebuilds are applied to a tree (at float32 and at float64) and to
ReferenceSumTree, and after every step the leaves, the minimum, the total (within the drift
bound of impl/trees/array_trees.py) and prefix-sum searches are compared.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from replaybench.impl.trees import (
    AlignedKarySumTree,
    BinarySumTree,
    BlockedBinarySumTree,
    KarySumTree,
    ReferenceSumTree,
    SumTree,
)
from replaybench.impl.trees import array_trees
from replaybench.impl.trees.layouts import BLOCK_DEPTHS, BLOCK_SLOTS, CACHE_LINE

from _support import (
    ARRAY_FACTORIES,
    ARRAY_IDS,
    DTYPES,
    LAYOUT_FACTORIES,
    LAYOUT_IDS,
    TREE_FACTORIES,
    TREE_IDS,
    UNIT_ROUNDOFF,
    rounding_slack,
)

CAPACITIES = [1, 2, 3, 17, 100, 257]

# Zeros, round values that produce exact ties on prefix-sum boundaries, float32 values, any
# doubles (rounded when a float32 tree stores them), and positive values so small that a
# float32 tree stores them as subnormals or as 0 (which must then count as zero everywhere).
PRIORITY = st.one_of(
    st.just(0.0),
    st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    st.floats(min_value=2.0**-10, max_value=1e4, width=32, allow_subnormal=False),
    st.floats(min_value=0.0, max_value=1e4),
    st.floats(min_value=1e-60, max_value=1e-37),
)


def addr(lay, d, j):
    """Slot of node ``j`` at depth ``d`` (the address-table formula of impl.trees.kernels)."""
    return int(lay[d, 0]) + ((j >> int(lay[d, 1])) << int(lay[d, 2])) + (j & int(lay[d, 3]))


def all_nodes(tree):
    """(depth, j, slot) for every node of an array tree."""
    lay, K = tree._lay, tree.K
    for d in range(lay.shape[0]):
        for j in range(K**d):
            yield d, j, addr(lay, d, j)


# --------------------------------------------------------------------------------------------
# Parity with the oracle (stateful)
# --------------------------------------------------------------------------------------------


class ParityTrack:
    """One tree (one configuration at one dtype) and the oracle holding what it should hold.
    :class:`TreeParity` applies every step to each track; the methods below are its rules."""

    def __init__(self, factory, dtype, capacity):
        # No automatic resum: rebuilds happen only through the rule below, so the drift bound
        # can be checked with an exact count of updates since the last rebuild.
        self.tree = factory(capacity, dtype, resum_every=10**12)
        self.dtype = dtype
        assert isinstance(self.tree, SumTree)
        self.ref = ReferenceSumTree(capacity)
        self.cap = capacity
        self.unit = UNIT_ROUNDOFF[self.tree.dtype]
        self.since_rebuild = 0
        self.t_max = 0.0

    # -- helpers ------------------------------------------------------------------------------

    def exact_total(self):
        return math.fsum(self.ref.leaves().tolist())

    def tolerance(self):
        """Documented bound on |stored - exact| for any node or prefix of the tree, with slack
        for the float64 arithmetic of the search itself."""
        return 2.0 * (self.since_rebuild + rounding_slack(self.tree) + 1) * self.unit * self.t_max + 1e-300

    def note_batch(self, idx, vals):
        """Track the largest exact total held at any point inside a batch (applied in order)."""
        leaves = self.ref.leaves()
        total = math.fsum(leaves.tolist())
        for i, v in zip(idx, vals):
            total += v - leaves[i]
            leaves[i] = v
            self.t_max = max(self.t_max, total)
        self.since_rebuild += len(idx)

    def stored(self, vals):
        """``vals`` as the tree's dtype holds them: the oracle is given exactly these."""
        return np.asarray(vals, dtype=np.float64).astype(self.tree.dtype).astype(np.float64)

    def apply(self, idx, vals, n_valid=None):
        idx = np.asarray(idx, dtype=np.int64)
        vals = np.asarray(vals, dtype=np.float64)
        self.note_batch(idx, self.stored(vals))
        got = self.tree.update(idx, vals, n_valid=n_valid)
        self.ref.update(idx, self.stored(vals), n_valid=n_valid)
        assert got == (vals.max() if vals.size else 0.0), "update() must return the largest value set"

    # -- rules --------------------------------------------------------------------------------

    def update(self, batch):
        self.apply([i % self.cap for i, _ in batch], [p for _, p in batch])

    def update_duplicates(self, i, values):
        """The same leaf several times in one batch: the last value wins."""
        i %= self.cap
        self.apply([i] * len(values), values)
        assert self.tree.get([i])[0] == self.stored(values)[-1]

    def update_with_n_valid(self, batch, extra):
        idx = [i % self.cap for i, _ in batch]
        n_valid = max(idx) + 1 + extra % (self.cap - max(idx))
        self.apply(idx, [p for _, p in batch], n_valid=n_valid)

    def fill(self, start, count, p):
        """The ring-buffer insert: ``count`` leaves from ``start`` on, wrapping, set to ``p``."""
        start %= self.cap
        count %= self.cap + 1
        idx = (start + np.arange(count)) % self.cap
        self.note_batch(idx, self.stored(np.full(count, p)))
        self.tree.fill(start, count, p)
        self.ref.update(idx, self.stored(p)[()])

    def set_zero(self, i):
        self.apply([i % self.cap], [0.0])

    def update_rejected(self, batch, pos, bad):
        """A batch with one bad entry raises an error naming it and changes nothing."""
        idx = [i % self.cap for i, _ in batch]
        vals = [p for _, p in batch]
        pos %= len(idx)
        n_valid = None
        if bad == "index_high":
            idx[pos] = self.cap
        elif bad == "index_far":
            idx[pos] = self.cap + 12345
        elif bad == "index_negative":
            idx[pos] = -1
        elif bad == "n_valid":
            n_valid = self.cap - 1
            if n_valid == 0:
                pos = 0  # every index is out of range, so the first is reported
            else:
                idx = [min(i, n_valid - 1) for i in idx]
            idx[pos] = self.cap - 1
        else:
            vals[pos] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "negative": -0.25}[bad]
        before = (self.tree.leaves(), self.tree.total(), self.tree.min())
        if bad.startswith("index") or bad == "n_valid":
            with pytest.raises(IndexError, match=rf"indices\[{pos}\] = {idx[pos]}\b"):
                self.tree.update(idx, vals, n_valid=n_valid)
        else:
            shown = {"nan": "nan", "inf": "inf", "-inf": "-inf", "negative": "-0.25"}[bad]
            with pytest.raises(ValueError, match=rf"priorities\[{pos}\] = {shown} "):
                self.tree.update(idx, vals, n_valid=n_valid)
        after = (self.tree.leaves(), self.tree.total(), self.tree.min())
        np.testing.assert_array_equal(before[0], after[0])
        assert before[1:] == after[1:]

    def rebuild(self):
        self.tree.rebuild()
        self.since_rebuild = 0
        self.t_max = self.exact_total()

    def find_fractions(self, fractions):
        total = self.tree.total()
        self.check_find(np.asarray(fractions) * max(total, 0.0))

    def find_on_boundaries(self):
        """u exactly on each prefix sum S(i), and just below and above it."""
        cum = np.cumsum(self.ref.leaves())
        us = np.concatenate([cum, np.nextafter(cum, -np.inf), np.nextafter(cum, np.inf)])
        us = us[(us >= 0) & (us < self.tree.total())]
        if us.size:
            self.check_find(us)

    def sample(self, n, seed, stratified):
        if not self.exact_total() > self.tolerance():
            return  # nothing is reliably sampleable yet
        if self.tolerance() * n > 0.25 * self.exact_total():
            # Drift (resum is off here) may exceed a whole stratum; then a stratum past the
            # positive mass cannot be redrawn within itself and sample() raises. The trees'
            # resum trigger prevents that state with default settings (see test_drift.py).
            return
        idx, prio = self.tree.sample(n, np.random.default_rng(seed), stratified=stratified)
        leaves = self.ref.leaves()
        assert idx.shape == prio.shape == (n,)
        assert idx.dtype == np.int64
        assert ((idx >= 0) & (idx < self.cap)).all()
        np.testing.assert_array_equal(prio, leaves[idx])
        assert (prio > 0).all(), "a zero-priority leaf was sampled"

    # -- checks -------------------------------------------------------------------------------

    def check_find(self, us):
        us = np.asarray(us, dtype=np.float64)
        got_idx, got_prio = self.tree.find(us)
        want_idx, _ = self.ref.find(us)
        leaves = self.ref.leaves()
        cum = np.cumsum(leaves)
        starts = cum - leaves
        tol = self.tolerance()
        assert got_idx.dtype == np.int64 and got_idx.shape == us.shape
        for u, gi, gp, wi in zip(us, got_idx, got_prio, want_idx):
            if gi >= 0:
                assert gi < self.cap
                assert gp == leaves[gi] and gp > 0, f"find returned leaf {gi} with priority {gp}"
            else:
                assert gp == 0.0
            if gi == wi:
                continue
            # Rounding may move u across a prefix-sum boundary, never further.
            near = np.min(np.abs(cum - u)) if cum.size else math.inf
            assert near <= tol, (
                f"find({u!r}) = {gi}, oracle says {wi}; nearest prefix-sum boundary is "
                f"{near:.3g} away (tolerance {tol:.3g})")
            if gi >= 0:
                assert starts[gi] - tol <= u < cum[gi] + tol, (u, gi, starts[gi], cum[gi], tol)

    def leaves_match(self):
        got = self.tree.leaves()
        assert got.dtype == np.float64 and got.shape == (self.cap,)
        np.testing.assert_array_equal(got, self.ref.leaves())

    def min_matches(self):
        assert self.tree.min() == self.ref.min()

    def total_within_drift_bound(self):
        err = abs(self.tree.total() - self.exact_total())
        assert err <= self.tolerance() / 2, (err, self.tolerance() / 2)


class TreeParity(RuleBasedStateMachine):
    """Runs one tree configuration, at every dtype, against ReferenceSumTree: each step is
    applied to one track per dtype, so both see the same steps (drawn once, which halves the
    cost of drawing them). Subclassed per configuration."""

    factory = None

    @initialize(capacity=st.sampled_from(CAPACITIES))
    def setup(self, capacity):
        self.tracks = [ParityTrack(type(self).factory, dtype, capacity) for dtype in DTYPES]

    def each(self, method, *args):
        """``track.method(*args)`` on every track; a failure says which dtype failed."""
        for track in getattr(self, "tracks", ()):
            try:
                getattr(track, method)(*args)
            except Exception as err:
                err.add_note(f"(in the {track.dtype} tree)")
                raise

    @rule(batch=st.lists(st.tuples(st.integers(0, 10**6), PRIORITY), max_size=24))
    def update(self, batch):
        self.each("update", batch)

    @rule(i=st.integers(0, 10**6), values=st.lists(PRIORITY, min_size=2, max_size=6))
    def update_duplicates(self, i, values):
        self.each("update_duplicates", i, values)

    @rule(batch=st.lists(st.tuples(st.integers(0, 10**6), PRIORITY), min_size=1, max_size=8),
          extra=st.integers(0, 10**6))
    def update_with_n_valid(self, batch, extra):
        self.each("update_with_n_valid", batch, extra)

    @rule(start=st.integers(0, 10**6), count=st.integers(0, 300), p=PRIORITY)
    def fill(self, start, count, p):
        self.each("fill", start, count, p)

    @rule(i=st.integers(0, 10**6))
    def set_zero(self, i):
        self.each("set_zero", i)

    @rule(batch=st.lists(st.tuples(st.integers(0, 10**6), PRIORITY), min_size=1, max_size=8),
          pos=st.integers(0, 10**6),
          bad=st.sampled_from(["index_high", "index_far", "index_negative", "n_valid",
                               "nan", "inf", "-inf", "negative"]))
    def update_rejected(self, batch, pos, bad):
        self.each("update_rejected", batch, pos, bad)

    @rule()
    def rebuild(self):
        self.each("rebuild")

    @rule(fractions=st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=16))
    def find_fractions(self, fractions):
        self.each("find_fractions", fractions)

    @rule()
    def find_on_boundaries(self):
        self.each("find_on_boundaries")

    @rule(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1), stratified=st.booleans())
    def sample(self, n, seed, stratified):
        self.each("sample", n, seed, stratified)

    @invariant()
    def matches_reference(self):
        self.each("leaves_match")
        self.each("min_matches")
        self.each("total_within_drift_bound")


PARITY_SETTINGS = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# The tiny-cache cases (the state machine with touch passes over every level) run in ``make
# test-slow``: a touch pass only reads ahead of a descent and changes no state, and every
# layout's descents with touch passes are checked against the oracle in ``make test`` by
# test_random_batches_match_reference and test_descent_on_every_boundary_matches_reference.
@pytest.mark.parametrize("factory", TREE_FACTORIES, ids=TREE_IDS)
@pytest.mark.parametrize("cache", ["machine-cache", pytest.param("tiny-cache", marks=pytest.mark.slow)],
                         indirect=True)  # nearest the function: ids stay "<cache>-<tree>"
def test_parity_with_reference(factory, cache):
    """With the tiny cache, the trees are built with prefetch=True and touch every level."""
    if cache == "tiny-cache":
        factory = functools.partial(factory, prefetch=True)
    machine = type("TreeParity", (TreeParity,), {"factory": staticmethod(factory)})
    run_state_machine_as_test(machine, settings=PARITY_SETTINGS)


@pytest.mark.slow
@pytest.mark.parametrize("factory", TREE_FACTORIES, ids=TREE_IDS)
def test_parity_with_reference_thorough(factory):
    machine = type("TreeParity", (TreeParity,), {"factory": staticmethod(factory)})
    run_state_machine_as_test(machine, settings=settings(PARITY_SETTINGS, max_examples=300,
                                                         stateful_step_count=50))


# --------------------------------------------------------------------------------------------
# Direct checks that do not need the state machine
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefetch", [False, True], ids=["no-touch", "touch"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factory", TREE_FACTORIES, ids=TREE_IDS)
def test_random_batches_match_reference(factory, dtype, prefetch, monkeypatch):
    """A quick deterministic parity check with a full search sweep (also fast to debug); with
    ``touch`` every level of a descent gets its touch pass first."""
    monkeypatch.setattr(array_trees, "TOUCH_LEVEL_BYTES", 0)
    for capacity in CAPACITIES:
        tree = factory(capacity, dtype, prefetch=prefetch)
        assert getattr(tree, "prefetch", prefetch) == prefetch
        check_random_batches(tree, ReferenceSumTree(capacity), np.random.default_rng(12345))


@pytest.mark.parametrize("prefetch", [False, True], ids=["no-touch", "touch"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factory", TREE_FACTORIES, ids=TREE_IDS)
def test_descent_on_every_boundary_matches_reference(factory, dtype, prefetch, monkeypatch):
    """The descent kernels (impl.trees.ops.descend: each layout's scan, the level-order fast
    path and the generic address-table path, with and without touch passes) against the
    oracle on priorities whose sums are exact at either dtype (small integers, a third of them
    0, zeros at both ends): no rounding, so every search must agree exactly, on every prefix
    sum S(i) (a tie moves right, past any zero leaves), half a unit below it, and at u = 0.
    u = total is past the mass: -1, or the last positive leaf (the scan's last child is taken
    without a compare, so a tree whose last leaf is positive may land on it)."""
    monkeypatch.setattr(array_trees, "TOUCH_LEVEL_BYTES", 0)
    rng = np.random.default_rng(2025)
    for capacity in (*CAPACITIES, 4099):
        tree, ref = factory(capacity, dtype, prefetch=prefetch), ReferenceSumTree(capacity)
        vals = rng.integers(1, 5, capacity).astype(np.float64)
        vals[rng.random(capacity) < 0.33] = 0.0
        vals[0] = vals[-1] = 0.0
        vals[capacity // 2] = 3.0  # some mass
        idx = np.arange(capacity)
        tree.update(idx, vals)
        ref.update(idx, vals)
        cum = np.cumsum(vals)
        total = float(cum[-1])
        assert tree.total() == total
        us = np.concatenate([[0.0], cum[:-1], cum[:-1] - 0.5])
        us = us[(us >= 0.0) & (us < total)]
        got, prio = tree.find(us)
        want, want_prio = ref.find(us)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(prio, want_prio)
        last_positive = int(np.flatnonzero(vals > 0)[-1])
        got_end, _ = tree.find(np.array([total]))
        assert got_end[0] in (-1, last_positive), (capacity, got_end, last_positive)


def check_random_batches(tree, ref, rng):
    capacity = tree.capacity
    updates, t_max = 0, 0.0
    for _ in range(20):
        n = int(rng.integers(0, 3 * capacity + 1))
        idx = rng.integers(0, capacity, n)
        vals = rng.random(n).astype(np.float32).astype(np.float64)
        vals[rng.random(n) < 0.3] = 0.0
        t_max = max(t_max, ref.total() + vals.sum())  # bounds every total held in the batch
        assert tree.update(idx, vals) == ref.update(idx, vals)
        updates += n
    np.testing.assert_array_equal(tree.leaves(), ref.leaves())
    assert tree.min() == ref.min()
    # The documented drift bound (impl/trees/array_trees.py), plus one rebuild's rounding.
    bound = (updates + rounding_slack(tree)) * UNIT_ROUNDOFF[tree.dtype] * t_max
    assert abs(tree.total() - math.fsum(ref.leaves().tolist())) <= bound
    # Midpoints of each positive leaf's interval are far from every boundary: indices must agree.
    leaves = ref.leaves()
    cum = np.cumsum(leaves)
    mids = (cum - leaves / 2)[leaves > 0]
    got, prio = tree.find(mids)
    np.testing.assert_array_equal(got, np.flatnonzero(leaves > 0))
    np.testing.assert_array_equal(prio, leaves[leaves > 0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factory", TREE_FACTORIES, ids=TREE_IDS)
def test_eps_and_alpha(factory, dtype):
    tree = factory(17, dtype)
    idx = np.array([0, 3, 16, 5])
    raw = np.array([0.0, 1.0, 2.5, 9.0])
    pmax = tree.update(idx, raw, eps=0.01, alpha=0.6)
    want = (raw + 0.01) ** 0.6
    rtol = 1e-6 if dtype == "float32" else 1e-13
    np.testing.assert_allclose(tree.get(idx), want, rtol=rtol)
    assert pmax == pytest.approx(want.max(), rel=1e-12)
    assert tree.min() == pytest.approx(want.min(), rel=rtol)
    assert tree.total() == pytest.approx(want.sum(), rel=rtol)
    # alpha = 0 makes every updated leaf 1, including a zero priority (0 + eps) ** 0.
    tree.update(idx, raw, eps=0.01, alpha=0.0)
    np.testing.assert_array_equal(tree.get(idx), 1.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factory", TREE_FACTORIES, ids=TREE_IDS)
def test_empty_tree(factory, dtype, rng):
    tree = factory(5, dtype)
    assert tree.total() == 0.0
    assert tree.min() == math.inf
    np.testing.assert_array_equal(tree.leaves(), np.zeros(5))
    idx, prio = tree.find(np.array([0.0, 0.5]))
    np.testing.assert_array_equal(idx, [-1, -1])
    np.testing.assert_array_equal(prio, [0.0, 0.0])
    with pytest.raises(ValueError, match="total priority is 0"):
        tree.sample(4, rng)
    assert tree.update([], []) == 0.0  # an empty batch is a no-op
    tree.update([2], [1.5])
    tree.update([2], [0.0])
    assert tree.min() == math.inf, "a leaf set back to zero must leave the minimum"
    with pytest.raises(ValueError, match="total priority is 0"):
        tree.sample(4, rng)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factory", TREE_FACTORIES, ids=TREE_IDS)
def test_priorities_that_round_to_zero_count_as_zero(factory, dtype, rng):
    """A positive priority below the dtype's smallest subnormal is stored as 0: it must not
    become the minimum (min() is the smallest *positive* leaf, the weights' normaliser)."""
    tree = factory(17, dtype)
    tiny = 1e-50 if tree.dtype == np.float32 else 1e-330  # 1e-330 is itself 0.0 in float64
    tree.update([0, 5, 9], [tiny, 2.0, 3.0])
    assert tree.get([0])[0] == 0.0
    assert tree.min() == 2.0
    tree.fill(10, 4, tiny) if hasattr(tree, "fill") else tree.update(np.arange(10, 14), tiny)
    assert tree.min() == 2.0
    idx, _ = tree.sample(1000, rng)
    assert set(idx.tolist()) <= {5, 9}
    tree.rebuild()  # rebuild agrees
    assert tree.min() == 2.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factory", ARRAY_FACTORIES, ids=ARRAY_IDS)
def test_inflated_inner_sums_never_yield_zero_leaves(factory, dtype):
    """White-box: make the stored root larger than its leaves, as drift can. Searches past the
    positive mass return -1, sample() redraws them, rebuilds the tree when redraws keep
    missing, and gives up loudly when even that cannot help; plain and stratified draws."""
    for stratified in (False, True):
        check_inflated_inner_sums(factory(4, dtype), stratified, np.random.default_rng(12345))


def check_inflated_inner_sums(tree, stratified, rng):
    tree.update([0], [1.0])
    tree._sums[tree._root] = 2.0
    idx, prio = tree.find(np.array([0.5, 1.5]))
    np.testing.assert_array_equal(idx, [0, -1])
    np.testing.assert_array_equal(prio, [1.0, 0.0])
    # Plain draws past the positive mass are redrawn anywhere; stratified ones within their
    # stratum, so the phantom mass must be smaller than a stratum (as real drift is).
    tree._sums[tree._root] = 2.0 if not stratified else 1.002
    idx, prio = tree.sample(2000 if not stratified else 100, rng, stratified=stratified)
    np.testing.assert_array_equal(idx, 0)
    np.testing.assert_array_equal(prio, 1.0)
    # Hopeless phantom mass: after a few redraw rounds sample() rebuilds the tree itself.
    tree._sums[tree._root] = 1e30
    np.testing.assert_array_equal(tree.sample(100, rng, stratified=stratified)[0], 0)
    assert tree.total() == 1.0
    # ...and if even that cannot help, it gives up loudly instead of looping.
    tree._sums[tree._root] = 1e30
    tree.rebuild = lambda: None
    with pytest.raises(RuntimeError, match="rebuild"):
        tree.sample(100, rng, stratified=stratified)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factory", TREE_FACTORIES, ids=TREE_IDS)
def test_rebuild_restores_consistency(factory, dtype, rng):
    tree, ref = factory(257, dtype), ReferenceSumTree(257)
    for _ in range(50):
        idx = rng.integers(0, 257, 64)
        vals = (rng.random(64) * 10.0**rng.integers(-3, 4, 64)).astype(np.float32).astype(np.float64)
        tree.update(idx, vals)
        ref.update(idx, vals)
    tree.rebuild()
    np.testing.assert_array_equal(tree.leaves(), ref.leaves())
    bound = rounding_slack(tree) * UNIT_ROUNDOFF[tree.dtype] * ref.total()
    assert abs(tree.total() - math.fsum(ref.leaves().tolist())) <= bound
    assert tree.min() == ref.min()


# --------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factory", LAYOUT_FACTORIES, ids=LAYOUT_IDS)
def test_layout_is_injective_and_in_bounds(factory, dtype):
    for capacity in (1, 2, 3, 17, 100, 257, 4097):
        check_layout(factory(capacity, dtype), capacity, dtype)


def check_layout(tree, capacity, dtype):
    K, D = tree.K, tree.depth
    assert K**D >= capacity and (D == 0 or K ** (D - 1) < capacity), "depth is not minimal"
    slots = [slot for _, _, slot in all_nodes(tree)]
    assert len(set(slots)) == len(slots), "two nodes share a slot"
    assert min(slots) >= 0 and max(slots) < tree._sums.shape[0]
    assert tree._sums.dtype == np.dtype(dtype) and tree._mins.dtype == np.dtype(dtype)
    # The children of each node are K slots `stride` apart, as the kernels assume.
    lay = tree._lay
    for d in range(D):
        for j in range(K**d):
            first = addr(lay, d + 1, j * K)
            for k in range(K):
                assert addr(lay, d + 1, j * K + k) == first + k * int(lay[d + 1, 4])


@pytest.mark.parametrize("capacity", [17, 100, 257, 4097, 70000])
def test_aligned_k16_float32_sibling_groups_fill_cache_lines(capacity):
    tree = AlignedKarySumTree(capacity, K=16, dtype="float32")
    base = tree._sums.ctypes.data
    assert base % CACHE_LINE == 0 and tree._mins.ctypes.data % CACHE_LINE == 0
    for d in range(1, tree.depth + 1):
        for g in range(16 ** (d - 1)):
            first = addr(tree._lay, d, g * 16)
            last = addr(tree._lay, d, g * 16 + 15)
            assert (base + 4 * first) % CACHE_LINE == 0, f"group {g} at depth {d} is not line-aligned"
            assert last == first + 15  # the whole group is that one line


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [2, 4, 16, 32])
def test_aligned_groups_never_straddle_lines(K, dtype):
    tree = AlignedKarySumTree(1000, K=K, dtype=dtype)
    size = np.dtype(dtype).itemsize
    base = tree._sums.ctypes.data
    assert base % CACHE_LINE == 0
    for d in range(1, tree.depth + 1):
        for g in range(K ** (d - 1)):
            start = base + size * addr(tree._lay, d, g * K)
            end = start + K * size  # one past the group
            if K * size <= CACHE_LINE:
                assert start // CACHE_LINE == (end - 1) // CACHE_LINE, (d, g)
            else:
                assert start % CACHE_LINE == 0, (d, g)


@pytest.mark.parametrize("capacity", [257, 4097])
def test_kary_unpadded_groups_straddle_lines(capacity):
    """The unaligned baseline really is unaligned (else the benchmark compares nothing)."""
    tree = KarySumTree(capacity, K=16, dtype="float32")
    base = tree._sums.ctypes.data
    starts = [base + 4 * addr(tree._lay, d, g * 16)
              for d in range(1, tree.depth + 1) for g in range(16 ** (d - 1))]
    misaligned = sum(s % CACHE_LINE != 0 for s in starts)
    assert misaligned > len(starts) // 2, f"only {misaligned} of {len(starts)} groups are misaligned"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("capacity", [1, 2, 3, 16, 17, 100, 257, 4096, 4097, 2**15 + 1])
def test_blocked_layout_packs_four_level_subtrees_into_blocks(capacity, dtype):
    tree = BlockedBinarySumTree(capacity, dtype=dtype)
    lay, H = tree._lay, tree.depth
    assert tree._sums.ctypes.data % CACHE_LINE == 0
    assert tree._sums.shape[0] % BLOCK_SLOTS == 0
    # Depths are cut into groups of four counted up from the leaves; the top group may be short.
    groups = {}
    for d in range(H + 1):
        groups.setdefault((H - d) // BLOCK_DEPTHS, []).append(d)
    assert all(len(g) == BLOCK_DEPTHS for k, g in groups.items() if k < max(groups))
    seen_blocks = set()
    for depths in groups.values():
        t, bottom = min(depths), max(depths)
        for j in range(2**t):
            block = addr(lay, t, j) // BLOCK_SLOTS
            assert block not in seen_blocks, "two subtrees share a block"
            seen_blocks.add(block)
            in_block = set()
            for d in range(t, bottom + 1):
                for jj in range(j << (d - t), (j + 1) << (d - t)):
                    slot = addr(lay, d, jj)
                    assert slot // BLOCK_SLOTS == block, (
                        f"node ({d}, {jj}) of the subtree at ({t}, {j}) lies outside its block")
                    assert slot % BLOCK_SLOTS != 0, "slot 0 of a block is reserved"
                    in_block.add(slot)
            assert len(in_block) == 2 ** (bottom - t + 1) - 1
    assert len(seen_blocks) * BLOCK_SLOTS == tree._sums.shape[0], "unused blocks allocated"


def test_blocked_16_slot_blocks_are_cache_lines_at_float32():
    tree = BlockedBinarySumTree(4096, dtype="float32")
    assert BLOCK_SLOTS * tree._sums.itemsize == CACHE_LINE
    base = tree._sums.ctypes.data
    H = tree.depth
    # A leaf's group: its 8-leaf bottom level and the three levels above share one line.
    for j in range(0, 2**H, 8):
        lines = {(base + 4 * addr(tree._lay, H - k, j >> k)) // CACHE_LINE for k in range(4)}
        assert len(lines) == 1


@pytest.mark.parametrize("cls", [BinarySumTree, BlockedBinarySumTree])
def test_binary_trees_have_k2(cls):
    assert cls(10).K == 2


@pytest.mark.parametrize("capacity", [1, 2, 3, 17, 100, 257, 4097])
def test_aligned_k2_is_the_binary_layout(capacity):
    """Why the K=2 aligned tree is not among the tree configurations: it runs the same kernels
    on the same address table and array size as the binary tree."""
    aligned, binary = AlignedKarySumTree(capacity, K=2), BinarySumTree(capacity)
    np.testing.assert_array_equal(aligned.layout, binary.layout)
    assert aligned.sums.shape == binary.sums.shape and aligned.kernels is binary.kernels


@pytest.mark.parametrize("K", [2, 3, 5, 16, 64])
def test_kary_branching_factor(K):
    tree = KarySumTree(1000, K=K)
    assert tree.K == K
    assert tree._lay.shape[0] == tree.depth + 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_vector_group_count_matches_the_scalar_compares(dtype):
    """impl.trees.ops.count_le15 (the K = 16 prefix descent's vector compare) counts exactly
    what 15 scalar ``<=`` of the group's first slots count, at any offset into the array: on
    groups that are not sorted (running sums updated by separate float32 adds need not be),
    with ties, signed zeros, infinities and NaN in the slots or as ``u``, and ``u`` one unit
    either side of a slot (a float64 ``u`` between two float32 values)."""
    from numba import njit

    from replaybench.impl.trees import ops

    @njit
    def both(sums, firsts, us, out):
        for r in range(firsts.shape[0]):
            first = np.uint64(firsts[r])
            k = 0
            for c in range(15):
                k += sums[first + np.uint64(c)] <= us[r]
            out[r, 0] = k
            out[r, 1] = ops.count_le15(sums, first, us[r])

    rng = np.random.default_rng(7)
    specials = np.array([0.0, -0.0, 1.0, 2.0, np.inf, -np.inf, np.nan, 1e-45, 3.4e38])
    sums = rng.random(4096).astype(dtype)
    special = rng.random(4096) < 0.2
    sums[special] = rng.choice(specials, int(special.sum()))
    firsts = rng.integers(0, 4096 - 16, 20000)
    picked = sums[firsts + rng.integers(0, 16, firsts.size)].astype(np.float64)
    us = np.concatenate([
        rng.random(5000) * 2.0,
        picked[:5000],  # ties with a slot
        np.nextafter(picked[5000:10000], np.inf),  # just above a float32 slot: still <=
        np.nextafter(picked[10000:15000], -np.inf),  # just below: not
        rng.choice(specials, 5000),
    ])
    out = np.empty((firsts.size, 2), dtype=np.int64)
    both(sums, firsts, us, out)
    np.testing.assert_array_equal(out[:, 1], out[:, 0])


@pytest.mark.parametrize("factory", [BinarySumTree, BlockedBinarySumTree, KarySumTree, AlignedKarySumTree],
                         ids=["binary", "binary-blocked", "kary", "kary-aligned"])
def test_plain_descent_branches_are_the_plain_scan_bit_for_bit(factory):
    """impl.trees.ops.descend's branches for plain trees (K = 2: a select instead of the scan's
    running-sum array; K = 16 on level-order rows: the scan with a literal length) reach the
    same leaves and leave the same remainders u, bit for bit, as the plain scan
    (ops._scan_plain) with a runtime K, on float32 sums that have drifted from their leaves
    (many delta updates, no rebuild), with and without touch passes."""
    from numba import njit

    from replaybench.impl.trees import ops
    from replaybench.impl.trees.kernels import level_row

    @njit
    def scan_descent(sums, lay, K, u, j):
        run = np.zeros(K)
        j[:] = 0
        for d in range(1, lay.shape[0]):
            base, shift, bshift, mask, stride = level_row(lay, d)
            for b in range(u.shape[0]):
                k = ops._scan_plain(sums, ops._first_child(base, shift, bshift, mask, j[b], K), stride, K, u[b], run)
                u[b] = u[b] - run[np.uint64(k)]
                j[b] = j[b] * K + k

    rng = np.random.default_rng(17)
    for capacity in (5, 1000, 4099):
        tree = factory(capacity, resum_every=10**9)
        for _ in range(30):
            idx = rng.integers(0, capacity, 64)
            tree.update(idx, rng.random(64) * rng.choice([1e-6, 1.0, 1e4], 64))
        kind, sums, _, lay, K, _, _, _ = tree.kernel_args
        us = np.concatenate([rng.random(3000) * tree.total(), [0.0, tree.total()]])
        want_u, want_j = us.copy(), np.empty(us.size, np.int64)
        scan_descent(sums, lay, K, want_u, want_j)
        for touch_from in (0, 1, lay.shape[0]):
            got_u, got_j = us.copy(), np.empty(us.size, np.int64)
            ops.descend(kind, sums, lay, K, touch_from, got_u, got_j)
            np.testing.assert_array_equal(got_j, want_j)
            np.testing.assert_array_equal(got_u.view(np.int64), want_u.view(np.int64))
