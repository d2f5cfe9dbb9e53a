"""pal-locks: PAL's tree protection, a global (tree) lock plus a last-level (leaf) lock."""

from __future__ import annotations

import numpy as np

from ..fused import APPLY_SPLIT, DRAW_LOCKED, LOCKED
from ..policy import Policy, register

__all__ = ["PalLocks"]


@register
class PalLocks(Policy):
    """PAL's tree protection: a global (tree) lock plus a last-level (leaf) lock.

    Tree changes hold the tree lock; their leaf writes also hold the leaf lock, which is
    released before the deltas climb the inner levels. Priority reads (:meth:`read_priorities`)
    take only the leaf lock, so they proceed while inner levels are being updated and observe
    leaves that may be newer than the inner sums (each leaf value is one aligned word: never
    torn). Samples descend under the tree lock (held shared in the fused kernel: draws overlap
    one another, never a tree change), so they see a consistent tree, and copy their rows
    outside it (stamp-checked). Inserts copy data under the tree lock, as PAL does
    without lazy writing.

    All three operations run as fused kernels (:mod:`impl.concurrent.fused`: DRAW_LOCKED,
    LOCKED with APPLY_SPLIT, the update with APPLY_SPLIT), taking the same words in the same
    order (tree, then leaf); the methods below are the slow path for a lock held past a
    kernel's spins, which sleeps, times out and recovers dead holders.
    """

    name = "pal-locks"
    fused_sample = DRAW_LOCKED
    fused_insert = LOCKED  # the data copy under the tree lock, as PAL without lazy writing
    fused_update = True
    fused_apply = APPLY_SPLIT  # the kernels' form of apply() below: leaf lock, then the inner levels
    requires_split_updates = True

    def apply(self, idx, vals, eps, alpha, n_valid=None) -> float:
        with self.leaf_lock:
            idx, deltas, pmax = self.tree.write_leaves(idx, vals, n_valid=n_valid, eps=eps, alpha=alpha)
        self.tree.propagate(idx, deltas)
        self.ring.count(idx.size)
        return pmax

    def read_priorities(self, idx) -> np.ndarray:
        with self.leaf_lock:
            return self.tree.get(idx)
