"""Tree writes and draws without a lock, for the atomic-deltas policy
(:mod:`impl.concurrent.policies.atomic_deltas`): leaves set by atomic exchange, inner sums
moved by atomic float adds of the batch's deltas summed per node, minima settled by
compare-and-swap, and a descent that reads the tree while writers change it.

Every function works on one array tree's kernel arguments (:mod:`impl.trees.ops`: ``kind,
sums, mins, lay, K, kshift, touch_from``; plain child sums or running sums per sibling group)
whose ``sums`` and ``mins`` are float64 (:meth:`impl.trees.ArraySumTree.widened`). Many
writers may run them at once, in threads or processes over shared memory; what each
guarantees is stated per function. None of them takes a lock, and none may run beside a
rebuild (:func:`impl.trees.ops.rebuild` writes nodes plainly): the policy excludes that.

Sums (:func:`add_deltas`)
    A leaf's ``new - old`` is taken from the value its exchange returned, so the deltas of all
    writers of one leaf add up to its last value minus its first, whatever the interleaving.
    Each node's share of the batch is summed in float64 before its one atomic add: on the
    wide levels over runs of neighbouring items (an insert's consecutive slots share their
    parents), on the upper levels of at most a batch's worth of nodes (:func:`summed_levels`)
    over the whole batch, so the root gets one add per batch and the top levels' lines, which
    every writer shares, get one add per changed node. Once every writer has returned,
    each node equals the sum of its leaves up to rounding (the drift bound of
    :mod:`impl.concurrent.policies.atomic_deltas`). While writers run, a node may lag its
    leaves by the deltas not yet added (even read negative for a moment, when a decrease
    arrives before the increase it follows).

Minima (:func:`settle_mins`)
    The inner nodes' minima only: a leaf's minimum is its value (0 read as none), which the
    level above reads from ``sums`` itself, so the leaves' own min slots are not kept (the
    exact rebuild fills them; nothing reads them). A node's minimum is settled by a loop that
    reads the node, then its children, and stops when the node equals its children's
    minimum, else swaps that minimum in (compare-and-swap on the word's bits) and reads
    again. A writer that swapped goes on to the parent; one that found agreement stops. So
    the last swap on any node is followed by a read of its children after every change below
    it (a leaf's changes are its exchanges), and once writers stop, every inner node holds
    its children's minimum (a plain "lower by atomic min, raise by recompute" loses raises to
    stale lowers). Before the loop a writer reads the parent alone and skips it when its
    child's change (``old`` to ``new``: a leaf's from its exchange) cannot move it (``old >
    parent <= new``), as the locked :func:`impl.trees.kernels.propagate_mins` does;
    :func:`settle_mins` says why that is safe. While writers run, the root minimum may be off
    by the batches in flight.

Draws (:func:`draw`)
    A descent reads each node once, its mass clamped below the root total it read. A node
    that lags a decrease below it sends the draw past its children (an overshoot: the scan's
    last child takes what is left, and the mass left at the leaf is not below the leaf's
    value); such a draw is drawn again, as is one that reaches a leaf that is 0 or whose slot
    is being written (stamp -1). A node that lags an increase leaves the new mass out of reach
    until the delta arrives.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import fused_ops as fo
from ..trees import ops
from ..trees.kernels import addr, min_of_children, parent, summed_by_parent
from .atomics import atomic_add, atomic_cas, atomic_read, atomic_xchg, prefetch_write

__all__ = ["depth", "leaf_slot", "exchange_leaves", "summed_levels", "add_deltas", "settle_mins", "set_leaves",
           "reject_overshoot", "draw", "DRAW_ROUNDS"]

#: Rounds of redrawing positions that reached a zero leaf or a slot being written before a draw
#: gives up (the caller then takes the Python path, which waits for writers and rebuilds).
DRAW_ROUNDS = 32
_REDRAW_BASE = fo.MAX_REDRAWS + 1  # redraws use counters from here on (times n), past the first draw's


@njit(nogil=True, cache=True, inline="always")
def depth(kind, lay):
    """The tree's leaf depth ``D`` (the prefix trees' table has one more row: their raw leaves)."""
    return lay.shape[0] - (1 if kind == ops.PLAIN else 2)


@njit(nogil=True, cache=True, inline="always")
def leaf_slot(kind, lay, D, i):
    """The slot of ``sums`` that holds leaf ``i``'s priority (its min lives at ``addr(lay, D, i)``)."""
    if kind == ops.PLAIN:
        return addr(lay, D, i)
    return lay[D + 1, 0] + i


@njit(nogil=True, cache=True)
def exchange_leaves(kind, sums, lay, indices, values, old):
    """Set leaf ``indices[b]`` to ``values[b]`` by atomic exchange, in batch order (a repeated
    index keeps its last value); ``old[b]`` gets the value the exchange returned, so the
    deltas ``values - old`` of every writer of a leaf add up to its last value minus its
    first, whatever the interleaving. The inner nodes are not touched: :func:`add_deltas` and
    :func:`settle_mins` bring them up to date. O(n)."""
    D = depth(kind, lay)
    for b in range(indices.shape[0]):  # the lines in flight together (see prefetch_write)
        prefetch_write(sums, leaf_slot(kind, lay, D, indices[b]))
    for b in range(indices.shape[0]):
        old[b] = atomic_xchg(sums, leaf_slot(kind, lay, D, indices[b]), values[b])


@njit(nogil=True, cache=True, inline="always")
def _node_add(kind, sums, lay, K, d, j, delta):
    """Add ``delta`` to node ``(d, j)`` atomically: its slot (plain), or its slot and those of its
    right siblings (running sums per group; the root is a group of one)."""
    if kind == ops.PLAIN or d == 0:
        atomic_add(sums, addr(lay, d, j), delta)
        return
    k = j & (K - 1)  # prefix trees have a power-of-2 K
    first = addr(lay, d, j - k)
    for c in range(k, K):
        atomic_add(sums, first + c, delta)


@njit(nogil=True, cache=True, inline="always")
def _merge_up(j, dl, m, K, kshift):
    """Nodes ``j[:m]`` replaced by their parents, neighbours with one parent merged (their
    deltas summed in float64); returns how many remain."""
    w = 0
    for b in range(m):
        p = parent(j[b], K, kshift)
        if w > 0 and j[w - 1] == p:
            dl[w - 1] += dl[b]
        else:
            j[w] = p
            dl[w] = dl[b]
            w += 1
    return w


@njit(nogil=True, cache=True, inline="always")
def summed_levels(D, K, n):
    """``(L, width)`` as :func:`impl.trees.kernels.narrow_levels` gives them, with depths ``0 ..
    L-1`` the levels of at most ``n`` nodes (the locked kernels stop at ``n / NARROW``): where
    :func:`add_deltas` sums a batch's deltas per node before adding. A level that narrow sits
    in few cache lines that every writer's batch reaches (at 2**18 leaves and K = 16, depth
    2's 64 nodes fill 8 lines), and each atomic add is a locked read-modify-write for which the
    line moves to the writer's core: summed first, the level takes one add per changed node,
    in address order, instead of one per item in batch order. (The dense sum over the next,
    16 times wider level costs more than the adds it saves.)"""
    L, w = 0, 1
    while L < D and w <= n:
        L += 1
        w *= K
    return L, max(w // K, 1)


@njit(nogil=True, cache=True)
def add_deltas(kind, sums, lay, K, kshift, indices, delta):
    """Add leaf deltas (``values - old`` of :func:`exchange_leaves`) to every ancestor with
    atomic float adds, each node's share of the batch summed first (module docstring). O(n D)
    adds at most, one per changed node on the levels of :func:`summed_levels`; plus up to
    K - 1 per node for running-sum trees."""
    D = depth(kind, lay)
    n = indices.shape[0]
    L, width = summed_levels(D, K, n)
    j = indices.copy()
    dl = delta.copy()
    m = n
    for d in range(D, L - 1, -1):
        if d < D:
            m = _merge_up(j, dl, m, K, kshift)
        if kind != ops.PLAIN or d < D:  # a plain tree's leaves were set by the exchange
            for q in range(m):
                if dl[q] != 0.0:
                    _node_add(kind, sums, lay, K, d, j[q], dl[q])
    if L > 0:  # j[:m] holds depth-L nodes: the summed levels get one add per changed node
        acc = summed_by_parent(j[:m], dl[:m], width, K, kshift)
        for d in range(L - 1, -1, -1):
            for q in range(width):
                if acc[q] != 0.0:
                    _node_add(kind, sums, lay, K, d, q, acc[q])
            if d > 0:
                width //= K
                acc = summed_by_parent(np.arange(acc.shape[0]), acc, width, K, kshift)


@njit(nogil=True, cache=True, inline="always")
def _as_min(v):
    """A leaf value as a minimum: a 0 leaf is none."""
    return v if v > 0.0 else np.inf


@njit(nogil=True, cache=True, inline="always")
def _leaf_min(kind, sums, lay, K, D, q):
    """The smallest value > 0 among the leaves under node ``(D - 1, q)``, read from ``sums``
    (``inf`` when every one is 0): the minimum the leaves' own min slots would hold."""
    if kind == ops.PLAIN:
        first, stride = addr(lay, D, q * K), lay[D, 4]
    else:
        first, stride = lay[D + 1, 0] + q * K, 1
    m = _as_min(sums[first])
    for k in range(1, K):
        m = min(m, _as_min(sums[first + k * stride]))
    return m


@njit(nogil=True, cache=True, inline="always")
def _settle(mins, bits, scratch, kind, sums, lay, K, D, d, j):
    """The agreement loop on min slot ``(d, j)``: ``(swapped, value before this call's last swap,
    value it swapped in)`` (the last two meaningful only when it swapped). Its children are
    the leaves (read from ``sums``) at ``d = D - 1``; ``d = D`` only for a tree that is one
    leaf (``D = 0``), whose root is that leaf."""
    a = addr(lay, d, j)
    sbits = scratch.view(np.int64)
    swapped = False
    before = 0.0
    after = 0.0
    while True:
        seen = atomic_read(bits, a)  # acquire: the children are read after the node
        if d == D:
            scratch[0] = _as_min(sums[leaf_slot(kind, lay, D, j)])
        elif d == D - 1:
            scratch[0] = _leaf_min(kind, sums, lay, K, D, j)
        else:
            scratch[0] = min_of_children(mins, lay, K, d, j)
        want = sbits[0]
        if want == seen:
            return swapped, before, after
        if atomic_cas(bits, a, seen, want) == seen:
            swapped = True
            after = scratch[0]
            sbits[0] = seen
            before = scratch[0]


@njit(nogil=True, cache=True)
def settle_mins(kind, sums, mins, lay, K, kshift, indices, old, new):
    """Bring the inner nodes' minima above leaves ``indices`` up to date with the agreement
    loop of the module docstring, level by level over the batch; ``old[b]`` and ``new[b]``:
    leaf ``indices[b]``'s value before and after item ``b``'s exchange (as
    :func:`exchange_leaves` returned it and set it).

    A writer that changed a child's minimum from ``old`` to ``new`` (its exchange of a leaf,
    or its last swap at an inner node) first reads the parent alone: when ``old > parent``
    and ``new >= parent`` its change cannot move the parent (the parent's minimum came from
    another child, whose writers settle it; a parent that rose past ``new`` from a stale read
    of this child is corrected by that reader's own agreement loop, which reads the children
    after its swap). Otherwise it runs the agreement loop, once per node for neighbours with
    one parent. Typical cost, as :func:`impl.trees.kernels.propagate_mins`: the parent's min
    slot, so about one miss an item; a whole sibling group only where the minimum moves. (The
    leaves' min slots, were they kept, would take one locked compare-and-swap an item: the
    largest part of the cost.)"""
    D = depth(kind, lay)
    bits = mins.view(np.int64)
    scratch = np.empty(1)
    sbits = scratch.view(np.int64)
    m = indices.shape[0]
    j = np.empty(m, dtype=np.int64)
    lo = np.empty(m)
    hi = np.empty(m)
    for q in range(m):
        j[q] = indices[q] if D == 0 else parent(indices[q], K, kshift)
        lo[q] = _as_min(old[q])
        hi[q] = _as_min(new[q])
    for d in range(D - 1 if D > 0 else 0, -1, -1):
        for q in range(m):  # every item's slot at this level in flight together (see prefetch_write)
            prefetch_write(mins, addr(lay, d, j[q]))
        w = 0
        last = -1  # the node of the last agreement loop run at this level
        for q in range(m):
            node = j[q]
            if d < D:
                sbits[0] = atomic_read(bits, addr(lay, d, node))
                if lo[q] > scratch[0] and hi[q] >= scratch[0]:
                    continue
            if node == last:
                continue  # its loop ran after this item's child changed: the same reads
            last = node
            swapped, before, after = _settle(mins, bits, scratch, kind, sums, lay, K, D, d, node)
            if swapped:
                j[w] = node
                lo[w] = before
                hi[w] = after
                w += 1
        if w == 0 or d == 0:
            return
        m = w
        for q in range(m):
            j[q] = parent(j[q], K, kshift)


@njit(nogil=True, cache=True)
def set_leaves(kind, sums, mins, lay, K, kshift, indices, values):
    """Leaves ``indices`` set to ``values`` (final float64 values, checked by the caller), the
    sums and minima above them brought up to date, with no lock. O(n D) atomics."""
    old = np.empty(indices.shape[0])
    exchange_leaves(kind, sums, lay, indices, values, old)
    add_deltas(kind, sums, lay, K, kshift, indices, values - old)
    settle_mins(kind, sums, mins, lay, K, kshift, indices, old, values)


@njit(nogil=True, cache=True, inline="always")
def _clamped(u, total):
    """``u`` clamped to ``[0, total)``: a mass at or past the total read (rounding, or a total that
    fell since) takes the top of the tree."""
    top = total * (1.0 - 2.0**-52)
    return min(max(u, 0.0), top)


@njit(nogil=True, cache=True, inline="always")
def reject_overshoot(residual, index, prio):
    """A descent leaves in ``residual`` the mass left at its leaf, in ``[0, p)`` when every node
    it read was its children's sum. One past its leaf overshot: a node on its path lagged a
    decrease below it (deltas in flight), and the scan's last child took what was left. Such
    a draw is marked for drawing again (index -1) instead of giving that child the mass of
    the leaves whose decrease is in flight."""
    for b in range(index.shape[0]):
        if index[b] >= 0 and not residual[b] < prio[b]:
            index[b] = -1


@njit(nogil=True, cache=True)
def draw(kind, sums, mins, lay, K, touch_from, stamps, key, stratified, redraw_tag, out_index, prio, out_stamp):
    """Positions ``0 .. n-1`` drawn with no lock: ``p_min`` (> 0) when every position reached a
    leaf > 0 whose slot is published (stamp >= 0, read once) within :data:`DRAW_ROUNDS` rounds,
    else -1. ``prio`` gets the reached leaves, ``out_stamp`` their stamps. ``p_min`` is the
    root minimum read after the draw, lowered to the smallest priority drawn (so no weight
    exceeds 1 when the minimum lags a batch in flight). ``redraw_tag``: 0 for a call's first
    draw, another value for each later draw of the same call (its counters are then its own).

    The masses are those of :func:`impl.fused_ops.mass` on the root total read once (plain or
    stratified), clamped below it; positions drawn again get fresh uniform masses on the root
    total read again. O(n K D) loads."""
    n = out_index.shape[0]
    root = lay[0, 0]
    cap = stamps.shape[0]
    total = np.float64(sums[root])
    if not total > 0.0:
        return -1.0
    if redraw_tag != 0:
        key = np.int64(fo.uniform01(key, (1 << 40) + redraw_tag) * 4.0e18)
    u = np.empty(n)
    for b in range(n):
        u[b] = _clamped(fo.mass(key, b, b, n, total, stratified), total)
    ops.descend(kind, sums, lay, K, touch_from, u, out_index)
    ops.read_leaves(kind, sums, lay, touch_from, out_index, prio)
    reject_overshoot(u, out_index, prio)
    pos = np.empty(n, dtype=np.int64)
    for r in range(DRAW_ROUNDS + 1):
        bad = 0
        for b in range(n):
            i = out_index[b]
            s = stamps[i] if 0 <= i < cap else -1  # read once; an index read with no lock is checked first
            out_stamp[b] = s
            if s < 0:
                pos[bad] = b
                bad += 1
        if bad == 0:
            break
        if r == DRAW_ROUNDS:
            return -1.0
        total = np.float64(sums[root])
        if not total > 0.0:
            return -1.0
        u = np.empty(bad)
        jj = np.empty(bad, dtype=np.int64)
        pp = np.empty(bad)
        for k in range(bad):
            u[k] = _clamped(fo.uniform01(key, (_REDRAW_BASE + r) * n + pos[k]) * total, total)
        ops.descend(kind, sums, lay, K, touch_from, u, jj)
        ops.read_leaves(kind, sums, lay, touch_from, jj, pp)
        reject_overshoot(u, jj, pp)
        for k in range(bad):
            out_index[pos[k]] = jj[k]
            prio[pos[k]] = pp[k]
    pmin = np.float64(mins[root])
    for b in range(n):
        pmin = min(pmin, prio[b])
    return pmin if 0.0 < pmin < np.inf else -1.0
