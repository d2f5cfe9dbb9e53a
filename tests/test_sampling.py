"""Sampling distributions and importance weights of every prioritized variant.

Frequencies are checked with a chi-square goodness-of-fit test at a fixed seed (p > 1e-3);
control tests show the same test rejects a wrong distribution, so a pass means something.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from replaybench.impl import registry

from _support import DTYPES, PRIORITIZED, TREE_FACTORIES, TREE_IDS, TREE_VARIANTS, dtype_kw, prioritized_with_dtypes

FIELDS = {"id": ((), "int64")}
DRAWS = 10**5
BATCH = 1000


def make_buffer(name, capacity, priorities, **params):
    buf = registry.create(name, capacity=capacity, fields=FIELDS, **params)
    n = len(priorities)
    buf.add({"id": np.arange(n, dtype=np.int64)}, priorities=np.asarray(priorities, dtype=np.float64))
    return buf


def draw_counts(buf, capacity, seed=2024, draws=DRAWS, batch=BATCH):
    rng = np.random.default_rng(seed)
    counts = np.zeros(capacity, dtype=np.int64)
    for _ in range(draws // batch):
        out = buf.sample(batch, rng=rng)
        np.testing.assert_array_equal(out["id"], out["indices"])  # ids were written at slot = id
        counts += np.bincount(out["indices"], minlength=capacity)
    return counts


def chi2_p(counts, probs):
    """p-value of counts ~ Multinomial(sum(counts), probs), over the cells with probs > 0."""
    probs = np.asarray(probs, dtype=np.float64)
    assert counts[probs == 0].sum() == 0, "a zero-probability item was sampled"
    keep = probs > 0
    f_exp = probs[keep] / probs[keep].sum() * counts.sum()
    return chisquare(counts[keep], f_exp=f_exp).pvalue


def test_there_are_prioritized_variants():
    assert {"binary", "binary-blocked", "kary", "kary-aligned"} <= set(PRIORITIZED)


# --------------------------------------------------------------------------------------------
# Frequencies
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stratified", [False, True], ids=["plain", "stratified"])
@pytest.mark.parametrize("name", PRIORITIZED)
def test_frequencies_match_priorities(name, stratified, cache):
    """Default ("auto") speed settings; with the tiny cache they are rows and every touch pass."""
    capacity = 37  # not a power of any K
    prios = np.random.default_rng(7).uniform(0.2, 3.0, capacity)
    buf = make_buffer(name, capacity, prios, alpha=1.0, eps=0.0, stratified=stratified)
    counts = draw_counts(buf, capacity)
    assert counts.sum() == DRAWS
    p = chi2_p(counts, prios)
    assert p > 1e-3, f"{name}: sampled frequencies do not follow priority/total (p = {p:.3g})"


@pytest.mark.parametrize("stratified", [False, True], ids=["plain", "stratified"])
@pytest.mark.parametrize("name", PRIORITIZED)
def test_frequencies_follow_eps_and_alpha(name, stratified):
    """P(i) is proportional to (priority + eps) ** alpha, zero priorities included."""
    capacity = 23
    prios = np.random.default_rng(8).uniform(0.0, 4.0, capacity)
    prios[::4] = 0.0
    alpha, eps = 0.6, 0.05
    buf = make_buffer(name, capacity, prios, alpha=alpha, eps=eps, stratified=stratified)
    counts = draw_counts(buf, capacity, seed=99)
    p = chi2_p(counts, (prios + eps) ** alpha)
    assert p > 1e-3, f"{name}: frequencies do not follow (priority + eps) ** alpha (p = {p:.3g})"
    assert (counts[::4] > 0).all(), "eps must keep zero-priority items sampleable"


@pytest.mark.parametrize("name", PRIORITIZED)
def test_chi_square_detects_a_wrong_distribution(name):
    """Control: the samples above are rejected against a slightly wrong expectation, and
    uniform samples are rejected against the priorities."""
    capacity = 37
    prios = np.random.default_rng(7).uniform(0.2, 3.0, capacity)
    buf = make_buffer(name, capacity, prios, alpha=1.0, eps=0.0)
    counts = draw_counts(buf, capacity)
    assert chi2_p(counts, prios) > 1e-3
    perturbed = prios.copy()
    perturbed[0] *= 1.25  # one item out of 37 off by 25%
    assert chi2_p(counts, perturbed) < 1e-6
    swapped = prios.copy()
    a, b = np.argmin(prios), np.argmax(prios)
    swapped[[a, b]] = swapped[[b, a]]
    assert chi2_p(counts, swapped) < 1e-6
    uniform = registry.create("uniform", capacity=capacity, fields=FIELDS)
    uniform.add({"id": np.arange(capacity, dtype=np.int64)})
    assert chi2_p(draw_counts(uniform, capacity), prios) < 1e-6


def test_uniform_variant_is_uniform():
    buf = registry.create("uniform", capacity=40, fields=FIELDS)
    buf.add({"id": np.arange(25, dtype=np.int64)})
    counts = draw_counts(buf, 40)
    assert counts[25:].sum() == 0, "sampled a slot that holds nothing"
    assert chi2_p(counts, np.r_[np.ones(25), np.zeros(15)]) > 1e-3


@pytest.mark.parametrize("name", PRIORITIZED)
def test_updated_priorities_change_frequencies(name):
    capacity = 29
    buf = make_buffer(name, capacity, np.ones(capacity), alpha=1.0, eps=0.0)
    td = np.random.default_rng(3).normal(0.0, 2.0, capacity)
    buf.update_priorities(np.arange(capacity), np.abs(td))
    counts = draw_counts(buf, capacity, seed=5)
    assert chi2_p(counts, np.abs(td)) > 1e-3
    assert chi2_p(counts, np.ones(capacity)) < 1e-6  # the old distribution is gone


# --------------------------------------------------------------------------------------------
# Stratification
# --------------------------------------------------------------------------------------------


def _max_batch_deviation(buf, capacity, probs, n, batches, seed):
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(batches):
        c = np.bincount(buf.sample(n, rng=rng)["indices"], minlength=capacity)
        worst = max(worst, np.abs(c - n * probs).max())
    return worst


@pytest.mark.parametrize("name", PRIORITIZED)
def test_stratified_batches_have_one_draw_per_segment(name):
    """With stratification each batch's count of item i is within 2 of n * P(i) (item i covers
    all but its two end segments); independent draws wander by ~sqrt(n * P(i))."""
    capacity, n = 11, 1000
    prios = np.random.default_rng(1).uniform(0.5, 2.0, capacity)
    probs = prios / prios.sum()
    strat = make_buffer(name, capacity, prios, alpha=1.0, eps=0.0, stratified=True)
    assert _max_batch_deviation(strat, capacity, probs, n, 50, seed=11) <= 2.0
    plain = make_buffer(name, capacity, prios, alpha=1.0, eps=0.0, stratified=False)
    assert _max_batch_deviation(plain, capacity, probs, n, 50, seed=11) > 5.0


# --------------------------------------------------------------------------------------------
# Importance weights
# --------------------------------------------------------------------------------------------


def expected_weights(p_stored, beta, idx):
    """(N P(i)) ** -beta / max_j (N P(j)) ** -beta over the stored items with P(j) > 0."""
    p_stored = np.asarray(p_stored, dtype=np.float64)
    N = p_stored.size
    P = p_stored / p_stored.sum()
    positive = P > 0
    w_all = np.full(N, np.inf)
    w_all[positive] = (N * P[positive]) ** -beta
    return w_all[idx] / w_all[positive].max()


def check_weights(buf, raw, beta, alpha, eps, rng, rtol):
    p_stored = (np.asarray(raw, dtype=np.float64) + eps) ** alpha
    assert len(buf) == p_stored.size
    out = buf.sample(2000, beta=beta, rng=rng)
    assert out["weights"].dtype == np.float32
    assert out["weights"].shape == (2000,)
    want = expected_weights(p_stored, beta, out["indices"])
    np.testing.assert_allclose(out["weights"], want, rtol=rtol, atol=0)
    assert (out["weights"] <= 1.0 + rtol).all()


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("name,dtype", prioritized_with_dtypes())
def test_importance_weights(name, dtype, beta, cache):
    rng = np.random.default_rng(21)
    alpha, eps, capacity = 0.7, 0.0, 50
    buf = registry.create(name, capacity=capacity, fields=FIELDS, alpha=alpha, eps=eps, **dtype_kw(dtype))
    rtol = 1e-5
    # 30 items, some with priority 0: those are never sampled and must not set the normaliser.
    raw = rng.uniform(0.05, 5.0, 30)
    raw[[3, 17]] = 0.0
    buf.add({"id": np.arange(30)}, priorities=raw)
    check_weights(buf, raw, beta, alpha, eps, rng, rtol)
    # Raise the smallest positive priority: the normaliser must follow.
    smallest = int(np.argmin(np.where(raw > 0, raw, np.inf)))
    raw[smallest] = 10.0
    buf.update_priorities([smallest], [10.0])
    check_weights(buf, raw, beta, alpha, eps, rng, rtol)
    # Wrap around: 40 more items evict the 20 oldest (slots 0..19 are overwritten).
    more = rng.uniform(0.5, 1.5, 40)
    buf.add({"id": np.arange(30, 70)}, priorities=more)
    stored = np.empty(capacity)
    stored[30:50] = more[:20]
    stored[0:20] = more[20:]
    stored[20:30] = raw[20:30]
    check_weights(buf, stored, beta, alpha, eps, rng, rtol)


@pytest.mark.parametrize("name", TREE_VARIANTS)
def test_weights_with_priorities_that_round_to_zero(name):
    """eps = 0 and a priority too small for a float32 tree: that item is unsampleable and the
    weights are normalised by the smallest priority actually held (no 0 or inf weights)."""
    buf = registry.create(name, capacity=8, fields=FIELDS, alpha=1.0, eps=0.0)
    prios = np.array([1e-50, 1.0, 2.0, 4.0])
    buf.add({"id": np.arange(4)}, priorities=prios)
    out = buf.sample(1000, beta=1.0, rng=np.random.default_rng(0))
    assert np.isfinite(out["weights"]).all()
    held = prios.astype(buf.tree.dtype).astype(np.float64)
    want = expected_weights(held, 1.0, out["indices"]).astype(np.float32)  # may underflow
    np.testing.assert_allclose(out["weights"], want, rtol=1e-5)
    if held[0] == 0.0:  # the tree holds 0 for it (float32): the others set the normaliser
        assert (out["weights"] > 0).all()


@pytest.mark.parametrize("name", PRIORITIZED)
def test_default_beta_is_used(name):
    buf = registry.create(name, capacity=8, fields=FIELDS, alpha=1.0, eps=0.0, beta=0.8)
    buf.add({"id": np.arange(8)}, priorities=np.arange(1.0, 9.0))
    out = buf.sample(500, rng=np.random.default_rng(0))
    np.testing.assert_allclose(out["weights"], expected_weights(np.arange(1.0, 9.0), 0.8, out["indices"]),
                               rtol=1e-5)


# --------------------------------------------------------------------------------------------
# Zero priorities
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stratified", [False, True], ids=["plain", "stratified"])
@pytest.mark.parametrize("name,dtype", prioritized_with_dtypes())
def test_zero_priorities_are_never_sampled(name, dtype, stratified):
    capacity = 100
    rng = np.random.default_rng(4)
    # Positive priorities over twelve orders of magnitude, so float32 rounding in the inner
    # sums is as large as it gets next to the zero leaves.
    prios = 10.0 ** rng.uniform(-6, 6, capacity)
    zero = rng.permutation(capacity)[: capacity // 2]
    prios[zero] = 0.0
    buf = make_buffer(name, capacity, prios, alpha=1.0, eps=0.0, stratified=stratified, **dtype_kw(dtype))
    counts = draw_counts(buf, capacity, seed=6)
    assert counts.sum() == DRAWS
    assert counts[zero].sum() == 0, f"zero-priority items sampled: {np.flatnonzero(counts[zero])}"


@pytest.mark.parametrize("stratified", [False, True], ids=["plain", "stratified"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("factory", TREE_FACTORIES, ids=TREE_IDS)
def test_trees_never_sample_zero_leaves(factory, dtype, stratified):
    capacity = 257
    rng = np.random.default_rng(10)
    tree = factory(capacity, dtype)
    prios = 10.0 ** rng.uniform(-6, 6, capacity)
    prios[rng.random(capacity) < 0.5] = 0.0
    # Ten rounds of churn so the float32 inner sums carry some drift.
    for _ in range(10):
        idx = rng.integers(0, capacity, 200)
        tree.update(idx, 10.0 ** rng.uniform(-6, 6, 200))
    tree.update(np.arange(capacity), prios)
    idx, prio = tree.sample(DRAWS, rng, stratified=stratified)
    assert (prios[idx] > 0).all()
    np.testing.assert_array_equal(prio, tree.get(idx))
