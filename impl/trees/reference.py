"""The O(N) oracle: leaf priorities in a float64 array, prefix sums and a binary search.

Obviously correct rather than fast: every query recomputes what it needs from the leaves.
Tests compare every tree against it.
"""

from __future__ import annotations

import numpy as np

from . import kernels
from .base import SumTree, as_indices, as_priorities, raise_for_status

__all__ = ["ReferenceSumTree"]


class ReferenceSumTree(SumTree):
    """Cost: update O(n), find O(N + n log N), total and min O(N). Not thread-safe."""

    def __init__(self, capacity: int, dtype="float64"):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        self.capacity = int(capacity)
        self.dtype = np.dtype(np.float64)
        self._p = np.zeros(self.capacity, dtype=np.float64)

    def update(self, indices, priorities, *, n_valid=None, eps=0.0, alpha=1.0) -> float:
        idx = as_indices(indices)
        vals = as_priorities(priorities, idx.shape[0])
        # n_valid only narrows the range: indices past capacity would write outside the leaves
        limit = self.capacity if n_valid is None else min(int(n_valid), self.capacity)
        # Like the kernels: the first bad entry in batch order, checks in the same order.
        first = min(self._first_bad(idx, vals, limit), default=None)
        if first is not None:
            raise_for_status(first[1], first[0], idx, vals, limit, "priorities")
        with np.errstate(over="ignore"):
            p = (vals + eps) ** alpha
        vmax = float(np.finfo(np.float64).max) / (2.0 * self.capacity)  # as the array trees
        over = np.flatnonzero(~(p <= vmax))
        if over.size:
            raise_for_status(kernels.STATUS_OVERFLOW, int(over[0]), idx, vals, limit, "priorities",
                             eps=eps, alpha=alpha, vmax=vmax)
        self._p[idx] = p  # numpy applies repeated indices in order: the last one wins
        return float(p.max()) if p.size else 0.0

    @staticmethod
    def _first_bad(idx, vals, limit):
        for check, status in (((idx < 0) | (idx >= limit), kernels.STATUS_INDEX),
                              (~np.isfinite(vals), kernels.STATUS_NONFINITE),
                              (vals < 0, kernels.STATUS_NEGATIVE)):
            where = np.flatnonzero(check)
            if where.size:
                yield int(where[0]), status

    def find(self, us):
        us = np.asarray(us, dtype=np.float64)
        cum = np.cumsum(self._p)
        idx = np.searchsorted(cum, us, side="right").astype(np.int64)
        idx[idx >= self.capacity] = -1
        prio = np.where(idx >= 0, self._p[np.maximum(idx, 0)], 0.0)
        idx[prio <= 0] = -1
        return idx, prio

    def get(self, indices):
        idx = as_indices(indices)
        bad = np.flatnonzero((idx < 0) | (idx >= self.capacity))
        if bad.size:
            raise_for_status(kernels.STATUS_INDEX, int(bad[0]), idx, None, self.capacity, "indices")
        return self._p[idx].copy()

    def total(self) -> float:
        return float(self._p.sum())

    def min(self) -> float:
        pos = self._p[self._p > 0]
        return float(pos.min()) if pos.size else float("inf")

    def rebuild(self) -> None:
        pass  # nothing is derived and stored
