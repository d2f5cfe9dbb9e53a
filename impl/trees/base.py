"""The contract every priority structure meets, and the checks they share.

A priority structure maps leaf ``i`` in ``[0, capacity)`` to a priority ``p_i >= 0`` and
answers prefix-sum searches over those priorities. It holds no locks: thread-safety is the
job of a concurrency policy wrapped around it (DESIGN.md, "three independent axes").
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod

import numpy as np

from . import kernels

__all__ = ["SumTree", "as_indices", "as_priorities", "check_real", "raise_for_status", "MAX_REDRAWS"]

#: How often sample() redraws positions that rounding sent onto a zero leaf before giving up.
MAX_REDRAWS = 64
#: After this many redraw rounds sample() rebuilds the tree once (see there).
REBUILD_AFTER = 8


# Built-in dtypes are singletons: ``arr.dtype is _INT64`` is a cheap exact test (a False only
# sends an array to the general path).
_INT64 = np.dtype(np.int64)
_FLOAT64 = np.dtype(np.float64)


def as_indices(indices, name: str = "indices") -> np.ndarray:
    """``indices`` as a 1-D contiguous int64 array, or a TypeError/ValueError naming it.

    An unsigned index above ``2**63 - 1`` (no int64 holds it) raises IndexError here, naming
    the value as given, before the values of a batch are checked.
    """
    if (type(indices) is np.ndarray and indices.dtype is _INT64 and indices.ndim == 1
            and indices.flags.c_contiguous):
        return indices  # the common case, checked first: what the general path returns for it
    arr = np.asarray(indices)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    elif arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        if arr.size == 0:
            return np.empty(0, dtype=np.int64)
        raise TypeError(f"{name} must be integers, got dtype {arr.dtype}: {name}[0] = {arr[:1].tolist()[0]!r}")
    if arr.dtype == np.uint64 and arr.size:
        huge = np.flatnonzero(arr > np.iinfo(np.int64).max)
        if huge.size:  # the cast below would wrap it to a negative number
            pos = int(huge[0])
            raise IndexError(f"{name}[{pos}] = {int(arr[pos])} is out of range: no index exceeds 2**63 - 1")
    return np.ascontiguousarray(arr, dtype=np.int64)


def check_real(arr: np.ndarray, name: str) -> np.ndarray:
    """``arr`` itself when its dtype holds real numbers (float, int, bool); otherwise a
    TypeError naming ``name``, the dtype and the first entry that is not a real number (a
    string, a complex number, an object), so nothing downstream (``abs``, a cast) turns it
    into a priority or fails with NumPy's own error. O(1) for a real dtype."""
    if arr.dtype.kind in "fiub":
        return arr
    flat = arr.reshape(-1)
    # Name the first offending entry (this path is only taken to raise, so a scan is fine):
    # one with an imaginary part, one that is not a number in an object array, else the first.
    if arr.dtype.kind == "c":
        bad = np.flatnonzero(flat.imag != 0)
    elif arr.dtype.kind == "O":
        bad = [i for i, v in enumerate(flat) if not isinstance(v, numbers.Real)]
    else:
        bad = range(flat.size)
    if len(bad) == 0:
        raise TypeError(f"{name} must be numbers in a real dtype (float, int or bool), got dtype {arr.dtype}")
    pos = int(bad[0])
    raise TypeError(f"{name} must be numbers, got dtype {arr.dtype}: {name}[{pos}] = {flat[pos:pos + 1].tolist()[0]!r} "
                    f"is not a real number")


def as_priorities(priorities, n: int, name: str = "priorities") -> np.ndarray:
    """``priorities`` as a contiguous float64 array of length ``n`` (a scalar is broadcast)."""
    if (type(priorities) is np.ndarray and priorities.dtype is _FLOAT64 and priorities.shape == (n,)
            and priorities.flags.c_contiguous):
        return priorities  # the common case, checked first: what the general path returns for it
    arr = check_real(np.asarray(priorities), name)
    if arr.ndim == 0:
        return np.full(n, arr, dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) to match indices, got {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.float64)


def raise_for_status(status: int, pos: int, indices, values, n_valid: int, name: str, *, eps=0.0, alpha=1.0,
                     vmax=None) -> None:
    """Turn a kernel status code into an error that names the argument and the value."""
    if status == kernels.STATUS_OK:
        return
    if status == kernels.STATUS_INDEX:
        raise IndexError(
            f"indices[{pos}] = {int(indices[pos])} is out of range: valid indices are "
            f"0 .. {n_valid - 1}" if n_valid > 0 else
            f"indices[{pos}] = {int(indices[pos])} is out of range: nothing is stored yet"
        )
    if status == kernels.STATUS_OVERFLOW:
        raise ValueError(f"{name}[{pos}] = {float(values[pos])!r} is too large: (p + eps) ** alpha with "
                         f"eps={eps!r}, alpha={alpha!r} exceeds {vmax:.3g}, the most this tree can store "
                         f"without its sums overflowing")
    what = "not finite" if status == kernels.STATUS_NONFINITE else "negative"
    raise ValueError(f"{name}[{pos}] = {float(values[pos])!r} is {what}; priorities must be finite and >= 0")


class SumTree(ABC):
    """Leaf priorities with O(log N) updates and prefix-sum search.

    Subclasses implement :meth:`update`, :meth:`find`, :meth:`get`, :meth:`total`,
    :meth:`min` and :meth:`rebuild`; sampling is built on :meth:`find` here.

    Thread-safety: none. Concurrent calls must be serialised by the caller.
    """

    capacity: int
    dtype: np.dtype
    #: Whether updates can be split into ``write_leaves`` and ``propagate`` (the pal-locks and
    #: deferred concurrency policies need it); a capability, declared by each structure.
    supports_split_updates: bool = False

    @abstractmethod
    def update(self, indices, priorities, *, n_valid=None, eps=0.0, alpha=1.0) -> float:
        """Set ``p[indices] = (priorities + eps) ** alpha``; return the largest value set.

        ``priorities`` must be finite and >= 0 and ``indices`` in ``[0, n_valid)``
        (``n_valid`` defaults to ``capacity``); otherwise an error names the first bad entry
        and nothing changes. Repeated indices are applied in order (the last one wins).
        """

    @abstractmethod
    def find(self, us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each mass ``u`` in ``[0, total)`` the leaf whose prefix-sum interval holds it.

        Returns ``(indices, priorities)``. An entry is ``-1`` (priority 0) when rounding
        carried ``u`` past the positive leaves; zero-priority leaves are never returned.
        """

    @abstractmethod
    def get(self, indices) -> np.ndarray:
        """Leaf priorities at ``indices`` as float64 (checked against ``capacity``)."""

    @abstractmethod
    def total(self) -> float:
        """Sum of all leaf priorities (the root), O(1)."""

    @abstractmethod
    def min(self) -> float:
        """Smallest *positive* leaf priority, ``inf`` when there is none; O(1)."""

    @abstractmethod
    def rebuild(self) -> None:
        """Recompute all inner nodes from the leaves, O(N); removes accumulated drift."""

    def fill(self, start: int, count: int, priority: float) -> None:
        """Set ``count`` leaves from ``start`` on, wrapping at ``capacity``, to ``priority``
        (stored as given: no eps or alpha). The ring-buffer insert. Cost as :meth:`update`."""
        self.update((start + np.arange(count, dtype=np.int64)) % self.capacity, priority)

    def _find_into(self, us, out_index, out_priority) -> int:
        """:meth:`find` into given arrays; returns how many entries are ``-1``."""
        out_index[:], out_priority[:] = self.find(us)
        return int(np.count_nonzero(out_index < 0))

    def leaves(self) -> np.ndarray:
        """All ``capacity`` leaf priorities as float64, O(N)."""
        return self.get(np.arange(self.capacity, dtype=np.int64))

    def sample(self, n: int, rng: np.random.Generator, stratified: bool = False):
        """Draw ``n`` leaves with probability ``p_i / total``; returns ``(indices, priorities)``.

        Plain sampling draws ``u ~ U(0, total)`` independently. Stratified sampling (the PER
        paper's scheme) splits ``[0, total)`` into ``n`` equal segments and draws one ``u``
        in each, which lowers the variance of a batch. Cost: one :meth:`find` call, O(n log N).
        Raises ValueError when every priority is zero.
        """
        total = self.total()
        if not total > 0.0:
            raise ValueError("cannot sample: the total priority is 0 (nothing is sampleable)")
        if stratified:
            us = (np.arange(n) + rng.random(n)) * (total / n)
        else:
            us = rng.random(n) * total
        idx = np.empty(n, dtype=np.int64)
        prio = np.empty(n, dtype=np.float64)
        misses = self._find_into(us, idx, prio)
        for attempt in range(MAX_REDRAWS):
            if misses == 0:
                return idx, prio
            if attempt == REBUILD_AFTER:
                # Redraws keep missing: drift has left a stratum (or more) past the real mass.
                # Recomputing the inner sums from the leaves removes the drift.
                self.rebuild()
                total = self.total()
            bad = np.flatnonzero(idx < 0)
            # Redraw within the same stratum so stratification is kept.
            if stratified:
                us = (bad + rng.random(bad.size)) * (total / n)
            else:
                us = rng.random(bad.size) * total
            idx[bad], prio[bad] = self.find(us)
            misses = int(np.count_nonzero(idx < 0))
        raise RuntimeError(
            f"sampling kept landing on zero leaves after {MAX_REDRAWS} redraws; the tree's "
            f"inner sums are inconsistent (total={total!r}); call rebuild()"
        )
