"""Byte addresses that one tree operation touches, replayed from the tree's own layout.

Source of truth: a tree declares its kernel set (``tree.kernels``) and exposes its address
table (``tree.layout``) and arrays (``tree.sums``, ``tree.mins``). The replays here compute every
slot with the kernels' own address functions (:func:`impl.trees.kernels.addr` and
:func:`~impl.trees.kernels.parent`) on that table, and follow the kernels' loops decision for
decision. A replay exists per kernel set (:data:`REPLAYS`); a tree whose kernel set has none,
or whose class overrides the methods that call its kernels, has no tracer
(:func:`trace_support` says why) and is reported ``unsupported``, never traced with another
tree's replay. tests/test_cache.py checks every registered variant's replay against its real
kernels (same leaves, same arrays after the same updates).

A :class:`TreeTracer` holds private copies of the tree's arrays and the base pointers
(``arr.ctypes.data``) of the *real* arrays, so the addresses are the ones the real kernels use
(``base + slot * itemsize``) while tracing never changes the tree. Updates are applied to the
copies, so a stream of operations sees the state the real tree would (which ancestors' minima
change, where propagation stops).

What is traced, in the kernels' order (the whole batch goes one level at a time):

* ``sample`` (``find``: :func:`impl.trees.ops.descend`): per level ``d = 1 .. D``, per draw,
  the ``K - 1`` child slots that the scan reads (``addr(d, j*K) + c*stride``); the prefix
  tree also reads the slot left of the chosen child when ``k > 0``; then per draw the leaf
  slot (prefix tree: the raw leaf row).
* ``update`` (``_set_leaves``: ``propagate_batch`` + ``propagate_mins``): per item the leaf
  slot in sums and in mins; then on each wide level, per item, the ancestor's sums slot
  (prefix tree: the ``K`` slots of the sibling group, the masked group add, from the leaves'
  level on), and on the narrow upper levels (:func:`impl.trees.kernels.narrow_levels`) the
  same per node whose summed delta is not 0; then the min propagation as the kernel does it
  on the copies: per level, per item still active, the child's and the parent's min slots,
  the ``K`` children when a raised minimum forces a rescan, stopping at the first unchanged
  ancestor.
* ``data`` (``storage.gather``): per field, per sampled index, the row's first byte and, when
  the row crosses a line, its last byte (``numpy.take`` copies rows field by field).

The K = 16 prefix descent loads its group's 16 slots with one vector load
(:func:`impl.trees.ops.count_le15`); the 16th shares a line with the 15 traced ones.

Not traced: the touch passes of ``prefetch`` (loads of lines the descent reads next anyway), the
kernels' per-call scratch arrays (``u``, ``j``, ``delta``: about 8 KiB per
256-item batch, freshly allocated), the output arrays, the input checks and the ``(p + eps)
** alpha`` transform, the O(N) ``rebuild`` run every ``resum_every`` updates, and the Python
interpreter. A read-modify-write of one slot is one access (both hit the same line).

Cost: one replay of a batch of ``n`` is O(n K D) numba work plus the trace array (up to
``n (D K + 1)`` int64 for a sample, ``n (2 + (D + 1) (2 K + 3))`` for an update).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from replaybench.impl.trees import ArraySumTree, SumTree, kernels, prefix_kernels
from replaybench.impl.trees.kernels import addr as _addr
from replaybench.impl.trees.kernels import narrow_levels as _narrow_levels
from replaybench.impl.trees.kernels import parent as _parent
from replaybench.impl.trees.kernels import summed_by_parent as _summed_by_parent

__all__ = ["REPLAYS", "TreeTracer", "trace_support", "tree_of", "data_gather"]

#: Kernel set -> the flag that selects its replay below (``True``: the running-sum groups of
#: :mod:`impl.trees.prefix_kernels`, whose layout has a raw-leaf row after the tree's depths).
REPLAYS = {kernels: False, prefix_kernels: True}

#: The ArraySumTree methods through which a tree runs its kernel set; a class that overrides
#: one runs code of its own, which the replays do not follow.
_KERNEL_CALLERS = ("update", "find", "_find_into")


@njit(nogil=True, cache=True)
def _trace_find(sums, lay, K, D, prefix, base, item, us, out_leaf, out):
    """Replicates ops.descend + ops.read_leaves for the plain kind (prefix=False) and the prefix
    kinds (prefix=True; every prefix scan reads the same K - 1 slots), without the touch passes."""
    n = us.shape[0]
    u = us.copy()
    j = np.zeros(n, dtype=np.int64)
    run = np.zeros(K)  # the plain scan's running sums, run[c + 1] after child c (ops._scan_plain)
    t = 0
    for d in range(1, D + 1):
        stride = lay[d, 4]
        for b in range(n):
            first = _addr(lay, d, j[b] * K)
            ub = u[b]
            k = 0
            if prefix:
                for c in range(K - 1):
                    out[t] = base + (first + c) * item
                    t += 1
                    k += sums[first + c] <= ub
                if k > 0:
                    out[t] = base + (first + k - 1) * item
                    t += 1
                    ub -= sums[first + k - 1]
            else:
                s = 0.0
                for c in range(K - 1):
                    a = first + c * stride
                    out[t] = base + a * item
                    t += 1
                    s += sums[a]
                    run[c + 1] = s
                    k += s <= ub
                ub = ub - run[k]  # the running sum of the k children left of the chosen one
            u[b] = ub
            j[b] = j[b] * K + k
    for b in range(n):
        leaf = _addr(lay, D + 1, j[b]) if prefix else _addr(lay, D, j[b])  # prefix: the raw-leaf row
        out[t] = base + leaf * item
        t += 1
        out_leaf[b] = j[b] if sums[leaf] > 0.0 else -1
    return t


@njit(nogil=True, cache=True)
def _min_children(mins, lay, K, d, q, mbase, item, out, t):
    first = _addr(lay, d + 1, q * K)
    stride = lay[d + 1, 4]
    m = mins[first]
    out[t] = mbase + first * item
    t += 1
    for k in range(1, K):
        a = first + k * stride
        out[t] = mbase + a * item
        t += 1
        if mins[a] < m:
            m = mins[a]
    return m, t


@njit(nogil=True, cache=True, inline="always")
def _trace_group_add(sums, lay, K, d, j, delta, sbase, item, out, t, prefix):
    """One node's sum update, as the kernels do it: a plain add, or the prefix tree's masked
    add over the node's running-sum group (prefix_kernels._add_to_group). Returns the new ``t``."""
    dv = sums.dtype.type(delta)
    if not prefix:
        a = _addr(lay, d, j)
        sums[a] += delta
        out[t] = sbase + a * item
        return t + 1
    if d == 0:
        a = _addr(lay, 0, 0)
        sums[a] += dv
        out[t] = sbase + a * item
        return t + 1
    k = j & (K - 1)
    g = _addr(lay, d, j - k)
    zero = dv - dv
    for c in range(K):
        sums[g + c] += dv if c >= k else zero
        out[t] = sbase + (g + c) * item
        t += 1
    return t


@njit(nogil=True, cache=True)
def _trace_update(sums, mins, lay, K, kshift, D, prefix, sbase, mbase, item, indices, values, out):
    """Replicates kernels._set_leaves (with propagate_batch) / prefix_kernels._set_leaves and
    propagate_mins, decision for decision, on the copies ``sums`` and ``mins``; ``values`` are
    the stored priorities (after eps/alpha)."""
    n = indices.shape[0]
    t = 0
    delta = np.empty(n, dtype=np.float64)
    old_min = np.empty(n, dtype=mins.dtype)
    for b in range(n):
        leaf = _addr(lay, D + 1, indices[b]) if prefix else _addr(lay, D, indices[b])
        m = _addr(lay, D, indices[b])
        old = sums[leaf]
        sums[leaf] = values[b]
        out[t] = sbase + leaf * item
        t += 1
        delta[b] = np.float64(sums[leaf]) - np.float64(old)
        old_min[b] = mins[m]
        mins[m] = sums[leaf] if sums[leaf] > 0.0 else np.inf
        out[t] = mbase + m * item
        t += 1
    # the sums: per item on the wide levels, per changed node on the narrow ones (narrow_levels)
    L, width = _narrow_levels(D, K, n)
    j = indices.copy()
    if prefix:
        for d in range(D, L - 1, -1):
            for b in range(n):
                t = _trace_group_add(sums, lay, K, d, j[b], delta[b], sbase, item, out, t, prefix)
                j[b] = _parent(j[b], K, kshift)
    else:
        for d in range(D - 1, L - 1, -1):
            for b in range(n):
                j[b] = _parent(j[b], K, kshift)
                t = _trace_group_add(sums, lay, K, d, j[b], delta[b], sbase, item, out, t, prefix)
    if L > 0:
        acc = np.zeros(width, dtype=np.float64)
        for b in range(n):
            acc[j[b] if prefix else _parent(j[b], K, kshift)] += delta[b]
        for d in range(L - 1, -1, -1):
            for q in range(width):
                if acc[q] != 0.0:
                    t = _trace_group_add(sums, lay, K, d, q, acc[q], sbase, item, out, t, prefix)
            if d > 0:
                width //= K
                acc = _summed_by_parent(np.arange(acc.shape[0]), acc, width, K, kshift)
    # propagate_mins, decision for decision
    j = indices.copy()
    prev = old_min.copy()
    active = n
    for d in range(D - 1, -1, -1):
        if active == 0:
            break
        for b in range(n):
            if j[b] < 0:
                continue
            c_addr = _addr(lay, d + 1, j[b])
            cur = mins[c_addr]
            out[t] = mbase + c_addr * item
            t += 1
            p = _parent(j[b], K, kshift)
            a = _addr(lay, d, p)
            mp = mins[a]
            out[t] = mbase + a * item
            t += 1
            if cur < mp:
                new = cur
            elif cur > mp and prev[b] == mp:
                new, t = _min_children(mins, lay, K, d, p, mbase, item, out, t)
            else:
                new = mp
            if new == mp:
                j[b] = -1
                active -= 1
            else:
                mins[a] = new
                out[t] = mbase + a * item
                t += 1
                prev[b] = mp
                j[b] = p
    return t


def tree_of(buffer):
    """The sum tree inside a buffer (or the tree itself), else None (uniform sampling: no tree)."""
    return buffer if isinstance(buffer, SumTree) else getattr(buffer, "tree", None)


def trace_support(tree) -> tuple[bool, str]:
    """``(True, "")`` when :class:`TreeTracer` can replay ``tree``, else ``(False, reason)``."""
    name = type(tree).__name__
    if not isinstance(tree, ArraySumTree):
        return False, f"{name} is not an array-backed sum tree (no public layout to trace)"
    if tree.kernels not in REPLAYS:
        return False, f"{name} runs kernel set {getattr(tree.kernels, '__name__', tree.kernels)!r}, which has no replay"
    for method in _KERNEL_CALLERS:
        if getattr(type(tree), method) is not getattr(ArraySumTree, method):
            return False, f"{name} overrides ArraySumTree.{method}, which the replay of its kernels does not follow"
    return True, ""


class TreeTracer:
    """Address traces of ``sample``/``update`` on ``tree``, replayed on private copies.

    Raises ValueError (with :func:`trace_support`'s reason) for a tree it cannot replay.
    """

    def __init__(self, tree):
        ok, why = trace_support(tree)
        if not ok:
            raise ValueError(f"tree = {tree!r} cannot be traced: {why}")
        self.tree = tree
        self.prefix = REPLAYS[tree.kernels]
        self.lay = np.ascontiguousarray(tree.layout)
        self.K = int(tree.K)
        self.kshift = self.K.bit_length() - 1 if self.K & (self.K - 1) == 0 else -1
        self.D = int(tree.depth)  # leaves at depth D
        self.sums = tree.sums.copy()
        self.mins = tree.mins.copy()
        self.item = tree.sums.dtype.itemsize
        self.sums_base = int(tree.sums.ctypes.data)
        self.mins_base = int(tree.mins.ctypes.data)

    def total(self) -> float:
        return float(self.sums[int(self.lay[0, 0])])

    def sample(self, us) -> tuple[np.ndarray, np.ndarray]:
        """``(addresses, leaves)`` of one ``find(us)``; a leaf is -1 where the real find
        would say -1 (a zero leaf reached through rounding)."""
        us = np.ascontiguousarray(us, dtype=np.float64)
        n = us.shape[0]
        out = np.empty(n * (self.D * self.K + 1), dtype=np.int64)
        leaves = np.empty(n, dtype=np.int64)
        t = _trace_find(self.sums, self.lay, self.K, self.D, self.prefix, self.sums_base, self.item, us, leaves,
                        out)
        return out[:t], leaves

    def update(self, indices, values) -> np.ndarray:
        """Addresses of ``update`` of leaves ``indices`` to stored priorities ``values``
        (already ``(p + eps) ** alpha``); the copies are updated as the tree would be."""
        idx = np.ascontiguousarray(indices, dtype=np.int64)
        vals = np.ascontiguousarray(values, dtype=np.float64)
        n = idx.shape[0]
        levels = self.D + 1
        out = np.empty(n * (2 + levels * (self.K if self.prefix else 1) + levels * (self.K + 3)), dtype=np.int64)
        t = _trace_update(self.sums, self.mins, self.lay, self.K, self.kshift, self.D, self.prefix,
                          self.sums_base, self.mins_base, self.item, idx, vals, out)
        return out[:t]


def data_gather(columns: dict, indices, line: int = 64) -> np.ndarray:
    """Addresses that ``{name: col.take(indices, axis=0)}`` reads: per field (in dict order),
    per index, the row's first byte and its last byte when the row crosses a line."""
    idx = np.asarray(indices, dtype=np.int64)
    parts = []
    for col in columns.values():
        row = col.strides[0]
        nbytes = max(1, col[0:1].nbytes)
        start = int(col.ctypes.data) + idx * row
        end = start + nbytes - 1
        both = np.stack([start, end], axis=1)
        cross = (start // line) != (end // line)
        parts.append(both[:, 0] if not cross.any() else both[np.stack([np.ones_like(cross), cross], 1)])
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
