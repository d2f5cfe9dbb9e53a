"""S sum trees that together hold the priorities of one ring: the structure under the sharded
policy (:mod:`impl.concurrent.policies.sharded`).

Slots are dealt to shards in blocks of :data:`BLOCK` ring slots, round robin::

    ring slot   0 .. B-1 | B .. 2B-1 | ... | (S-1)B .. SB-1 | SB .. SB+B-1 | ...
    shard            0   |     1     | ... |      S-1       |      0       | ...

so slot ``i`` lives in shard ``(i // B) % S`` at leaf ``(i // (B S)) B + i % B`` of that
shard's tree. The ring itself (tickets, FIFO eviction, stamps) is unchanged, so consecutive
inserts of ``B`` rows go to consecutive shards, and a batch of at most ``B`` rows touches at
most two shards (exactly one when batches are ``B``-aligned, as when every insert has ``B``
rows). Every shard is a tree of the buffer's variant over ``ceil(ceil(N / B) / S) B`` leaves;
a buffer with fewer than ``S`` blocks has only as many shards as blocks.

:class:`ShardedTree` offers the tree interface the buffer and the ring use (``get``, ``leaves``,
``total``, ``min``, ``update``, ``fill``, ``sample``, ``rebuild``, ``shared_arrays`` /
``bind_arrays``), in global slot numbers. Like every tree it knows nothing of locks: the
sharded policy holds them. Costs: those of the shard trees plus O(S) for ``total`` / ``min``
and O(n) to split a batch by shard.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..trees import kernels
from ..trees.base import as_indices, as_priorities, raise_for_status

__all__ = ["BLOCK", "ShardedTree", "shard_geometry", "shard_of", "local_of", "global_of"]

#: Ring slots per block (see the module docstring): the actor batch the policy is sized for.
BLOCK = 64


def shard_geometry(capacity: int, shards: int, block: int = BLOCK) -> tuple[int, int]:
    """``(shards in use, leaves per shard)`` for a ring of ``capacity`` slots asked to have
    ``shards`` shards of ``block``-slot blocks: a ring of fewer blocks than ``shards`` uses one
    shard per block."""
    blocks = -(-capacity // block)
    used = max(1, min(shards, blocks))
    return used, -(-blocks // used) * block


@njit(nogil=True, cache=True, inline="always")
def shard_of(i, S, B):
    """The shard of ring slot ``i``."""
    return (i // B) % S


@njit(nogil=True, cache=True, inline="always")
def local_of(i, S, B):
    """The leaf of ring slot ``i`` in its shard's tree."""
    return (i // (B * S)) * B + i % B


@njit(nogil=True, cache=True, inline="always")
def global_of(s, j, S, B):
    """The ring slot of leaf ``j`` of shard ``s`` (the inverse of :func:`shard_of`, :func:`local_of`)."""
    return ((j // B) * S + s) * B + j % B


class ShardedTree:
    """``len(trees)`` trees of one variant (equal capacity and layout) holding the priorities of
    ``capacity`` ring slots, block-interleaved (module docstring).

    ``kernel_args`` is the trees' kernel arguments with ``sums``, ``mins`` and ``state`` stacked
    (row ``s`` is shard ``s``'s array, a contiguous view the single-tree kernels take).
    Thread-safety: none; each shard's tree changes under its shard's lock (the policy's).
    """

    supports_split_updates = False

    def __init__(self, trees: list, capacity: int, block: int = BLOCK):
        first = trees[0]
        if any(type(t) is not type(first) or t.capacity != first.capacity for t in trees):
            raise ValueError("the shards of a ShardedTree must be trees of one type and capacity")
        self.trees = list(trees)
        self.shards, self.block, self.capacity = len(trees), int(block), int(capacity)
        self.shard_capacity = first.capacity
        if self.shards * self.shard_capacity < self.capacity:
            raise ValueError(f"{self.shards} shards of {self.shard_capacity} leaves cannot hold {capacity} slots")
        self.kind, self.K, self.dtype, self.depth = first.kind, first.K, first.dtype, first.depth
        # The whole ring's bound, as one tree of `capacity` leaves has it: the same values are refused.
        self._vmax = float(np.finfo(self.dtype).max) / (2.0 * capacity)
        state = first.kernel_args[7]
        self._state = np.stack([state.copy() for _ in trees])  # the stacked kernels' re-summing state
        self.bind_arrays(self.shared_arrays())

    @classmethod
    def build(cls, make_tree, capacity: int, shards: int, block: int = BLOCK) -> "ShardedTree":
        """``shards`` trees from ``make_tree(n_leaves)`` for a ring of ``capacity`` slots (fewer
        when the ring has fewer blocks: :func:`shard_geometry`)."""
        used, leaves = shard_geometry(capacity, shards, block)
        return cls([make_tree(leaves) for _ in range(used)], capacity, block)

    # ------------------------------------------------------------------ shared state
    def shared_arrays(self) -> dict[str, np.ndarray]:
        """``sums`` and ``mins`` of every shard, stacked: shape ``(shards, tree size)``."""
        return {"sums": np.stack([t.sums for t in self.trees]), "mins": np.stack([t.mins for t in self.trees])}

    def bind_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Use the stacked ``arrays`` (as :meth:`shared_arrays`): shard ``s`` binds row ``s``."""
        for s, tree in enumerate(self.trees):
            tree.bind_arrays({"sums": arrays["sums"][s], "mins": arrays["mins"][s]})
        self._sums, self._mins = arrays["sums"], arrays["mins"]
        k = self.trees[0].kernel_args
        self.kernel_args = (k[0], self._sums, self._mins, k[3], k[4], k[5], k[6], self._state)

    @property
    def resum_every(self) -> int:
        return int(self._state[0, 2])

    @resum_every.setter
    def resum_every(self, value: int) -> None:
        self._state[:, 2] = float(value)
        for tree in self.trees:
            tree.resum_every = value

    @property
    def max_leaf(self) -> float:
        """The largest leaf value stored (as one tree of ``capacity`` leaves: the same bound)."""
        return self._vmax

    # ------------------------------------------------------------------ slot mapping
    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, leaf)`` of each ring slot in ``indices``."""
        S, B = self.shards, self.block
        return (indices // B) % S, (indices // (B * S)) * B + indices % B

    def slots_of(self, shard: int, leaves: np.ndarray) -> np.ndarray:
        """The ring slots of ``leaves`` of ``shard``."""
        S, B = self.shards, self.block
        return ((leaves // B) * S + shard) * B + leaves % B

    # ------------------------------------------------------------------ the tree interface
    def get(self, indices) -> np.ndarray:
        idx = as_indices(indices)
        bad = np.flatnonzero((idx < 0) | (idx >= self.capacity))
        if bad.size:
            raise_for_status(kernels.STATUS_INDEX, int(bad[0]), idx, None, self.capacity, "indices")
        out = np.empty(idx.shape[0], dtype=np.float64)
        shard, leaf = self.locate(idx)
        for s in np.unique(shard):
            at = shard == s
            out[at] = self.trees[s].get(leaf[at])
        return out

    def leaves(self) -> np.ndarray:
        """All ``capacity`` leaf priorities in ring order, float64. O(N)."""
        return self.get(np.arange(self.capacity, dtype=np.int64))

    def shard_totals(self) -> np.ndarray:
        """Each shard's root total (float64)."""
        return np.array([t.total() for t in self.trees])

    def total(self) -> float:
        return float(self.shard_totals().sum())

    def min(self) -> float:
        return float(min(t.min() for t in self.trees))

    def rebuild(self) -> None:
        for tree in self.trees:
            tree.rebuild()

    def update(self, indices, priorities, *, n_valid=None, eps=0.0, alpha=1.0) -> float:
        """Checked ``p[indices] = (priorities + eps) ** alpha`` (the whole batch is checked
        before any shard is written); returns the largest value set."""
        idx = as_indices(indices)
        vals = as_priorities(priorities, idx.shape[0])
        limit = self.capacity if n_valid is None else min(int(n_valid), self.capacity)
        status, pos, _, _ = kernels.checked_values(idx, vals, limit, float(eps), float(alpha), self._vmax)
        raise_for_status(status, pos, idx, vals, limit, "priorities", eps=eps, alpha=alpha, vmax=self._vmax)
        shard, leaf = self.locate(idx)
        pmax = 0.0
        for s in np.unique(shard):
            at = shard == s
            pmax = max(pmax, self.trees[s].update(leaf[at], vals[at], eps=eps, alpha=alpha))
        return pmax

    def fill(self, start: int, count: int, priority: float) -> None:
        """Ring slots ``start ..`` (``count`` of them, wrapping) set to ``priority``."""
        if not (math.isfinite(priority) and priority >= 0):
            raise ValueError(f"priority = {priority!r} must be finite and >= 0")
        if not 0 <= start < self.capacity or not 0 <= count <= self.capacity:
            raise IndexError(f"fill(start={start}, count={count}) is outside capacity {self.capacity}")
        slots = (start + np.arange(count, dtype=np.int64)) % self.capacity
        shard, leaf = self.locate(slots)
        for s in np.unique(shard):
            at = shard == s
            self.trees[s].update(leaf[at], np.full(int(at.sum()), float(priority)))

    def sample(self, n: int, rng: np.random.Generator, stratified: bool = False):
        """Exact draw of ``n`` slots, ``P(i) = p_i / total``: each position's mass picks the shard
        whose share of the total holds it, then descends that shard. Zero leaves reached by
        float drift are drawn again (up to 64 rounds, after 8 of them from rebuilt shards).
        Raises ValueError when every priority is 0."""
        totals = self.shard_totals()
        total = float(totals.sum())
        if not total > 0.0:
            raise ValueError("cannot sample: the total priority is 0 (nothing is sampleable)")
        us = (np.arange(n) + rng.random(n)) * (total / n) if stratified else rng.random(n) * total
        idx, prio = self._find(us, totals)
        for attempt in range(64):
            bad = np.flatnonzero(prio <= 0.0)
            if bad.size == 0:
                return idx, prio
            if attempt == 8:
                self.rebuild()
                totals = self.shard_totals()
            idx[bad], prio[bad] = self._find(rng.random(bad.size) * float(totals.sum()), totals)
        raise ValueError(f"cannot sample: {bad.size} draws kept reaching zero leaves")

    def _find(self, us: np.ndarray, totals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cum = np.cumsum(totals)
        has = totals > 0.0
        shard = np.minimum(np.searchsorted(cum, us, side="right"), self.shards - 1)
        # a mass that rounding put past a shard's range, or into an empty one: the last shard
        # with mass at or before it
        last = np.maximum.accumulate(np.where(has, np.arange(self.shards), -1))
        shard = np.where(has[shard], shard, last[shard])
        shard = np.where(shard < 0, int(np.flatnonzero(has)[0]), shard)
        local = us - (cum[shard] - totals[shard])
        idx = np.empty(us.shape[0], dtype=np.int64)
        prio = np.empty(us.shape[0])
        for s in np.unique(shard):
            at = shard == s
            j, p = self.trees[s].find(np.clip(local[at], 0.0, np.nextafter(totals[s], 0.0)))
            idx[at], prio[at] = self.slots_of(int(s), j), p
        return idx, prio
