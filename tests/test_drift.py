"""Numeric drift of the float32 sums, against the bound in impl/trees/array_trees.py.

The module docstring documents: between two rebuilds, after ``m`` updates,
``|stored - exact| <= m * 2**-24 * T_max`` for the root (``T_max`` the largest total held in
that time), a rebuild leaves at most ``K * D`` rounding steps, and the tree rebuilds itself
every ``resum_every`` updates. These tests hold the trees to exactly that.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chisquare

from _support import TREE_FACTORIES, TREE_IDS, UNIT_ROUNDOFF, rounding_slack

# One array tree per layout at its benchmarked branching factor (white-box: resum_every).
DRIFT_CONFIGS = [(i, f) for i, f in zip(TREE_IDS, TREE_FACTORIES)
                 if i in ("binary", "blocked", "kary-K16", "aligned-K16", "prefix-K16")]
DRIFT_IDS = [i for i, _ in DRIFT_CONFIGS]
DRIFT_FACTORIES = [f for _, f in DRIFT_CONFIGS]
# ... plus the trees of variants with a tree class of their own, for the black-box checks.
ALL_DRIFT_IDS = DRIFT_IDS + [i for i in TREE_IDS if i.startswith("variant-")]
ALL_DRIFT_FACTORIES = DRIFT_FACTORIES + [f for i, f in zip(TREE_IDS, TREE_FACTORIES) if i.startswith("variant-")]

CAPACITY = 4096
BATCHES, BATCH = 4000, 250  # 10**6 updates


def exact_total(tree):
    return math.fsum(tree.leaves().tolist())  # a list: fsum iterates NumPy scalars 10x slower


rebuild_slack = rounding_slack  # rounding a rebuild itself leaves: K * D steps (+ one level)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("factory", ALL_DRIFT_FACTORIES, ids=ALL_DRIFT_IDS)
def test_random_updates_stay_within_documented_bound(factory, dtype):
    rng = np.random.default_rng(77)
    tree = factory(CAPACITY, dtype)
    unit = UNIT_ROUNDOFF[tree.dtype]
    if tree.dtype == np.float32 and hasattr(tree, "resum_every"):
        assert tree.resum_every == max(2**16, CAPACITY), "documented default changed"
    resum_every = getattr(tree, "resum_every", 2**62)
    since, t_max, worst_rel = 0, 0.0, 0.0
    total = 0.0
    for b in range(BATCHES):
        idx = rng.integers(0, CAPACITY, BATCH)
        vals = rng.random(BATCH) * 10.0 ** rng.integers(-2, 2, BATCH)  # mixed magnitudes
        # No total inside the batch exceeds the current one plus everything the batch sets.
        t_max = max(t_max, total + vals.sum())
        tree.update(idx, vals)
        since += BATCH
        total = exact_total(tree)
        err = abs(tree.total() - total)
        bound = (since + rebuild_slack(tree)) * unit * t_max
        assert err <= bound, f"batch {b}: |stored - exact| = {err:.3g} > documented bound {bound:.3g}"
        worst_rel = max(worst_rel, err / total)
        if since >= resum_every:  # the tree has just rebuilt itself
            since, t_max = 0, total
    # The documented cap on the relative error, and the "near 1e-5 in practice" claim.
    cap = (resum_every + rebuild_slack(tree)) * unit * t_max / total
    assert worst_rel <= cap
    # "in practice the error grows like sqrt(m) and stays near 1e-5 relative": within 5x of
    # that, and far below the worst-case cap (about 4e-3 at resum_every = 2**16).
    assert worst_rel <= (5e-5 if dtype == "float32" else 1e-13), worst_rel


def _adversarial(tree, rounds):
    """One leaf of 2**24 (float32 root ulp 2, half an ulp 1) and ``rounds`` passes that raise
    every other leaf by 0.25, three leaves per update call: a call's changes reach the root as
    one merged delta (kernels.propagate_batch), 0.75, below half an ulp, so it is lost there.
    Returns (max absolute error of the root seen, exact total at the end)."""
    huge = 2.0**24
    tree.update([0], [huge])
    others = np.arange(1, CAPACITY, dtype=np.int64)
    assert others.size % 3 == 0
    worst = 0.0
    for r in range(1, rounds + 1):
        for chunk in others.reshape(-1, 3):
            tree.update(chunk, np.full(3, 0.25 * r))
        exact = huge + 0.25 * r * others.size  # all values exact in float32 and float64
        worst = max(worst, abs(tree.total() - exact))
    return worst, exact


@pytest.mark.parametrize("factory", DRIFT_FACTORIES, ids=DRIFT_IDS)
def test_lost_increments_accumulate_without_resum(factory):
    """Small updates against a huge total are lost at the root call after call (the drift the
    re-summing rule bounds), and a rebuild removes them."""
    rounds = 25
    tree = factory(CAPACITY, "float32", resum_every=10**12)
    worst, exact = _adversarial(tree, rounds)
    lost = 0.25 * rounds * (CAPACITY - 1)  # 25594 of 16.8 million
    err = abs(tree.total() - exact)
    assert err >= 0.5 * lost, f"expected ~{lost} of lost mass, error is only {err}"
    assert err / exact > 1e-3, "the adversarial case should be far beyond the typical 1e-5"
    # Still inside the documented (worst-case) bound: m * 2**-24 * T_max.
    m = 1 + rounds * (CAPACITY - 1)
    assert err <= (m + rebuild_slack(tree)) * 2.0**-24 * exact
    # An explicit rebuild removes it.
    tree.rebuild()
    assert abs(tree.total() - exact) <= rebuild_slack(tree) * 2.0**-24 * exact
    assert tree.total() == pytest.approx(exact_total(tree), rel=1e-6)


@pytest.mark.parametrize("factory", DRIFT_FACTORIES, ids=DRIFT_IDS)
def test_periodic_resum_removes_lost_increments(factory):
    rounds = 25
    resum_every = CAPACITY  # roughly once per round of 4095 updates
    tree = factory(CAPACITY, "float32", resum_every=resum_every)
    worst, exact = _adversarial(tree, rounds)
    # Between two resums at most resum_every increments of 0.25 can be lost.
    # (resum_every counts leaf writes, three per call here)
    assert worst <= 0.25 * resum_every + rebuild_slack(tree) * 2.0**-24 * exact + 2.0
    assert worst <= (resum_every + rebuild_slack(tree)) * 2.0**-24 * exact
    untouched = factory(CAPACITY, "float32", resum_every=10**12)
    worst_untouched, _ = _adversarial(untouched, rounds)
    assert worst * 10 < worst_untouched, (worst, worst_untouched)


@pytest.mark.parametrize("factory", DRIFT_FACTORIES, ids=DRIFT_IDS)
def test_default_resum_every(factory):
    small = factory(100, "float32")
    assert small.resum_every == 2**16
    big = factory(2**17 + 1, "float32")
    assert big.resum_every == 2**17 + 1
    assert factory(100, "float64").resum_every >= 2**62
    with pytest.raises(ValueError, match=r"resum_every must be >= 1, got 0"):
        factory(100, "float32", resum_every=0)


def _per_shrink(tree, rng):
    """The PER pattern: items enter at a large priority and their TD errors later bring them
    down 10**5-fold; the last quarter of the leaves ends at 0 (a zero tail)."""
    tree.update(np.arange(CAPACITY), rng.uniform(100, 1000, CAPACITY))
    for _ in range(8):
        tree.update(rng.integers(0, CAPACITY, CAPACITY), rng.uniform(100, 1000, CAPACITY))
    small = rng.uniform(0, 0.01, CAPACITY)
    small[3 * CAPACITY // 4 :] = 0.0
    tree.update(np.arange(CAPACITY), small)
    return small


@pytest.mark.parametrize("seed", [1, 3])
@pytest.mark.parametrize("factory", ALL_DRIFT_FACTORIES, ids=ALL_DRIFT_IDS)
def test_falling_total_keeps_relative_error_small(factory, seed):
    """The root's error is relative to the largest total since the last rebuild, so after a
    large fall of the total the tree must resum or the sampling distribution is off by tens
    of percent (and stratified draws in the phantom tail raise)."""
    rng = np.random.default_rng(seed)
    tree = factory(CAPACITY, "float32")  # default resum_every
    small = _per_shrink(tree, rng)
    exact = exact_total(tree)
    rel = abs(tree.total() - exact) / exact
    resum_every = getattr(tree, "resum_every", max(2**16, CAPACITY))
    assert rel <= (resum_every + CAPACITY + rebuild_slack(tree)) * 2.0**-24, rel
    idx, _ = tree.sample(256, rng, stratified=True)
    assert (small[idx] > 0).all()
    idx, _ = tree.sample(10**5, rng)
    counts = np.bincount(idx, minlength=CAPACITY)[small > 0]
    probs = small[small > 0] / small.sum()
    assert chisquare(counts, probs * counts.sum()).pvalue > 1e-3


@pytest.mark.parametrize("factory", DRIFT_FACTORIES, ids=DRIFT_IDS)
def test_steady_state_resums_once_per_resum_every(factory):
    """The resum trigger must not fire much more often than every resum_every updates when the
    total is steady (each rebuild costs O(capacity))."""
    rng = np.random.default_rng(5)
    tree = factory(CAPACITY, "float32")
    tree.update(np.arange(CAPACITY), rng.random(CAPACITY))
    before = tree.rebuilds  # the rule runs inside the compiled update: counted by the tree
    updates = 400 * BATCH * 10  # 10**6
    for _ in range(updates // 2500):
        tree.update(rng.integers(0, CAPACITY, 2500), rng.random(2500))
    expected = updates / tree.resum_every  # a rebuild follows the batch that reaches it
    calls = tree.rebuilds - before
    assert updates / (tree.resum_every + 2500) - 1 <= calls <= 1.1 * expected + 1, (calls, expected)

