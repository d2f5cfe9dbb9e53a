"""The array-backed sum trees: binary, K-ary, cache-aligned K-ary, cache-blocked binary, and
the cache-aligned K-ary tree with running sums in each sibling group (prefix).

The first four share :mod:`impl.trees.kernels` and differ only in their address table
(:mod:`impl.trees.layouts`), so a difference in the benchmarks is a difference of layout; the
prefix tree uses the same tables with :mod:`impl.trees.prefix_kernels`.

Numeric error (float32 sums)
----------------------------
Delta propagation rounds at most once per ancestor per update (once per ancestor per update
call, in fact: a call's changes below a node are summed in float64 first,
:func:`impl.trees.kernels.propagate_batch`), so the stored sum of a node drifts from the
exact sum of its leaves. Between two rebuilds, after ``m`` updates,
``|stored - exact| <= m * 2**-24 * T_max`` for the root (``T_max`` the largest total held
in that time; the float64 delta itself is exact). The tree therefore rebuilds itself from
the leaves every ``resum_every`` updates (default ``max(2**16, capacity)``, amortised cost of
about one leaf read per update), and sooner when the total has fallen: it rebuilds once
``m * T_max > resum_every * T`` (``T_max`` read after each update call, ``T`` the current
total), since after a fall the error relative to ``T`` is ``T_max / T`` times larger and
sampling would be biased. This caps the root's relative error after every update call at about
``(resum_every + n + K * D) * 2**-24`` (``n`` the call's batch size). Rounding is unbiased, so
in practice the error grows like ``sqrt(m)`` and stays near ``1e-5`` relative
(tests/test_drift.py).
float64 sums have the same bound with ``2**-53`` and never need a rebuild in practice.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from .. import machine
from . import kernels, layouts, ops, prefix_kernels
from .base import SumTree, as_indices, as_priorities, raise_for_status

__all__ = [
    "TOUCH_LEVEL_BYTES",
    "touch_depth",
    "check_capacity",
    "check_K",
    "ArraySumTree",
    "BinarySumTree",
    "KarySumTree",
    "AlignedKarySumTree",
    "BlockedBinarySumTree",
    "PrefixKarySumTree",
]

_DTYPES = {"float32": np.float32, "float64": np.float64}

#: A level larger than this (bytes of its slots) is taken to leave the core's private caches:
#: with ``prefetch=True`` descents touch it in a separate pass first (see :mod:`impl.trees.ops`).
TOUCH_LEVEL_BYTES = 2**18


def touch_depth(lay: np.ndarray, K: int, itemsize: int, depth: int) -> int:
    """First depth ``d`` whose ``K**d`` slots exceed :data:`TOUCH_LEVEL_BYTES`; ``depth + 1``
    when none does (a tree small enough to stay cached gets no touch pass)."""
    for d in range(depth + 1):
        if K**d * itemsize > TOUCH_LEVEL_BYTES:
            return d
    return depth + 1


def _check_flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_capacity(capacity) -> int:
    """``capacity`` as an int, or a ValueError naming it: for tree constructors."""
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
    return int(capacity)


def _check_dtype(dtype) -> np.dtype:
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in _DTYPES:
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    return np.dtype(_DTYPES[name])


def check_K(K, power_of_two: bool = False, high: int = 64) -> int:
    """``K`` as an int in ``2 .. high`` (a power of 2 if asked), or a ValueError naming it."""
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or not 2 <= K <= high:
        raise ValueError(f"K must be an integer from 2 to {high}, got {K!r}")
    if power_of_two and not layouts.is_power_of_two(int(K)):
        raise ValueError(f"K must be a power of 2 for this layout (cache-line alignment), got {K!r}")
    return int(K)


class ArraySumTree(SumTree):
    """A sum tree (plus a min tree) stored as flat arrays in a given layout.

    Cost: :meth:`update` O(n log_K N) for the sums, and for the minima typically two loads per
    item (O(n K log_K N) worst case); :meth:`fill` O(n + K log_K N) per contiguous run;
    :meth:`find` O(n K log_K N); :meth:`total`, :meth:`min` O(1); :meth:`rebuild` O(N).
    Thread-safety: none (the kernels release the GIL; callers serialise).

    Parameters beside the layout: ``prefetch`` adds a touch pass to each level of a descent
    that leaves the caches (:func:`touch_depth`); ``hugepages`` puts :attr:`sums` and
    :attr:`mins` on transparent huge pages (:func:`layouts.aligned_empty`). Neither changes a
    result, only the memory traffic, so both are measured on and off in the micro scenario.
    """

    #: The descent code this tree's kernels take in :mod:`impl.trees.ops`.
    kind = ops.PLAIN

    #: The module whose numba functions do this tree's work (``update``, ``fill``, ``get``,
    #: ``rebuild``; the descent is :func:`impl.trees.ops.descend`, chosen by :attr:`kind`); the
    #: prefix-sum tree declares its own. Tools that replay the kernels (the cache tracer) key on
    #: it, so a tree with a kernel set they do not know is never replayed as another.
    kernels = kernels

    def __init__(self, capacity: int, K: int, lay: np.ndarray, size: int, dtype="float32",
                 resum_every: int | None = None, *, prefetch=False, hugepages=False, depth=None):
        self.capacity = capacity
        self.K = K
        self.dtype = _check_dtype(dtype)
        #: The precision of the values the leaves hold: :attr:`dtype`, except in a tree made by
        #: :meth:`widened`, whose slots are float64 and whose leaves hold the narrower values.
        self.leaf_dtype = self.dtype
        self.hugepages = _check_flag("hugepages", hugepages)
        self._lay = lay
        self._kshift = K.bit_length() - 1 if layouts.is_power_of_two(K) else -1
        machine.check_memory(2 * size * self.dtype.itemsize, f"a {type(self).__name__} of capacity={capacity} "
                             f"(sums and mins of {size} nodes)")
        self._sums = layouts.aligned_empty(size, self.dtype, 0.0, self.hugepages)
        self._mins = layouts.aligned_empty(size, self.dtype, np.inf, self.hugepages)
        self._root = int(lay[0, 0])
        self.depth = lay.shape[0] - 1 if depth is None else depth
        if resum_every is None:
            resum_every = max(2**16, capacity) if self.dtype == np.float32 else 2**62
        if resum_every < 1:
            raise ValueError(f"resum_every must be >= 1, got {resum_every!r}")
        # updates since the last rebuild, largest total read after an update since, resum_every,
        # rebuilds so far (impl.trees.ops applies the rule in compiled code)
        self._state = np.array([0.0, 0.0, float(resum_every), 0.0])
        # Largest storable priority: a leaf at the dtype's max would make the sums overflow,
        # so leave room for the total (capacity leaves) below it.
        self._vmax = float(np.finfo(self.dtype).max) / (2.0 * capacity)
        self.prefetch = prefetch  # binds the kernel arguments

    @property
    def prefetch(self) -> bool:
        """Whether descents touch the levels that leave the caches first (:func:`touch_depth`).
        Settable (True or False; speed only, never a result): a buffer whose ``prefetch`` is
        ``"auto"`` sets it from its working set (:mod:`impl.working_set`)."""
        return self._prefetch

    @prefetch.setter
    def prefetch(self, value) -> None:
        self._prefetch = _check_flag("prefetch", value)
        self._touch_from = (touch_depth(self._lay, self.K, self.dtype.itemsize, self.depth) if self._prefetch
                            else self.depth + 1)
        self._bind_kernel_args()

    def _bind_kernel_args(self) -> None:
        self.kernel_args = (self.kind, self._sums, self._mins, self._lay, self.K, self._kshift, self._touch_from,
                            self._state)

    @property
    def resum_every(self) -> int:
        """Updates between two rebuilds from the leaves (see the module docstring)."""
        return int(self._state[2])

    @resum_every.setter
    def resum_every(self, value: int) -> None:
        self._state[2] = float(value)

    @property
    def rebuilds(self) -> int:
        """How many times the tree has been rebuilt from its leaves (by :meth:`rebuild`, the
        re-summing rule, or a sample that kept landing on zero leaves)."""
        return int(self._state[3])

    @property
    def layout(self) -> np.ndarray:
        """The address table (read-only view): row ``d`` holds ``base, shift, bshift, mask, stride``
        of depth ``d`` and node ``(d, j)`` lives at slot ``kernels.addr(layout, d, j)`` of
        :attr:`sums` and :attr:`mins` (:mod:`impl.trees.kernels`). Depths run ``0 ..``
        :attr:`depth`; a kernel set may append rows of its own (the prefix tree's raw-leaf row)."""
        view = self._lay.view()
        view.flags.writeable = False
        return view

    @property
    def sums(self) -> np.ndarray:
        """The array of sums the kernels read and write (the tree's state, not a copy: do not write)."""
        return self._sums

    @property
    def mins(self) -> np.ndarray:
        """The array of minima, addressed as :attr:`sums` (the tree's state, not a copy: do not write)."""
        return self._mins

    @property
    def nbytes(self) -> int:
        return self._sums.nbytes + self._mins.nbytes

    def update(self, indices, priorities, *, n_valid=None, eps=0.0, alpha=1.0) -> float:
        idx = as_indices(indices)
        vals = as_priorities(priorities, idx.shape[0])
        # n_valid only narrows the range: indices past capacity would write outside the leaves
        limit = self.capacity if n_valid is None else min(int(n_valid), self.capacity)
        status, pos, pmax = ops.update(*self.kernel_args, idx, vals, limit, float(eps), float(alpha), self._vmax)
        raise_for_status(status, pos, idx, vals, limit, "priorities", eps=eps, alpha=alpha, vmax=self._vmax)
        return pmax

    def write_leaves(self, indices, priorities, *, n_valid=None, eps=0.0, alpha=1.0):
        """The first half of :meth:`update`: store the leaves, leave the inner nodes stale.

        Returns ``(indices, deltas, max_priority)``; :meth:`propagate` with those arrays
        completes the update. Between the two, :meth:`find` and :meth:`total` read inner
        nodes that miss the deltas (the deferred and two-lock policies rely on this split).
        Not counted towards re-summing: the caller counts. Cost O(n). Raises
        NotImplementedError for structures whose inner nodes are not plain child sums.
        """
        if self.kernels is not kernels:
            raise NotImplementedError(f"{type(self).__name__} keeps running sums in its inner nodes; "
                                      "split leaf/inner updates are only implemented for plain sum trees")
        idx = as_indices(indices)
        vals = as_priorities(priorities, idx.shape[0])
        limit = self.capacity if n_valid is None else min(int(n_valid), self.capacity)
        deltas = np.empty(idx.shape[0], dtype=np.float64)
        status, pos, pmax = kernels.write_leaves(self._sums, self._mins, self._lay, idx, vals, limit, float(eps),
                                                 float(alpha), self._vmax, deltas)
        raise_for_status(status, pos, idx, vals, limit, "priorities", eps=eps, alpha=alpha, vmax=self._vmax)
        return idx, deltas, pmax

    def propagate(self, indices: np.ndarray, deltas: np.ndarray) -> None:
        """Add leaf ``deltas`` (from :meth:`write_leaves`) to the inner nodes. O(n K D)."""
        kernels.propagate_paths(self._sums, self._mins, self._lay, self.K, self._kshift, indices, deltas)

    def widened(self) -> "ArraySumTree":
        """A tree of the same class, layout, capacity and parameters whose sums and minima are
        float64 (a copy of this one's state), that refuses the same leaf values as this one
        (:attr:`max_leaf` kept). For a policy that adds into the inner nodes with atomic float
        adds, each rounded on its own (:mod:`impl.concurrent.policies.atomic_deltas`): float64
        makes that drift 2**29 times smaller than float32. The leaves hold whatever values the
        caller writes (that policy writes each one rounded to :attr:`leaf_dtype`, this tree's
        dtype, first). O(size)."""
        tree = copy.copy(self)
        tree.leaf_dtype = self.dtype
        tree.dtype = np.dtype(np.float64)
        tree._sums = layouts.aligned_empty(self._sums.size, np.float64, 0.0, self.hugepages)
        tree._mins = layouts.aligned_empty(self._mins.size, np.float64, np.inf, self.hugepages)
        tree._sums[:] = self._sums
        tree._mins[:] = self._mins
        tree._state = self._state.copy()
        tree.prefetch = self._prefetch  # the touch depth follows the wider slots; binds the kernel arguments
        return tree

    def shared_arrays(self) -> dict[str, np.ndarray]:
        """The arrays that hold the tree's whole state (for placing it in shared memory)."""
        return {"sums": self._sums, "mins": self._mins}

    def bind_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Use ``arrays`` (same shapes and dtypes as :meth:`shared_arrays`) as the tree's state."""
        for name, current in self.shared_arrays().items():
            new = arrays[name]
            if new.shape != current.shape or new.dtype != current.dtype:
                raise ValueError(f"array {name!r} has shape {new.shape} and dtype {new.dtype}; "
                                 f"expected {current.shape} and {current.dtype}")
        self._sums, self._mins = arrays["sums"], arrays["mins"]
        self._bind_kernel_args()

    def fill(self, start: int, count: int, priority: float) -> None:
        if not (math.isfinite(priority) and priority >= 0):
            raise ValueError(f"priority = {priority!r} must be finite and >= 0")
        if not 0 <= start < self.capacity or not 0 <= count <= self.capacity:
            raise IndexError(f"fill(start={start}, count={count}) is outside capacity {self.capacity}")
        ops.fill(*self.kernel_args, start, count, self.capacity, float(priority))

    def find(self, us):
        us = np.ascontiguousarray(us, dtype=np.float64)
        idx = np.empty(us.shape[0], dtype=np.int64)
        prio = np.empty(us.shape[0], dtype=np.float64)
        self._find_into(us, idx, prio)
        return idx, prio

    def _find_into(self, us, out_index, out_priority) -> int:
        # the compiled descent of the fused sample (impl.trees.ops), touch passes included
        return ops.find(self.kind, self._sums, self._lay, self.K, self._touch_from, us, out_index, out_priority)

    def get(self, indices):
        idx = as_indices(indices)
        bad = np.flatnonzero((idx < 0) | (idx >= self.capacity))
        if bad.size:
            raise_for_status(kernels.STATUS_INDEX, int(bad[0]), idx, None, self.capacity, "indices")
        out = np.empty(idx.shape[0], dtype=np.float64)
        self.kernels.get(self._sums, self._lay, idx, out)
        return out

    def total(self) -> float:
        return float(self._sums[self._root])

    def min(self) -> float:
        return float(self._mins[self._root])

    def rebuild(self) -> None:
        ops.rebuild(self.kind, self._sums, self._mins, self._lay, self.K, self._state)

    supports_split_updates = True  # inner nodes are plain child sums: write_leaves + propagate work

    @property
    def max_leaf(self) -> float:
        """The largest leaf value ``(p + eps) ** alpha`` this tree stores; updates that would
        exceed it are refused (the sums of ``capacity`` such leaves cannot overflow)."""
        return self._vmax


class BinarySumTree(ArraySumTree):
    """Binary sum tree, the classic 1-indexed heap (node i's children are 2i and 2i+1)."""

    def __init__(self, capacity: int, dtype="float32", resum_every=None, *, prefetch=False, hugepages=False):
        capacity = check_capacity(capacity)
        lay, size = layouts.level_order(capacity, 2, padded=True)
        super().__init__(capacity, 2, lay, size, dtype, resum_every, prefetch=prefetch, hugepages=hugepages)


class KarySumTree(ArraySumTree):
    """K-ary sum tree in plain level order (children of i at iK+1 .. iK+K), no padding.

    Sibling groups start wherever the previous level ended, so for K=16 float32 most groups
    straddle two cache lines: the unaligned baseline for the PAL layout.
    """

    def __init__(self, capacity: int, K: int = 16, dtype="float32", resum_every=None, *, prefetch=False,
                 hugepages=False):
        capacity = check_capacity(capacity)
        K = check_K(K, power_of_two=False)
        lay, size = layouts.level_order(capacity, K, padded=False)
        super().__init__(capacity, K, lay, size, dtype, resum_every, prefetch=prefetch, hugepages=hugepages)


class AlignedKarySumTree(ArraySumTree):
    """PAL's layout: K-ary level order padded by K-1 slots on a 64-byte-aligned array.

    Every sibling group starts at a multiple of K, so with K=16 float32 a group is exactly
    one cache line and a descent touches one line per level. K must be a power of 2.
    """

    def __init__(self, capacity: int, K: int = 16, dtype="float32", resum_every=None, *, prefetch=False,
                 hugepages=False):
        capacity = check_capacity(capacity)
        K = check_K(K, power_of_two=True)
        lay, size = layouts.level_order(capacity, K, padded=True)
        super().__init__(capacity, K, lay, size, dtype, resum_every, prefetch=prefetch, hugepages=hugepages)


class BlockedBinarySumTree(ArraySumTree):
    """Binary sum tree whose 4-level subtrees each fill one 16-slot block (a cache line at
    float32), so a descent touches about one line per four levels."""

    def __init__(self, capacity: int, dtype="float32", resum_every=None, *, prefetch=False, hugepages=False):
        capacity = check_capacity(capacity)
        lay, size = layouts.blocked(capacity)
        super().__init__(capacity, 2, lay, size, dtype, resum_every, prefetch=prefetch, hugepages=hugepages)


class PrefixKarySumTree(ArraySumTree):
    """Cache-aligned K-ary tree whose sibling groups hold running sums (see
    :mod:`impl.trees.prefix_kernels`): the descent compares, it never adds. K a power of 2.

    ``kernel="specialised"`` (K = 16 only) descends with one vector compare per level of the
    16-slot group (:func:`impl.trees.ops.count_le15`), beside the ``"generic"`` loop over any K (each
    child slot's compares run over all the draws); ``"auto"`` (the default) takes the specialised one where K = 16.
    The results are identical, the speed is what the micro scenario compares (``sweep-kernel``);
    :attr:`kernel` says which one runs.
    """

    kernels = prefix_kernels
    KERNELS = ("generic", "specialised")

    def __init__(self, capacity: int, K: int = 16, dtype="float32", resum_every=None, *, prefetch=False,
                 hugepages=False, kernel="auto"):
        capacity = check_capacity(capacity)
        K = check_K(K, power_of_two=True)
        if kernel != "auto" and kernel not in self.KERNELS:
            raise ValueError(f"kernel must be one of {('auto', *self.KERNELS)}, got {kernel!r}")
        if kernel == "specialised" and K != 16:
            raise ValueError(f"kernel='specialised' is the K=16 descent; got K={K!r}")
        #: The descent that runs: ``"specialised"`` or ``"generic"`` (``"auto"`` resolved).
        self.kernel = kernel if kernel != "auto" else ("specialised" if K == 16 else "generic")
        self.kind = ops.PREFIX16 if self.kernel == "specialised" else ops.PREFIX
        lay, size = layouts.level_order(capacity, K, padded=True)
        lay, size = layouts.with_leaf_row(lay, size, K)
        # the last table row places the leaves, it is not a level
        super().__init__(capacity, K, lay, size, dtype, resum_every, prefetch=prefetch, hugepages=hugepages,
                         depth=lay.shape[0] - 2)

    supports_split_updates = False  # inner nodes hold running sums: a leaf delta is not a path add
