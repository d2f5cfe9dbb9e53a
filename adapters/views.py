"""Read-only views of a :class:`~replaybench.adapters._core.PriorityIndex`'s tree in the shape
the frameworks expose their own segment trees, for code that reads them.

TorchRL's sampler keeps a ``_sum_tree`` and a ``_min_tree`` (C++ segment trees: indexing,
``query(l, r)``); Tianshou's prioritized buffer a ``weight`` segment tree (indexing,
``reduce(start, end)``). Users' code and the frameworks' own tests read them; these views
answer those reads from our tree, with no copy of it:

- ``view[i]`` (an int) is leaf ``i``'s priority ``p_i = (priority + eps) ** alpha``, a NumPy
  float64; ``view[idx]`` (an integer array) an array of ``idx``'s shape. O(len(idx) D).
- :meth:`SumTreeView.query` and :meth:`SumTreeView.reduce` sum a range of leaves: O(1) for
  the whole tree (its root), O(r - l) for a part (a scan of those leaves, summed in float64).
- :meth:`MinTreeView.query` the smallest of a range: O(1) for the whole tree, O(r - l) for a
  part.

Writes are refused (TypeError naming the method that writes): the tree's invariants (the
running maximum, the written-slot check) are kept by the adapter's own update methods. An
index outside ``0 .. capacity - 1`` raises IndexError naming it (the frameworks' trees read
padding or inner nodes there). Thread-safety: none, as the tree's.
"""

from __future__ import annotations

import numbers

import numpy as np

from replaybench.adapters._core import PriorityIndex

__all__ = ["SumTreeView", "MinTreeView"]


class _LeafView:
    """Leaf priorities of ``index``'s tree, read-only (see the module docstring)."""

    __slots__ = ("_index", "_writer")

    def __init__(self, index: PriorityIndex, writer: str) -> None:
        self._index = index
        self._writer = writer  # the method to name when a write is attempted

    def __len__(self) -> int:
        return self._index.capacity

    @property
    def size(self) -> int:
        """The number of leaves (TorchRL's name for ``len``)."""
        return self._index.capacity

    def __getitem__(self, index):
        if isinstance(index, numbers.Integral) and not isinstance(index, bool):
            return self._leaves(np.array([index], dtype=np.int64))[0]
        idx = np.asarray(index)
        return self._leaves(idx.reshape(-1)).reshape(idx.shape)

    def at(self, index):
        """``self[index]`` (TorchRL's name)."""
        return self[index]

    def __setitem__(self, index, value) -> None:
        raise TypeError(f"{type(self).__name__} is a read-only view of the adapter's tree: set priorities "
                        f"with {self._writer}")

    def _leaves(self, idx: np.ndarray) -> np.ndarray:
        return self._index.tree.get(idx)  # checks idx against 0 .. capacity - 1, naming the first outside

    def _range(self, start, end) -> tuple[int, int]:
        """``[start, end)`` clipped to the leaves, as TorchRL's and Tianshou's trees read it
        (``end=None`` is the last leaf, a negative ``end`` counts from it)."""
        n = self._index.capacity
        end = n if end is None else int(end)
        if end < 0:
            end += n
        return max(int(start), 0), min(end, n)


class SumTreeView(_LeafView):
    """Leaf priorities and sums over ranges of them (TorchRL's ``SumSegmentTree`` reads,
    Tianshou's ``SegmentTree`` reads)."""

    __slots__ = ()

    def query(self, l: int = 0, r: int | None = None) -> float:  # noqa: E741  (TorchRL's names)
        """Sum of leaves ``[l, r)``: the root, O(1), when it covers every leaf; else O(r - l)."""
        start, end = self._range(l, r)
        if start == 0 and end == self._index.capacity:
            return float(self._index.tree.total())
        if start >= end:
            return 0.0
        return float(self._leaves(np.arange(start, end)).sum())

    def reduce(self, start: int = 0, end: int | None = None) -> float:
        """Sum of leaves ``[start, end)`` (Tianshou's ``SegmentTree.reduce``): as :meth:`query`."""
        return self.query(start, end)


class MinTreeView(_LeafView):
    """Leaf priorities as TorchRL's ``MinSegmentTree`` holds them, and minima over ranges.

    A leaf that holds priority 0 reads ``inf``, the minimum's identity: TorchRL's min tree
    holds its identity for slots never written (there the float type's largest finite value,
    3.4e38 for float32), and ours cannot tell those from a written priority of exactly 0
    (only possible with ``eps=0``); with ``eps > 0`` every written slot is positive and the
    views agree on every written slot.
    """

    __slots__ = ()

    def _leaves(self, idx: np.ndarray) -> np.ndarray:
        p = super()._leaves(idx)
        p[p == 0] = np.inf
        return p

    def query(self, l: int = 0, r: int | None = None) -> float:  # noqa: E741  (TorchRL's names)
        """Smallest leaf of ``[l, r)`` (``inf`` when none is positive): O(1) over every leaf
        (the tree's kept minimum), else O(r - l)."""
        start, end = self._range(l, r)
        if start == 0 and end == self._index.capacity:
            return float(self._index.tree.min())
        if start >= end:
            return float("inf")
        return float(self._leaves(np.arange(start, end)).min())
