"""numba kernels for the K-ary tree whose sibling groups hold running (prefix) sums.

Same address tables as :mod:`impl.trees.kernels` (level-order layouts only: siblings are
adjacent, stride 1, which lets LLVM vectorise the group loops), with one extra row at the end
that says where the raw leaf priorities live. What a slot holds differs: the slot of child ``c`` in a
sibling group holds the sum of children ``0 .. c`` of that group, so the last slot of a group
is its parent's subtree sum and the root's slot holds the total::

    children:  3   0   5   2            group slots:  3   3   8  10   (parent sum = 10)

Descent (:func:`impl.trees.ops.descend`): the child is the number of the first ``K - 1`` slots
that are ``<= u``, and ``u`` drops by the slot left of it. Those compares are independent of each other, so the scan
vectorises and has no chain of dependent adds, unlike the plain K-ary scan, whose K - 1
dependent adds per level make large K compute-bound.
Update: a leaf's delta is added to the slots from its position to the end of its group, at
every level (up to K adds per level, all in the same cache line when aligned), level by level
over the batch with each touched node once (:func:`impl.trees.kernels.propagate_batch`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .kernels import (STATUS_OK, addr, checked_values, level_row, min_of_children, narrow_levels, parent,
                      propagate_mins, row_addr, summed_by_parent)

__all__ = ["update", "fill", "get", "rebuild"]


@njit(nogil=True, cache=True, inline="always")
def _add_to_group(pre, lay, K, d, j, delta):
    """Add ``delta`` (already in the array's dtype) to the slots of node (d, j) and of its right
    siblings (:func:`_add_from`, the group found from the table row of depth ``d``)."""
    if d == 0:
        pre[addr(lay, 0, 0)] += delta
        return
    base, shift, bshift, mask, _ = level_row(lay, d)
    k = j & (K - 1)
    _add_from(pre, row_addr(base, shift, bshift, mask, j - k), k, K, delta)


@njit(nogil=True, cache=True, inline="always")
def _add_from(pre, first, k, K, delta):
    """Add ``delta`` to slots ``k .. K - 1`` of the sibling group starting at unsigned slot
    ``first``: a masked add over the whole group (no branch on ``k``; 3x faster than looping
    from slot ``k``)."""
    zero = delta - delta
    for c in range(K):
        pre[first + np.uint64(c)] += delta if c >= k else zero


@njit(nogil=True, cache=True)
def _set_leaves(pre, mins, lay, K, kshift, indices, values, touch_from):
    """Store ``values`` at the raw leaves ``indices`` (batch order: a repeated index keeps its
    last value) and propagate, level by level over the batch as
    :func:`impl.trees.kernels.propagate_batch` does: one group add per item on the wide levels
    (the leaves' groups included), one per changed node on the narrow upper levels (the deltas
    summed per node in float64 first), then the minima.

    Where the leaves' level leaves cache (``touch_from <= D``), a first pass only loads each
    item's raw leaf, the first and last slot of its leaves'-level group and its min slot (the
    three lines the first two loops then read and write), so the misses of the whole batch are
    in flight together, as the descent's touch passes do; the loops that follow find those
    lines in cache. Loads only: the tree ends the same."""
    D = lay.shape[0] - 2
    leaf_base = lay[D + 1, 0]
    n = indices.shape[0]
    delta = np.empty(n, dtype=np.float64)
    rounded = np.empty(n, dtype=pre.dtype)  # what a group adds: the delta in the tree's dtype
    old_min = np.empty(n, dtype=mins.dtype)
    if touch_from <= D:
        seen = np.empty(n, dtype=pre.dtype)  # the touch pass's loads, stored so they are kept
        base, shift, bshift, mask, _ = level_row(lay, D)
        last, leaves = np.uint64(K - 1), np.uint64(leaf_base)
        for b in range(n):
            i = np.uint64(indices[b])
            group = row_addr(base, shift, bshift, mask, i & ~last)
            seen[b] = pre[leaves + i] + pre[group] + pre[group + last] + mins[row_addr(base, shift, bshift, mask, i)]
    for b in range(n):
        a = leaf_base + indices[b]
        old = pre[a]
        pre[a] = values[b]
        delta[b] = np.float64(pre[a]) - np.float64(old)
        rounded[b] = delta[b]
        m = addr(lay, D, indices[b])
        old_min[b] = mins[m]
        mins[m] = pre[a] if pre[a] > 0.0 else np.inf  # stored value: may underflow
    L, width = narrow_levels(D, K, n)
    j = indices.copy()
    for d in range(D, L - 1, -1):
        if d == 0:  # a batch too small to have narrow levels reaches the root here
            for b in range(n):
                _add_to_group(pre, lay, K, 0, 0, rounded[b])
            break
        base, shift, bshift, mask, _ = level_row(lay, d)
        for b in range(n):
            k = j[b] & (K - 1)
            _add_from(pre, row_addr(base, shift, bshift, mask, j[b] - k), k, K, rounded[b])
            j[b] = parent(j[b], K, kshift)
    if L > 0:  # j holds depth-(L-1) nodes; the deltas of the items below each, summed
        acc = np.zeros(width, dtype=np.float64)
        for b in range(n):
            acc[j[b]] += delta[b]
        for d in range(L - 1, -1, -1):
            rounded_acc = acc.astype(pre.dtype)
            for q in range(width):
                if acc[q] != 0.0:
                    _add_to_group(pre, lay, K, d, q, rounded_acc[q])
            if d > 0:
                width //= K
                acc = summed_by_parent(np.arange(acc.shape[0]), acc, width, K, kshift)
    propagate_mins(mins, lay, K, kshift, indices, old_min, D, touch_from)


@njit(nogil=True, cache=True)
def update(pre, mins, lay, K, kshift, indices, values, n_valid, eps, alpha, vmax, touch_from):
    """As :func:`impl.trees.kernels.update`: checked, then ``(values + eps) ** alpha``."""
    status, pos, ps, pmax = checked_values(indices, values, n_valid, eps, alpha, vmax)
    if status != STATUS_OK:
        return status, pos, 0.0
    _set_leaves(pre, mins, lay, K, kshift, indices, ps, touch_from)
    return STATUS_OK, -1, pmax


@njit(nogil=True, cache=True)
def fill(pre, mins, lay, K, kshift, start, count, capacity, p, touch_from):
    """As :func:`impl.trees.kernels.fill` (O(count * K * D) here: no run merging)."""
    indices = np.empty(count, dtype=np.int64)
    for b in range(count):
        i = start + b
        indices[b] = i if i < capacity else i - capacity
    _set_leaves(pre, mins, lay, K, kshift, indices, np.full(count, p), touch_from)


@njit(nogil=True, cache=True)
def get(pre, lay, indices, out):
    leaf_base = lay[lay.shape[0] - 1, 0]
    for b in range(indices.shape[0]):
        out[b] = pre[leaf_base + indices[b]]


@njit(nogil=True, cache=True)
def rebuild(pre, mins, lay, K):
    """Recompute every group's running sums and every minimum from the leaves, O(N)."""
    D = lay.shape[0] - 2
    leaf_base = lay[D + 1, 0]
    n = 1
    for _ in range(D):
        n *= K
    for j in range(n):
        v = pre[leaf_base + j]
        mins[addr(lay, D, j)] = v if v > 0.0 else np.inf
    # Level d's slots are running sums over each sibling group of the values of level d's
    # nodes; a node's value is its leaf (d = D) or the last slot of its children's group.
    for d in range(D, -1, -1):
        s = 0.0
        for j in range(n):
            if d == 0 or j % K == 0:
                s = 0.0
            s += pre[leaf_base + j] if d == D else pre[addr(lay, d + 1, j * K + K - 1)]
            pre[addr(lay, d, j)] = s
            if d < D:
                mins[addr(lay, d, j)] = min_of_children(mins, lay, K, d, j)
        n //= K
