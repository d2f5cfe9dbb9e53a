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
  level-synchronously over the batch, each node of the narrow upper levels written once with
  the summed deltas below it (:func:`propagate_batch`); ``mins`` compares child and parent on
  the way up, re-reads all K children only when a minimum rises, and stops at the first
  unchanged ancestor (:func:`propagate_mins`).
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
    "get",
    "rebuild",
    "write_leaves",
    "propagate_paths",
    "propagate_batch",
    "propagate_mins",
    "narrow_levels",
    "summed_by_parent",
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
def level_row(lay, d):
    """Row ``d`` of the address table as unsigned locals ``(base, shift, bshift, mask, stride)``
    for :func:`row_addr`, read once per level of a batch loop. Unsigned because numba indexes
    with unsigned integers without the negative-index fix-up it adds to every signed index (two
    instructions a load); read once because the compiler cannot keep the table in registers
    across a loop that stores into another array (the arrays might alias)."""
    return (np.uint64(lay[d, 0]), np.uint64(lay[d, 1]), np.uint64(lay[d, 2]), np.uint64(lay[d, 3]),
            np.uint64(lay[d, 4]))


@njit(nogil=True, cache=True, inline="always")
def row_addr(base, shift, bshift, mask, j):
    """:func:`addr` of node ``j`` (>= 0) of the level whose :func:`level_row` is given, unsigned."""
    q = np.uint64(j)
    return base + ((q >> shift) << bshift) + (q & mask)


@njit(nogil=True, cache=True, inline="always")
def parent(j, K, kshift):
    # An integer division costs ~25 cycles; every power-of-two K takes the shift instead.
    if kshift >= 0:
        return j >> kshift
    return j // K


@njit(nogil=True, cache=True)
def _set_leaves(sums, mins, lay, K, kshift, indices, values, touch_from):
    """Store ``values`` at leaves ``indices`` and propagate (:func:`propagate_batch`).

    The leaves are written in batch order, so a repeated index keeps its last value and each
    delta is taken against the value before it (their sum is the leaf's whole change).
    Where the leaves' level leaves cache (``touch_from <= D``), a first pass only loads each
    item's leaf slot in ``sums`` and ``mins``, so the whole batch's misses are in flight
    together before the loop that reads, writes and branches on them (loads only).
    """
    D = lay.shape[0] - 1
    n = indices.shape[0]
    delta = np.empty(n, dtype=np.float64)
    old_min = np.empty(n, dtype=mins.dtype)
    if touch_from <= D:
        seen = np.empty(n, dtype=sums.dtype)  # the touch pass's loads, stored so they are kept
        base, shift, bshift, mask, _ = level_row(lay, D)
        for b in range(n):
            leaf = row_addr(base, shift, bshift, mask, np.uint64(indices[b]))
            seen[b] = sums[leaf] + mins[leaf]
    for b in range(n):
        leaf = addr(lay, D, indices[b])
        old = sums[leaf]
        sums[leaf] = values[b]
        # the delta of the values *as stored*, so float32 trees propagate what they hold
        delta[b] = np.float64(sums[leaf]) - np.float64(old)
        old_min[b] = mins[leaf]
        mins[leaf] = sums[leaf] if sums[leaf] > 0.0 else np.inf  # stored value: may underflow
    propagate_batch(sums, mins, lay, K, kshift, D, indices, delta, old_min, touch_from)


#: The upper levels with at most ``n // NARROW`` nodes (``n`` the batch size) are "narrow": an
#: update sums its deltas per node there (:func:`propagate_batch`). 2 measured best of 1/2/4/8
#: at 2**20 leaves and 256 items.
NARROW = 2


@njit(nogil=True, cache=True, inline="always")
def narrow_levels(D, K, n):
    """``(L, width)``: depths ``0 .. L-1`` hold at most ``n // NARROW`` nodes each (``L <= D``),
    and ``width = K**(L-1)`` nodes are at depth ``L - 1`` (1 when ``L == 0``)."""
    L, w = 0, 1
    while L < D and w * NARROW <= n:
        L += 1
        w *= K
    return L, max(w // K, 1)


@njit(nogil=True, cache=True, inline="always")
def summed_by_parent(j, delta, width, K, kshift):
    """float64 ``acc[q]``: the sum of ``delta[b]`` over the items whose node ``j[b]`` has parent
    ``q`` (``width`` parents). Called with ``j`` the items' nodes, or ``acc`` itself folded a
    level up with ``j = 0 .. len(acc) - 1``."""
    acc = np.zeros(width, dtype=np.float64)
    for b in range(j.shape[0]):
        acc[parent(j[b], K, kshift)] += delta[b]
    return acc


@njit(nogil=True, cache=True)
def propagate_batch(sums, mins, lay, K, kshift, D, indices, delta, old_min, touch_from):
    """Bring every ancestor of leaves ``indices`` (depth ``D``; leaves already written) up to
    date for the whole batch, one level at a time; ``delta[b]`` is the change of leaf
    ``indices[b]`` by item ``b``, ``old_min[b]`` its min slot before item ``b`` wrote it.

    Sums: on the wide levels, where items rarely share a node, each item adds its delta to its
    ancestor, the whole batch one level at a time, so the loads of different items are
    independent and several misses are in flight. On the narrow levels above
    (:func:`narrow_levels`), where many items share each node, the deltas are summed per node
    in float64 (a dense array over the level, folded K to 1 for the level above) and each
    node that changed gets one add: no chain of dependent read-modify-writes on a shared node,
    and one rounding instead of one per item. Minima: :func:`propagate_mins`.

    Cost: O(n (D - L)) adds on the wide levels plus O(K**L) (at most about ``n``) on the narrow
    ones, plus the minima's (typically two loads per item). Measured at 2**20 leaves and 256
    items: 0.7-0.8x the time of per-item adds on every level; deduplicating every level by
    sorting the batch measured 1.4x instead.
    """
    n = indices.shape[0]
    L, width = narrow_levels(D, K, n)
    j = indices.copy()
    for d in range(D - 1, L - 1, -1):
        base, shift, bshift, mask, _ = level_row(lay, d)
        for b in range(n):
            j[b] = parent(j[b], K, kshift)
            sums[row_addr(base, shift, bshift, mask, j[b])] += delta[b]
    if L > 0:
        acc = summed_by_parent(j, delta, width, K, kshift)  # j holds depth-L nodes
        for d in range(L - 1, -1, -1):
            for q in range(width):
                if acc[q] != 0.0:
                    sums[addr(lay, d, q)] += acc[q]
            if d > 0:
                width //= K
                acc = summed_by_parent(np.arange(acc.shape[0]), acc, width, K, kshift)
    propagate_mins(mins, lay, K, kshift, indices, old_min, D, touch_from)


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
def propagate_mins(mins, lay, K, kshift, indices, old, D, touch_from):
    """Bring the minima above leaves ``indices`` (depth ``D``) up to date, level by level.

    ``old[b]`` is what leaf ``indices[b]``'s min slot held before item ``b`` wrote it. Per
    ancestor, with ``cur`` the child's value now and ``mp`` the parent's: ``cur < mp`` lowers
    the parent; ``cur == mp`` changes nothing; ``cur > mp`` matters only if the child held the
    minimum before (``old == mp``), and only then are the K children re-read. An item stops at
    the first unchanged ancestor. Items sharing an ancestor stay correct because ``cur`` is
    re-read (so a repeated index sees its last value) and a raise re-reads every child.
    Typical cost: two loads per item (child and parent), so about one miss, not K loads.
    From depth ``touch_from`` on (a level too large to stay cached: see
    :mod:`impl.trees.ops`), each level starts with a pass that only loads the parents' slots of
    the items still active into a scratch array, so their misses are in flight together; the
    pass that follows branches on the loaded values, and a mispredicted branch waiting on a
    miss would otherwise leave each miss alone in flight.
    """
    j = indices.copy()
    prev = old.copy()
    active = j.shape[0]
    seen = np.empty(active if touch_from <= D else 0, dtype=mins.dtype)  # the touch pass's loads
    for d in range(D - 1, -1, -1):
        if active == 0:
            break
        if d >= touch_from:
            base, shift, bshift, mask, _ = level_row(lay, d)
            for b in range(j.shape[0]):
                if j[b] >= 0:
                    seen[b] = mins[row_addr(base, shift, bshift, mask, parent(j[b], K, kshift))]
        for b in range(j.shape[0]):
            if j[b] < 0:
                continue
            cur = mins[addr(lay, d + 1, j[b])]
            p = parent(j[b], K, kshift)
            a = addr(lay, d, p)
            mp = mins[a]
            if cur < mp:
                new = cur
            elif cur > mp and prev[b] == mp:
                new = min_of_children(mins, lay, K, d, p)
            else:
                new = mp
            if new == mp:
                j[b] = -1
                active -= 1
            else:
                mins[a] = new
                prev[b] = mp
                j[b] = p


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
def update(sums, mins, lay, K, kshift, indices, values, n_valid, eps, alpha, vmax, touch_from):
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
    _set_leaves(sums, mins, lay, K, kshift, indices, ps, touch_from)
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
