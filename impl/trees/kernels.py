"""numba kernels shared by every array-backed sum tree.

Every tree layout in this package (binary heap, K-ary level order, cache-aligned K-ary,
cache-blocked binary) is described by the same small *address table*, so one kernel set
serves them all and the layouts differ only in where a node lives, which is exactly what the
benchmarks compare.

Address table
-------------
A tree of branching factor ``K`` has depths ``0 .. D`` (root at 0, leaves at ``D``); depth
``d`` holds ``K**d`` nodes numbered ``j = 0 .. K**d - 1`` from the left. ``lay`` is an int64
array of shape ``(D + 1, 5)``; row ``d`` holds ``base, shift, bshift, mask, stride`` and::

    addr(d, j)      = base + ((j >> shift) << bshift) + (j & mask)
    addr(d+1, j*K+k) = addr(d+1, j*K) + k * stride[d+1]      (the k-th child of (d, j))

Level order (heap) layouts use ``shift = bshift = mask = 0`` and ``stride = 1``, so
``addr = base + j``. The cache-blocked layout packs 4-level binary subtrees into 16-slot
blocks (see :mod:`impl.trees.layouts`).

Conventions
-----------
* ``sums`` holds subtree sums; ``mins`` holds the minimum *positive* leaf in each subtree
  (``+inf`` when there is none), so zero-priority leaves never set the weight normaliser.
* Updates propagate the difference ``delta = new - old`` to every ancestor (PAL's scheme);
  ``mins`` is recomputed from the children and stops early once an ancestor is unchanged.
* None of these kernels lock anything: callers serialise access (see the concurrency
  policies). They release the GIL (``nogil=True``) so threads really run in parallel.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "STATUS_OK",
    "STATUS_INDEX",
    "STATUS_NONFINITE",
    "STATUS_NEGATIVE",
    "update",
    "find",
    "get",
    "rebuild",
]

STATUS_OK = 0
STATUS_INDEX = 1
STATUS_NONFINITE = 2
STATUS_NEGATIVE = 3


@njit(nogil=True, cache=True, inline="always")
def _addr(lay, d, j):
    return lay[d, 0] + ((j >> lay[d, 1]) << lay[d, 2]) + (j & lay[d, 3])


@njit(nogil=True, cache=True, inline="always")
def _parent(j, K, kshift):
    # An integer division costs ~25 cycles; every power-of-two K takes the shift instead.
    if kshift >= 0:
        return j >> kshift
    return j // K


@njit(nogil=True, cache=True)
def update(sums, mins, lay, K, kshift, indices, values, n_valid, eps, alpha):
    """Set leaves ``indices`` to ``(values + eps) ** alpha`` and propagate.

    All inputs are checked before anything is written, so a bad batch leaves the tree as it
    was. Returns ``(status, position, max_priority)``: ``status`` is one of the ``STATUS_*``
    codes and ``position`` the offending batch position (``-1`` when ok).

    Cost: O(n * D) for the sums plus O(n * K * D) for the minima in the worst case (one
    cache line per level for aligned layouts); duplicates are applied in batch order.
    """
    n = indices.shape[0]
    for b in range(n):
        i = indices[b]
        if i < 0 or i >= n_valid:
            return STATUS_INDEX, b, 0.0
        v = values[b]
        if not np.isfinite(v):
            return STATUS_NONFINITE, b, 0.0
        if v < 0.0:
            return STATUS_NEGATIVE, b, 0.0
    D = lay.shape[0] - 1
    pmax = 0.0
    for b in range(n):
        v = values[b] + eps
        p = v if alpha == 1.0 else v**alpha
        leaf = _addr(lay, D, indices[b])
        old = sums[leaf]
        sums[leaf] = p
        # delta of the values *as stored*, so float32 trees propagate exactly what they hold
        delta = np.float64(sums[leaf]) - np.float64(old)
        if p > pmax:
            pmax = p
        j = indices[b]
        for d in range(D - 1, -1, -1):
            j = _parent(j, K, kshift)
            sums[_addr(lay, d, j)] += delta
        mins[leaf] = sums[leaf] if p > 0.0 else np.inf
        j = indices[b]
        for d in range(D - 1, -1, -1):
            j = _parent(j, K, kshift)
            first = _addr(lay, d + 1, j * K)
            stride = lay[d + 1, 4]
            m = mins[first]
            for k in range(1, K):
                c = mins[first + k * stride]
                if c < m:
                    m = c
            a = _addr(lay, d, j)
            if mins[a] == m:
                break  # unchanged here, so unchanged above
            mins[a] = m
    return STATUS_OK, -1, pmax


@njit(nogil=True, cache=True)
def find(sums, lay, K, us, out_index, out_priority):
    """Prefix-sum search: for each ``u`` the leaf ``i`` with ``S(i-1) <= u < S(i)``.

    ``S`` is the running sum of the leaves in index order. At each level the child is the
    number of running child sums ``<= u`` among the first ``K - 1`` children (the last child
    needs no comparison), and ``u`` drops by the mass to its left: PAL's left-to-right scan,
    written without branches. The whole batch descends one level at a time, so the loads of
    different draws are independent and the core keeps several cache misses in flight; a
    branchy per-draw descent measured 1.3x (K=16) to 3.7x (blocked) slower at 2**20 leaves.

    Rounding can push ``u`` past a subtree's stored sum and land on a zero leaf; such draws
    get index ``-1`` (priority 0) so the caller redraws them: a zero-priority leaf is never
    returned. Returns the number of ``-1`` entries. Cost: O(n * K * D) flops, and one cache
    line per level per draw for aligned layouts; the K - 1 dependent adds per level make
    large K compute-bound.
    """
    D = lay.shape[0] - 1
    n = us.shape[0]
    u = us.copy()
    j = out_index
    j[:] = 0
    for d in range(1, D + 1):
        stride = lay[d, 4]
        for b in range(n):
            first = _addr(lay, d, j[b] * K)
            ub = u[b]
            s = 0.0
            left = 0.0
            k = 0
            for c in range(K - 1):
                s += sums[first + c * stride]
                passed = s <= ub
                k += passed
                left = s if passed else left
            u[b] = ub - left
            j[b] = j[b] * K + k
    misses = 0
    for b in range(n):
        p = sums[_addr(lay, D, j[b])]
        if p > 0.0:
            out_priority[b] = p
        else:
            out_index[b] = -1
            out_priority[b] = 0.0
            misses += 1
    return misses


@njit(nogil=True, cache=True)
def get(sums, lay, indices, out):
    """Leaf values at ``indices`` (unchecked; callers validate). Cost O(n)."""
    D = lay.shape[0] - 1
    for b in range(indices.shape[0]):
        out[b] = sums[_addr(lay, D, indices[b])]


@njit(nogil=True, cache=True)
def rebuild(sums, mins, lay, K):
    """Recompute every inner node (sums and minima) from the leaves. Cost O(N) in total.

    Sums accumulate in float64, so afterwards each node is within ``K * D`` rounding steps of
    its exact value whatever drift delta propagation had accumulated.
    """
    D = lay.shape[0] - 1
    n = 1
    for _ in range(D):
        n *= K
    for j in range(n):
        a = _addr(lay, D, j)
        mins[a] = sums[a] if sums[a] > 0.0 else np.inf
    for d in range(D - 1, -1, -1):
        n //= K
        stride = lay[d + 1, 4]
        for j in range(n):
            first = _addr(lay, d + 1, j * K)
            s = 0.0
            m = np.inf
            for k in range(K):
                s += sums[first + k * stride]
                c = mins[first + k * stride]
                if c < m:
                    m = c
            a = _addr(lay, d, j)
            sums[a] = s
            mins[a] = m
