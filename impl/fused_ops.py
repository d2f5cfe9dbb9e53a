"""One ``nogil`` compiled call per buffer operation: sample, add, (update: :func:`impl.trees.ops.update`).

:func:`sample` draws the uniforms, descends the tree, reads the reached leaves, redraws the
rare draws that rounding sent onto a zero leaf, computes the importance weights and gathers
every field into the caller's output block, all in one call that holds no GIL; :func:`add`
sets the new slots' priorities and writes their rows. The Python around them
(:mod:`impl.buffers`) only checks arguments, so concurrent callers overlap everything else.

Random draws (reproducible, thread-independent)
-----------------------------------------------
numba's own generator is one stream per thread, so draws made with it would depend on which
thread ran a call. Instead each call takes one 63-bit key from the caller's
``numpy.random.Generator`` (``bit_generator.random_raw() >> 1``, one step of that generator,
under its lock) and draw ``c`` of the call is SplitMix64 (Steele et al. 2014: a counter-based
generator, every output a bijective hash of ``key + (c + 1) * golden gamma``) of that key,
as a 53-bit float in ``[0, 1)``. The same seed gives the same samples whatever thread runs
them, concurrent calls on one Generator get distinct keys, and no state is shared between
calls. Counters: draw ``b`` of the batch uses ``c = b``; the ``r``-th redraw round of
position ``b`` uses ``c = r * n + b``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .storage import gather_rows, write_rows
from .trees import kernels, ops

__all__ = ["UNIFORM", "STATUS_OK", "STATUS_NO_MASS", "STATUS_REDRAWS", "MAX_REDRAWS", "REBUILD_AFTER", "mass", "redraw",
           "uniform01", "sample", "sample_uniform", "add", "uniform_tree_args"]

#: The ``kind`` of a buffer without a tree (uniform sampling over ``size`` slots).
UNIFORM = -1

STATUS_OK = 0
STATUS_NO_MASS = 10  # every priority is 0
STATUS_REDRAWS = 11  # redraws kept landing on zero leaves (inconsistent inner sums)

#: Redraw rounds before giving up, and the round that first rebuilds the tree (as SumTree.sample).
MAX_REDRAWS = 64
REBUILD_AFTER = 8


def uniform_tree_args() -> tuple:
    """Stand-in tree arguments for :data:`UNIFORM` buffers (typed like a float32 tree's)."""
    return (UNIFORM, np.zeros(1, np.float32), np.zeros(1, np.float32), np.zeros((1, 5), np.int64), 2, 1, 1,
            np.zeros(3))


@njit(nogil=True, cache=True, inline="always")
def uniform01(key, counter):
    """Draw ``counter`` of stream ``key``: SplitMix64's output as a float in ``[0, 1)``."""
    z = np.uint64(key) + np.uint64(counter + 1) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(nogil=True, cache=True, inline="always")
def mass(key, counter, b, n, total, stratified):
    v = uniform01(key, counter)
    return (b + v) * (total / n) if stratified else v * total


@njit(nogil=True, cache=True)
def ring_slots(start, keep, capacity):
    """The ``keep`` ring slots from ``start`` on, wrapping at ``capacity`` (``keep <= capacity``)."""
    slots = np.empty(keep, dtype=np.int64)
    for b in range(keep):
        slot = start + b
        slots[b] = slot if slot < capacity else slot - capacity
    return slots


@njit(nogil=True, cache=True)
def redraw(kind, sums, mins, lay, K, touch_from, state, key, stratified, out_index, prio):
    """Redraw the positions whose ``out_index`` is -1 until none is (see :data:`MAX_REDRAWS`)."""
    n = out_index.shape[0]
    root = lay[0, 0]
    total = np.float64(sums[root])
    for attempt in range(MAX_REDRAWS):
        bad = np.flatnonzero(out_index < 0)
        if bad.shape[0] == 0:
            return STATUS_OK
        if attempt == REBUILD_AFTER:
            # Redraws keep missing: drift has left a stratum (or more) past the real mass.
            ops.rebuild(kind, sums, mins, lay, K, state)
            total = np.float64(sums[root])
        u = np.empty(bad.shape[0])
        j = np.empty(bad.shape[0], dtype=np.int64)
        p = np.empty(bad.shape[0])
        for r in range(bad.shape[0]):
            u[r] = mass(key, (attempt + 1) * n + bad[r], bad[r], n, total, stratified)
        ops.descend(kind, sums, lay, K, touch_from, u, j)  # rare: the touch sums need not be kept
        ops.read_leaves(kind, sums, lay, touch_from, j, p)
        for r in range(bad.shape[0]):
            out_index[bad[r]] = j[r]
            prio[bad[r]] = p[r]
    return STATUS_OK if np.all(out_index >= 0) else STATUS_REDRAWS


@njit(nogil=True, cache=True)
def sample_uniform(size, key, arena, table, out, out_table, out_index, out_weight, scratch):
    """:func:`sample` of a :data:`UNIFORM` buffer (slots ``0 .. size - 1``, weights 1), without
    the tree's arguments, which it does not read: numba's dispatch unboxes every argument of
    every call while holding the GIL, so the uniform buffer calls this directly. ``scratch``
    is unused (it keeps the tail of :func:`sample`'s arguments). Always ``STATUS_OK``.
    Cost: O(n * row bytes)."""
    n = out_index.shape[0]
    for b in range(n):
        i = np.int64(uniform01(key, b) * size)
        out_index[b] = i if i < size else size - 1
    for b in range(n):
        out_weight[b] = 1.0
    touched = gather_rows(arena, table, out_index, out, out_table, False)
    # Adds 0, but the compiler cannot know that, so it keeps the loads (as sample does).
    if n > 0:
        out_weight[0] += 0.0 * touched
    return STATUS_OK


@njit(nogil=True, cache=True)
def sample(kind, sums, mins, lay, K, kshift, touch_from, state, size, key, stratified, beta,
           arena, table, out, out_table, out_index, out_weight, scratch):
    """One whole ``sample`` call; returns a status code (``STATUS_*``).

    ``kind .. state``: the tree's kernel arguments (:mod:`impl.trees.ops`), or
    :func:`uniform_tree_args` for uniform sampling over slots ``0 .. size - 1``. ``key``: the
    call's stream (module docstring). ``arena, table``: the storage
    (:mod:`impl.storage`); the rows at the drawn slots go to ``out`` (address table
    ``out_table``), the slots to ``out_index``, the weights ``(p / p_min) ** -beta`` (float64,
    then rounded to float32) to ``out_weight``. ``scratch``: float64, one per draw.
    The rows are not touched before the copy: :func:`impl.storage.gather_rows` copies each row
    with a few independent loads, so the copy itself has many rows' misses in flight, and a
    separate pass over the drawn rows measured slower than none (its loads are extra work).
    Cost: O(n K D) for the descent plus O(n * row bytes) for the gather; no allocation unless
    a draw has to be redrawn.
    """
    if kind == UNIFORM:
        return sample_uniform(size, key, arena, table, out, out_table, out_index, out_weight, scratch)
    n = out_index.shape[0]
    touched = 0.0  # sum of what the touch passes loaded: used below so that no pass is dropped
    root = lay[0, 0]
    total = np.float64(sums[root])
    if not total > 0.0:
        return STATUS_NO_MASS
    for b in range(n):
        scratch[b] = mass(key, b, b, n, total, stratified)
    touched += ops.descend(kind, sums, lay, K, touch_from, scratch, out_index)
    misses, leaf_touch = ops.read_leaves(kind, sums, lay, touch_from, out_index, scratch)
    touched += leaf_touch
    if misses > 0:
        status = redraw(kind, sums, mins, lay, K, touch_from, state, key, stratified, out_index, scratch)
        if status != STATUS_OK:
            return status
    pmin = np.float64(mins[root])
    for b in range(n):
        out_weight[b] = (scratch[b] / pmin) ** -beta
    touched += gather_rows(arena, table, out_index, out, out_table, False)
    # Adds 0 (the sums are finite), but the compiler cannot know that, so it keeps the loads.
    if n > 0:
        out_weight[0] += 0.0 * touched
    return STATUS_OK



@njit(nogil=True, cache=True)
def add(kind, sums, mins, lay, K, kshift, touch_from, state, capacity, start, max_priority, values, eps, alpha,
        vmax, arena, table, rows, keep):
    """One whole ``add`` call for ``keep`` rows (``rows``: :meth:`impl.storage.Storage.as_bytes`)
    at ring slots ``start ..``.

    The tree first: with ``values`` empty every new slot gets ``max_priority`` (a fill), else
    slot ``b`` gets ``(values[b] + eps) ** alpha``, checked before anything is written. Then the
    rows. Returns ``(status, position, max p)`` as :func:`impl.trees.ops.update`; nothing is
    written unless the status is ``STATUS_OK``. Cost O(keep * (D + row bytes)).
    """
    pmax = 0.0
    if kind != UNIFORM:
        if values.shape[0] == 0:
            ops.fill(kind, sums, mins, lay, K, kshift, touch_from, state, start, keep, capacity, max_priority)
        else:
            slots = ring_slots(start, keep, capacity)
            status, pos, pmax = ops.update(kind, sums, mins, lay, K, kshift, touch_from, state, slots, values,
                                           capacity, eps, alpha, vmax)
            if status != kernels.STATUS_OK:
                return status, pos, 0.0
    write_rows(arena, table, start, capacity, rows, keep)
    return kernels.STATUS_OK, -1, pmax
