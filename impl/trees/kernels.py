"""numba kernels shared by every array-backed sum tree.

Every tree layout in this package (binary heap, K-ary level order, cache-aligned K-ary,
cache-blocked binary; the prefix-sum tree reuses them too) is described by the same small *address table*, so one kernel set
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
* Updates propagate the difference ``delta = new - old`` to every ancestor (PAL's scheme),
  level-synchronously over the batch with each touched node written once
  (:func:`propagate_batch`); ``mins`` compares children and parent on the way up, re-reads all
  K children only when a minimum rises, and stops at the first unchanged ancestor.
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
    "STATUS_OVERFLOW",
    "update",
    "fill",
    "find",
    "get",
    "rebuild",
    "write_leaves",
    "propagate_paths",
    "propagate_batch",
    "add_to_group",
]

STATUS_OK = 0
STATUS_INDEX = 1
STATUS_NONFINITE = 2
STATUS_NEGATIVE = 3
STATUS_OVERFLOW = 4  # finite input whose (p + eps) ** alpha the tree's dtype cannot hold


@njit(nogil=True, cache=True, inline="always")
def addr(lay, d, j):
    return lay[d, 0] + ((j >> lay[d, 1]) << lay[d, 2]) + (j & lay[d, 3])


@njit(nogil=True, cache=True, inline="always")
def parent(j, K, kshift):
    # An integer division costs ~25 cycles; every power-of-two K takes the shift instead.
    if kshift >= 0:
        return j >> kshift
    return j // K


@njit(nogil=True, cache=True)
def _set_leaves(sums, mins, lay, K, kshift, indices, values):
    """Store ``values`` at leaves ``indices`` and propagate (:func:`propagate_batch`).

    The leaves are written in batch order, so a repeated index keeps its last value and each
    delta is taken against the value before it (their sum is the leaf's whole change).
    """
    D = lay.shape[0] - 1
    n = indices.shape[0]
    delta = np.empty(n, dtype=np.float64)
    old_min = np.empty(n, dtype=mins.dtype)
    for b in range(n):
        leaf = addr(lay, D, indices[b])
        old = sums[leaf]
        sums[leaf] = values[b]
        # the delta of the values *as stored*, so float32 trees propagate what they hold
        delta[b] = np.float64(sums[leaf]) - np.float64(old)
        old_min[b] = mins[leaf]
        mins[leaf] = sums[leaf] if sums[leaf] > 0.0 else np.inf  # stored value: may underflow
    propagate_batch(sums, mins, lay, K, kshift, D, indices, delta, old_min, False)


@njit(nogil=True, cache=True, inline="always")
def add_to_group(pre, lay, K, d, j, delta, cast):
    """Add ``delta`` (a float64) to the running-sum slots of node (d, j) and of its right
    siblings: the prefix tree's update of one level (:mod:`impl.trees.prefix_kernels`).

    Written as a masked add over the whole group with ``delta`` rounded to the array's dtype
    first (through ``cast``, a one-slot array of that dtype), which LLVM turns into a few SIMD
    adds: 3x faster than looping from j's slot.
    """
    cast[0] = delta
    dd = cast[0]
    if d == 0:
        pre[addr(lay, 0, 0)] += dd
        return
    k = j & (K - 1)
    group = pre[addr(lay, d, j - k) : addr(lay, d, j - k) + K]
    zero = dd - dd
    for c in range(K):
        group[c] += dd if c >= k else zero


@njit(nogil=True, cache=True)
def propagate_batch(sums, mins, lay, K, kshift, D, indices, delta, old_min, prefix):
    """Bring every ancestor of leaves ``indices`` (depth ``D``; leaves already written) up to
    date for the whole batch, one level at a time, each touched node written once.

    ``delta[b]``: the change of leaf ``indices[b]`` by item ``b``; ``old_min[b]``: its min slot
    before item ``b`` wrote it. The batch is sorted once (stable) and merged into distinct
    leaves (deltas summed, the first write's old minimum kept); parents keep that order
    (``parent`` is monotone), so at each level the nodes sharing a parent are neighbours and
    are merged too: the parent's sum gets one add of their summed deltas, and its minimum is
    settled from all of them at once (lowered to the smallest changed child, re-read from its
    K children only when a child that held the minimum rose; a parent whose minimum does not
    change stops the minimum's climb, the sums go on to the root). With ``prefix`` the sums are
    the running-sum groups of the prefix tree (:func:`add_to_group`, from depth ``D`` on).

    One pass per level over at most ``n`` nodes, so the loads of different nodes are
    independent and the core keeps several misses in flight; a node shared by many items
    (the upper levels, repeated or clustered indices) costs one add, not one per item. Cost:
    O(n log n) for the sort plus O(n D) adds and typically O(n) minima loads (O(n K D) worst
    case). Sums are added in float64 per node, rounded once into the tree's dtype.
    """
    n = indices.shape[0]
    if n == 0:
        return
    order = np.argsort(indices, kind="mergesort")
    cast = np.empty(1, dtype=sums.dtype)
    j = np.empty(n, dtype=np.int64)
    dl = np.empty(n, dtype=np.float64)
    prev = np.empty(n, dtype=mins.dtype)
    live = np.empty(n, dtype=np.bool_)  # whether the node's minimum changed (its parent must look)
    m = 0
    for r in range(n):
        b = order[r]
        if m > 0 and j[m - 1] == indices[b]:
            dl[m - 1] += delta[b]
        else:
            j[m] = indices[b]
            dl[m] = delta[b]
            prev[m] = old_min[b]
            m += 1
    for r in range(m):
        if prefix:
            add_to_group(sums, lay, K, D, j[r], dl[r], cast)
        # a leaf's minimum changed unless it was rewritten with what it held
        live[r] = mins[addr(lay, D, j[r])] != prev[r]
    for d in range(D - 1, -1, -1):
        w = -1
        p = -1
        acc = 0.0
        mp = mins[0]
        lower = mp
        raised = False
        any_live = False
        for r in range(m + 1):
            q = parent(j[r], K, kshift) if r < m else -2
            if q != p:
                if w >= 0:  # settle parent p (group w) before starting the next
                    a = addr(lay, d, p)
                    if prefix:
                        add_to_group(sums, lay, K, d, p, acc, cast)
                    else:
                        sums[a] += acc
                    changed = False
                    if any_live:
                        new = min_of_children(mins, lay, K, d, p) if raised else min(mp, lower)
                        if new != mp:
                            mins[a] = new
                            changed = True
                    j[w] = p
                    dl[w] = acc
                    prev[w] = mp
                    live[w] = changed
                if r == m:
                    break
                w += 1
                p = q
                acc = 0.0
                mp = mins[addr(lay, d, p)]
                lower = mp
                raised = False
                any_live = False
            acc += dl[r]
            if live[r]:
                any_live = True
                c = mins[addr(lay, d + 1, j[r])]
                if c < lower:
                    lower = c
                if c > mp and prev[r] == mp:
                    raised = True  # this child held the minimum and rose: re-read all K
        m = w + 1


@njit(nogil=True, cache=True, inline="always")
def min_of_children(mins, lay, K, d, q):
    """Smallest value among the K children of node (d, q)."""
    first = addr(lay, d + 1, q * K)
    stride = lay[d + 1, 4]
    m = mins[first]
    for k in range(1, K):
        c = mins[first + k * stride]
        if c < m:
            m = c
    return m


@njit(nogil=True, cache=True)
def _fill_run(sums, mins, lay, K, kshift, lo, n, p):
    """Set leaves ``lo .. lo+n-1`` to ``p``. The touched nodes of each level form one run,
    so the deltas are summed per parent and each touched ancestor is written once:
    O(n + K * D) instead of O(n * D) for a batch of neighbours."""
    D = lay.shape[0] - 1
    delta = np.empty(n, dtype=np.float64)
    for b in range(n):
        leaf = addr(lay, D, lo + b)
        old = sums[leaf]
        sums[leaf] = p
        delta[b] = np.float64(sums[leaf]) - np.float64(old)
        mins[leaf] = sums[leaf] if sums[leaf] > 0.0 else np.inf  # stored value: may underflow
    jlo, jhi = lo, lo + n - 1
    for d in range(D - 1, -1, -1):
        plo, phi = parent(jlo, K, kshift), parent(jhi, K, kshift)
        up = np.zeros(phi - plo + 1, dtype=np.float64)
        for j in range(jlo, jhi + 1):
            up[parent(j, K, kshift) - plo] += delta[j - jlo]
        for q in range(plo, phi + 1):
            a = addr(lay, d, q)
            sums[a] += up[q - plo]
            mins[a] = min_of_children(mins, lay, K, d, q)
        delta = up
        jlo, jhi = plo, phi


@njit(nogil=True, cache=True)
def fill(sums, mins, lay, K, kshift, start, count, capacity, p):
    """Set ``count`` consecutive leaves from ``start`` (wrapping at ``capacity``) to ``p``.

    The ring-buffer insert at a fixed priority. ``p`` must be finite and >= 0 (unchecked).
    Cost: O(count + K * D) per contiguous run (at most two runs).
    """
    first = min(count, capacity - start)
    if first > 0:
        _fill_run(sums, mins, lay, K, kshift, start, first, p)
    if count > first:
        _fill_run(sums, mins, lay, K, kshift, 0, count - first, p)


@njit(nogil=True, cache=True)
def update(sums, mins, lay, K, kshift, indices, values, n_valid, eps, alpha, vmax):
    """Set leaves ``indices`` to ``(values + eps) ** alpha`` and propagate.

    All inputs are checked before anything is written, so a bad batch leaves the tree as it
    was; a transformed value above ``vmax`` (the dtype's largest) is refused. Returns
    ``(status, position, max_priority)``: ``status`` is one of the ``STATUS_*``
    codes and ``position`` the offending batch position (``-1`` when ok).

    Cost: O(n * D) for the sums plus O(n * K * D) for the minima in the worst case (one
    cache line per level for aligned layouts); duplicates are applied in batch order.
    """
    status, pos, ps, pmax = checked_values(indices, values, n_valid, eps, alpha, vmax)
    if status != STATUS_OK:
        return status, pos, 0.0
    _set_leaves(sums, mins, lay, K, kshift, indices, ps)
    return STATUS_OK, -1, pmax


@njit(nogil=True, cache=True)
def write_leaves(sums, mins, lay, indices, values, n_valid, eps, alpha, vmax, out_delta):
    """The first half of :func:`update`: check, transform and store the leaves only.

    ``out_delta[b]`` receives the change of leaf ``indices[b]`` as stored; the inner nodes
    stay as they were until :func:`propagate_paths` adds those deltas (the deferred and
    two-lock policies split an update this way). Returns ``(status, position, max)`` as
    :func:`update` does; nothing is written unless the whole batch is valid. Cost O(n).
    """
    status, pos, ps, pmax = checked_values(indices, values, n_valid, eps, alpha, vmax)
    if status != STATUS_OK:
        return status, pos, 0.0
    D = lay.shape[0] - 1
    for b in range(indices.shape[0]):
        leaf = addr(lay, D, indices[b])
        old = sums[leaf]
        sums[leaf] = ps[b]
        out_delta[b] = np.float64(sums[leaf]) - np.float64(old)
        mins[leaf] = sums[leaf] if sums[leaf] > 0.0 else np.inf
    return STATUS_OK, -1, pmax


@njit(nogil=True, cache=True)
def propagate_paths(sums, mins, lay, K, kshift, indices, delta):
    """Add ``delta[b]`` to every ancestor of leaf ``indices[b]`` and recompute their minima.

    The second half of a split update (see :func:`write_leaves`), level by level for the whole
    batch. Each ancestor's minimum is re-read from its K children, so the result does not
    depend on what the minima held before (a deferred queue may hold many writes of one leaf).
    Cost O(n * K * D).
    """
    D = lay.shape[0] - 1
    j = indices.copy()
    for d in range(D - 1, -1, -1):
        for b in range(j.shape[0]):
            j[b] = parent(j[b], K, kshift)
            a = addr(lay, d, j[b])
            sums[a] += delta[b]
            mins[a] = min_of_children(mins, lay, K, d, j[b])


@njit(nogil=True, cache=True, inline="always")
def checked_values(indices, values, n_valid, eps, alpha, vmax):
    """The input side of every update kernel: ``(status, position, p, max p)`` where ``p`` is
    ``(values + eps) ** alpha``, valid only when ``status`` is ``STATUS_OK``. Writes nothing."""
    status, pos = check_batch(indices, values, n_valid)
    if status != STATUS_OK:
        return status, pos, np.empty(0, dtype=np.float64), 0.0
    ps, pmax, pos = transform(values, eps, alpha, vmax)
    if pos >= 0:
        return STATUS_OVERFLOW, pos, ps, 0.0
    return STATUS_OK, -1, ps, pmax


@njit(nogil=True, cache=True, inline="always")
def check_batch(indices, values, n_valid):
    """``(status, first bad position)`` of an update batch; nothing is written."""
    for b in range(indices.shape[0]):
        i = indices[b]
        if i < 0 or i >= n_valid:
            return STATUS_INDEX, b
        v = values[b]
        if not np.isfinite(v):
            return STATUS_NONFINITE, b
        if v < 0.0:
            return STATUS_NEGATIVE, b
    return STATUS_OK, -1


@njit(nogil=True, cache=True, inline="always")
def transform(values, eps, alpha, vmax):
    """``(values + eps) ** alpha`` as float64, its maximum, and the first position whose
    result exceeds ``vmax`` (``-1`` if none)."""
    ps = np.empty(values.shape[0], dtype=np.float64)
    pmax = 0.0
    for b in range(values.shape[0]):
        v = values[b] + eps
        ps[b] = v if alpha == 1.0 else v**alpha
        if not ps[b] <= vmax:
            return ps, pmax, b
        pmax = max(pmax, ps[b])
    return ps, pmax, -1


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
            first = addr(lay, d, j[b] * K)
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
    return read_reached_leaves(sums, lay, D, out_index, out_priority)


@njit(nogil=True, cache=True, inline="always")
def read_reached_leaves(values, lay, row, out_index, out_priority):
    """Priorities of the leaves the descents reached (``out_index``, addressed by table row
    ``row``) into ``out_priority``; a zero leaf turns its entry into ``-1``. Returns how many."""
    misses = 0
    for b in range(out_index.shape[0]):
        p = values[addr(lay, row, out_index[b])]
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
        out[b] = sums[addr(lay, D, indices[b])]


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
        a = addr(lay, D, j)
        mins[a] = sums[a] if sums[a] > 0.0 else np.inf
    for d in range(D - 1, -1, -1):
        n //= K
        stride = lay[d + 1, 4]
        for j in range(n):
            first = addr(lay, d + 1, j * K)
            s = 0.0
            for k in range(K):
                s += sums[first + k * stride]
            a = addr(lay, d, j)
            sums[a] = s
            mins[a] = min_of_children(mins, lay, K, d, j)
