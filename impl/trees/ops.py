"""One compiled entry point per tree operation, for every array tree: the kernel sets of
:mod:`impl.trees.kernels` (plain child sums) and :mod:`impl.trees.prefix_kernels` (running
sums) behind a ``kind`` code, plus the re-summing bookkeeping, so that a buffer operation is a
single ``nogil`` call (:mod:`impl.fused_ops`) and no Python runs between its steps.

Arguments shared by every function here (a tree's :attr:`~impl.trees.ArraySumTree.kernel_args`):

``kind``
    :data:`PLAIN`, :data:`PREFIX`, or :data:`PREFIX16` (the prefix descent specialised for
    K = 16: each level one vector compare of the 16-slot group, :func:`count_le15`).
``sums, mins, lay, K, kshift``
    The tree's arrays, address table, branching factor and ``log2 K`` (``-1`` if K is not a
    power of 2), as the kernel modules take them.
``touch_from``
    First depth whose level is too large to stay cached (see
    :func:`impl.trees.array_trees.touch_depth`); from it on, each level of a descent starts with
    a pass that only loads every draw's next sibling group. That pass has a short body, so the
    core issues the whole batch's misses together; the compare pass that follows then finds
    its lines in cache. An update's minima do the same from that depth up
    (:func:`impl.trees.kernels.propagate_mins`). ``depth + 1`` (never) turns it off.
``state``
    float64 ``[updates since the last rebuild, largest total since, resum_every, rebuilds so
    far]``: the re-summing rule of :mod:`impl.trees.array_trees`, kept in an array so that
    compiled code applies it.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from . import kernels, prefix_kernels
from .kernels import addr, level_row, row_addr

__all__ = ["PLAIN", "PREFIX", "PREFIX16", "update", "fill", "rebuild", "count_updates", "count_le15", "descend",
           "read_leaves", "find"]

PLAIN = 0
PREFIX = 1
PREFIX16 = 2


@njit(nogil=True, cache=True)
def rebuild(kind, sums, mins, lay, K, state):
    """Recompute every inner node from the leaves (O(N)) and restart the re-summing count."""
    if kind == PLAIN:
        kernels.rebuild(sums, mins, lay, K)
    else:
        prefix_kernels.rebuild(sums, mins, lay, K)
    state[0] = 0.0
    state[1] = np.float64(sums[lay[0, 0]])
    state[3] += 1.0


@njit(nogil=True, cache=True)
def count_updates(kind, sums, mins, lay, K, state, n):
    """Count ``n`` leaf writes; rebuild after ``resum_every`` of them, or sooner once the total
    has fallen so far that the drift bound ``m * 2**-24 * T_max`` is large relative to it."""
    state[0] += n
    total = np.float64(sums[lay[0, 0]])
    if total > state[1]:
        state[1] = total
    if state[0] >= state[2] or state[0] * state[1] > state[2] * total:
        rebuild(kind, sums, mins, lay, K, state)


@njit(nogil=True, cache=True)
def update(kind, sums, mins, lay, K, kshift, touch_from, state, indices, values, n_valid, eps, alpha, vmax):
    """Checked ``p[indices] = (values + eps) ** alpha``, counted for re-summing. Returns
    ``(status, position, max p)`` as :func:`impl.trees.kernels.update`; nothing is written or
    counted unless the whole batch is valid."""
    if kind == PLAIN:
        status, pos, pmax = kernels.update(sums, mins, lay, K, kshift, indices, values, n_valid, eps, alpha, vmax,
                                           touch_from)
    else:
        status, pos, pmax = prefix_kernels.update(sums, mins, lay, K, kshift, indices, values, n_valid, eps, alpha,
                                                  vmax, touch_from)
    if status == kernels.STATUS_OK:
        count_updates(kind, sums, mins, lay, K, state, indices.shape[0])
    return status, pos, pmax


@njit(nogil=True, cache=True)
def update_abs(kind, sums, mins, lay, K, kshift, touch_from, state, indices, values, n_valid, eps, alpha, vmax):
    """:func:`update` of ``|values|``: ``values`` a 1-D float32 or float64 array as long as
    ``indices`` (TD errors as a framework hands them), its magnitudes widened to float64 here
    (exact, the same numbers as ``np.abs(values, dtype=np.float64)``). Why: an adapter's
    priority update in a training loop otherwise makes that float64 array in NumPy and
    reaches :func:`update` through several Python layers, each a cache-cold call between the
    network's work. Returns and checks as :func:`update` (the caller names a bad value from
    ``np.abs(values)``)."""
    mags = np.empty(values.shape[0])
    for i in range(values.shape[0]):
        mags[i] = abs(values[i])
    return update(kind, sums, mins, lay, K, kshift, touch_from, state, indices, mags, n_valid, eps, alpha, vmax)


@njit(nogil=True, cache=True)
def fill(kind, sums, mins, lay, K, kshift, touch_from, state, start, count, capacity, p):
    """``count`` leaves from ``start`` (wrapping) set to ``p`` (unchecked), counted."""
    if kind == PLAIN:
        kernels.fill(sums, mins, lay, K, kshift, start, count, capacity, p)
    else:
        prefix_kernels.fill(sums, mins, lay, K, kshift, start, count, capacity, p, touch_from)
    count_updates(kind, sums, mins, lay, K, state, count)


@intrinsic
def count_le15(typingctx, sums, first, ub):
    """``sum(sums[first + c] <= ub for c in range(15))`` for a float32 or float64 array ``sums``,
    unsigned ``first`` and float64 ``ub``: the child a :data:`PREFIX16` descent takes, from one
    16-slot sibling group of running sums. Compiled as one 16-wide vector load of slots
    ``first .. first + 15`` (all 16 must lie in ``sums``: a K = 16 tree's groups have 16 slots;
    unchecked), a widening to float64 (exact), one vector ``<=`` against ``ub`` (LLVM's
    ``fcmp ole``, which is what numba compiles ``<=`` of two floats to: false for NaN), the
    16th lane masked off and a population count. So the count is the scalar loop's bit for
    bit, in a few instructions instead of 15 scalar converts, compares and adds (the
    compiler does not vectorise that loop's reduction itself)."""
    if not (isinstance(sums, types.Array) and sums.ndim == 1 and sums.dtype in (types.float32, types.float64)
            and isinstance(first, types.Integer) and isinstance(ub, types.Float)):
        return None
    sig = types.int64(sums, types.uint64, types.float64)

    def codegen(context, builder, signature, args):
        arr_type = signature.args[0]
        array, first_v, ub_v = args
        data = context.make_array(arr_type)(context, builder, array).data
        elt = context.get_value_type(arr_type.dtype)
        ptr = builder.bitcast(builder.gep(data, [first_v]), ir.VectorType(elt, 16).as_pointer())
        group = builder.load(ptr, align=arr_type.dtype.bitwidth // 8)  # no alignment assumed
        wide = ir.VectorType(ir.DoubleType(), 16)
        if arr_type.dtype == types.float32:
            group = builder.fpext(group, wide)
        lane0 = builder.insert_element(ir.Constant(wide, ir.Undefined), ub_v, ir.Constant(ir.IntType(32), 0))
        splat = builder.shuffle_vector(lane0, ir.Constant(wide, ir.Undefined),
                                       ir.Constant(ir.VectorType(ir.IntType(32), 16), [0] * 16))
        bits = builder.bitcast(builder.fcmp_ordered("<=", group, splat), ir.IntType(16))
        bits = builder.and_(bits, ir.Constant(ir.IntType(16), 0x7FFF))  # the last slot needs no compare
        return builder.zext(builder.ctpop(bits), ir.IntType(64))

    return sig, codegen


@njit(nogil=True, cache=True, inline="always")
def _touch(sums, lay, K, d, j, n):
    """Load the first and last slot of every draw's sibling group at depth ``d`` (both lines
    when a group straddles two). Returns their sum so the loads are kept."""
    acc = 0.0
    base, shift, bshift, mask, stride = level_row(lay, d)
    last = np.uint64(K - 1) * stride
    for b in range(n):
        first = _first_child(base, shift, bshift, mask, j[b], K)
        acc += sums[first] + sums[first + last]
    return acc


@njit(nogil=True, cache=True, inline="always")
def _first_child(base, shift, bshift, mask, j, K):
    """The slot of node ``j``'s first child ``(d, j * K)``, unsigned, from the
    :func:`impl.trees.kernels.level_row` of depth ``d``."""
    return row_addr(base, shift, bshift, mask, np.uint64(j) * np.uint64(K))


@njit(nogil=True, cache=True, inline="always")
def _scan_plain(sums, first, stride, K, ub, run):
    """The child of one draw at one level of a :data:`PLAIN` tree: ``k``, the number of running
    sums of the first ``K - 1`` children (slots ``first + c * stride``) that are ``<= ub``, with
    ``run[c + 1]`` set to the running sum of children ``0 .. c`` (``run[0]`` is 0), so the
    mass left of the chosen child is ``run[k]``. The running sums are one chain of dependent
    float64 adds in child order (the result does not depend on how the loop is compiled); the
    compares and the count hang off that chain, and nothing branches on the data: picking the
    mass left of the child as "the last sum that passed" compiled to a branch that mispredicts
    once per level and draw and drains the out-of-order window, so no other draw's chain or
    miss can proceed meanwhile."""
    s = 0.0
    k = 0
    for c in range(K - 1):
        s += sums[first]
        first += stride
        run[np.uint64(c + 1)] = s
        k += s <= ub
    return k


@njit(nogil=True, cache=True)
def descend(kind, sums, lay, K, touch_from, u, j):
    """Prefix-sum search, the leaves not read yet (:func:`read_leaves`): ``j[b]`` becomes the
    leaf ``i`` with ``S(i-1) <= u[b] < S(i)``, ``S`` the running sum of the leaves in index
    order (``u`` is overwritten with scratch).

    At each level the child is the number of running child sums ``<= u`` among the first
    ``K - 1`` children (the last child needs no comparison), and ``u`` drops by the running sum
    of the children left of it: PAL's left-to-right scan, written without a branch on the data.
    :data:`PLAIN` trees form the running sums as they scan (:func:`_scan_plain`): K - 1
    dependent float64 adds per level and draw, the compares off that chain (K = 2: one slot,
    one compare and a select, the same arithmetic); the prefix trees store them, so a level
    is K - 1 independent compares (K = 16: one vector compare, :func:`count_le15`). The whole batch descends one level
    at a time, so the levels of different draws are independent: with no mispredicted branch
    in a draw's level, the core overlaps several draws' add chains and cache misses. From
    ``touch_from`` on each level starts with a pass that only loads every draw's next group
    (module docstring), so the misses of the whole batch are in flight together.
    Addresses come from each level's table row (:func:`impl.trees.kernels.level_row`): a
    level-order row takes the contiguous ``base + j K`` with a literal stride, any other row
    the general formula.
    Cost: O(n K D) compares and (plain) adds, one line per level per draw for aligned layouts;
    beyond cache, about one miss latency per touched level for the whole batch.

    Returns the touch passes' sum: meaningless, but the caller must use it (see
    :func:`impl.fused_ops.sample`), or the compiler may drop the loads as dead."""
    n = u.shape[0]
    D = lay.shape[0] - (1 if kind == PLAIN else 2)
    acc = 0.0
    firsts = np.empty(n if kind == PREFIX else 0, dtype=np.uint64)  # scratch of the PREFIX scan
    counts = np.empty(n if kind == PREFIX else 0, dtype=np.int64)
    run = np.zeros(K if kind == PLAIN else 0)  # scratch of the PLAIN scan (_scan_plain)
    for b in range(n):
        j[b] = 0
    for d in range(1, D + 1):
        if d >= touch_from:
            acc += _touch(sums, lay, K, d, j, n)
            if d == D and kind != PLAIN:
                # The raw leaves of each draw's last group (the prefix trees' leaf row, as
                # large as the last level): their misses go in flight with the last level's,
                # instead of in a pass of their own after the descent (read_leaves).
                acc += _touch(sums, lay, K, D + 1, j, n)
        if kind == PLAIN and K == 2:
            # Binary: the scan's one running sum is the left child's slot (0.0 + it, exactly
            # as _scan_plain forms it), and u drops by it or by 0.0 (run[k]): a select, with no
            # scan loop of runtime length and no store and reload of run per draw.
            base, shift, bshift, mask, stride = level_row(lay, d)
            if shift == np.uint64(0) and bshift == np.uint64(0) and mask == np.uint64(0):
                # a level-order row (addr = base + j, the binary layout): the left child's slot
                # without the general formula's shifts and mask, all unsigned (no index fix-up)
                for b in range(n):
                    ub = u[b]
                    jb = np.uint64(j[b]) * np.uint64(2)
                    s = 0.0 + np.float64(sums[base + jb])
                    k = s <= ub
                    u[b] = ub - (s if k else 0.0)
                    j[b] = jb + np.uint64(k)
            else:
                for b in range(n):
                    ub = u[b]
                    jb = j[b]
                    s = 0.0 + np.float64(sums[_first_child(base, shift, bshift, mask, jb, 2)])
                    k = s <= ub
                    u[b] = ub - (s if k else 0.0)
                    j[b] = jb * 2 + k
        elif kind == PLAIN:
            base, shift, bshift, mask, stride = level_row(lay, d)
            if stride == np.uint64(1) and shift == np.uint64(0) and bshift == np.uint64(0) and mask == np.uint64(0):
                # A level-order row (addr = base + j): the groups are contiguous at base + jK,
                # and a literal stride lets the compiler unroll the scan with fixed offsets
                # (fully where K = 16 is a literal too: the same adds in the same order).
                if K == 16:
                    for b in range(n):
                        ub = u[b]
                        k = _scan_plain(sums, base + np.uint64(j[b]) * np.uint64(16), np.uint64(1), 16, ub, run)
                        u[b] = ub - run[np.uint64(k)]
                        j[b] = j[b] * 16 + k
                else:
                    for b in range(n):
                        ub = u[b]
                        k = _scan_plain(sums, base + np.uint64(j[b]) * np.uint64(K), np.uint64(1), K, ub, run)
                        u[b] = ub - run[np.uint64(k)]
                        j[b] = j[b] * K + k
            else:
                for b in range(n):
                    ub = u[b]
                    first = _first_child(base, shift, bshift, mask, j[b], K)
                    k = _scan_plain(sums, first, stride, K, ub, run)
                    u[b] = ub - run[np.uint64(k)]
                    j[b] = j[b] * K + k
        elif kind == PREFIX16:
            base, shift, bshift, mask, stride = level_row(lay, d)
            for b in range(n):
                first = _first_child(base, shift, bshift, mask, j[b], 16)
                ub = u[b]
                k = count_le15(sums, first, ub)  # the 15 compares as one vector compare
                if k > 0:
                    ub -= sums[first + np.uint64(k - 1)]
                u[b] = ub
                j[b] = j[b] * 16 + k
        else:
            # Any K: the compares run over the draws, child slot by child slot: each pass over
            # the draws is a loop of independent loads and compares, whatever K is (PREFIX16's
            # one vector compare per draw and level is the K = 16 alternative).
            base, shift, bshift, mask, stride = level_row(lay, d)
            for b in range(n):
                firsts[b] = _first_child(base, shift, bshift, mask, j[b], K)
                counts[b] = 0
            for c in range(K - 1):
                for b in range(n):
                    counts[b] += sums[firsts[b] + np.uint64(c)] <= u[b]
            for b in range(n):
                k = counts[b]
                if k > 0:
                    u[b] -= sums[firsts[b] + np.uint64(k - 1)]
                j[b] = j[b] * K + k
    return acc


@njit(nogil=True, cache=True)
def read_leaves(kind, sums, lay, touch_from, j, out_priority):
    """Leaf values of the reached leaves ``j`` into ``out_priority``; a zero leaf turns its
    entry of ``j`` into ``-1``. Returns ``(how many did, 0.0)``. The prefix trees keep their
    leaves in a row of their own; where it leaves cache, :func:`descend` has touched each
    draw's leaf group with its last level, so this reads lines already requested (the second
    value, once the sum of a touch pass here, stays for the callers that add it in)."""
    row = lay.shape[0] - 1  # the leaves' row in every layout (the prefix trees' extra row)
    return kernels.read_reached_leaves(sums, lay, row, j, out_priority), 0.0


@njit(nogil=True, cache=True)
def find(kind, sums, lay, K, touch_from, us, out_index, out_priority):
    """A tree's ``find``: :func:`descend` (with its touch passes) on a copy of ``us``, then
    :func:`read_leaves`. Rounding can push ``u`` past a subtree's stored sum and land on a zero
    leaf; such draws get index ``-1`` (priority 0) so the caller redraws them: a zero-priority
    leaf is never returned. Returns how many draws did."""
    u = us.copy()
    acc = descend(kind, sums, lay, K, touch_from, u, out_index)
    misses, leaf_touch = read_leaves(kind, sums, lay, touch_from, out_index, out_priority)
    if out_priority.shape[0] > 0:
        out_priority[0] += 0.0 * (acc + leaf_touch)  # adds 0; keeps the touch loads (see descend)
    return misses
